"""The launching host's side of what a launch saves (docs/failures.md, "In the code"). Standard library only."""

from __future__ import annotations

from launcher.assignments import section, split
from launcher.host.plan import LaunchPlan

# Llama 3's pretraining: 466 interruptions in 54 days on 2,048 nodes of 8 GPUs, one per 5,696 node-hours.
ONE_NODE_MTBF_S = 54 * 24 * 3600 * 2048 / 466


def mtbf_s(knob: str, nodes: int) -> str:
    """SRUNSH_MTBF_S, or the expected seconds between faults of a job of NODES nodes."""
    return knob or f"{ONE_NODE_MTBF_S / max(nodes, 1):.0f}"


def line(plan: LaunchPlan) -> str:
    """The header's and the dry run's line on what the launch saves ("" where the recipe decides: rank 0 says it)."""
    given = section(split(plan.overrides), "checkpoint")
    if plan.keep_work:
        local = f" on each node's {plan.local_ckpt_dir}" if plan.local_ckpt_dir else ""
        faults = f"a fault every {plan.mtbf_s} s" if plan.mtbf_s else "Llama 3's fault rate over the job's nodes"
        return (
            "saves persistent checkpoints at the recipe's interval, else as often as a save's measured cost is worth"
            f" against {faults} (SRUNSH_MTBF_S); checkpoint.non_persistent_ckpt_type=local adds local ones{local},"
            " and checkpoint.async_save=true writes them in the background"
        )
    if given.get("save_interval") in ("0", "null", "None"):
        return "saves no checkpoint (checkpoint.save_interval=0 on the command line): a failure loses every step"
    if given.get("non_persistent_ckpt_type") == "local" or given.get("non_persistent_save_interval", "0") != "0":
        return (
            "local checkpoints are read back by in-process restart, a requeued batch job, or a launch of the same"
            " SRUNSH_RUN_ID on the same nodes: add inprocess_restart.enabled=true, or submit it with --sbatch"
        )
    return ""
