"""Benchmark: our launch (A: srun.sh --local) against the upstream launch (B: torchrun + bench/upstream_pretrain.py)
on the same recipe and overrides, and the VizTracer plugin's cost outside and right after its window.

    python3 bench/bench_launch.py PREFIX [--case NAME ...] [--timeout S]   # prints a table; writes PREFIX.json/.md

Cases already in PREFIX.json (an earlier device call) are kept, and replaced by a case of the same name, so the
benchmark can be run a few cases per device call.

Throughput is Megatron's own log: "throughput per GPU (TFLOP/s/GPU)" and "elapsed time per iteration (ms)", as the
median over the steps after megatron_log.WARMUP_STEPS; tokens/s/GPU = global batch * sequence / step time / GPUs.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.megatron_log, as the GPU suite imports it

from bench import kernel_breakdown, megatron_log, report

REPO = Path(__file__).resolve().parents[1]
GPUS = 2
LLAMA = "recipes/llama3_8b_pretrain.py"
LLAMA_H200_FP8 = "recipes/llama3_8b_h200_fp8cs_pretrain.py"  # sets its micro-batch and precision itself
LLAMA_GLOBAL_BATCH = 16
LLAMA_SEQUENCE = 8192  # the recipe's
# APEX is not installed; without it Megatron refuses to build the output layer with the fusion on.
NO_FUSION = "model.gradient_accumulation_fusion=false"
LLAMA_ARGS = (
    f"train.global_batch_size={LLAMA_GLOBAL_BATCH}",
    "logger.log_interval=1",
    "logger.log_throughput=true",
    "validation.eval_interval=1000",
    "train.train_iters=7",
    NO_FUSION,
)
PRECISIONS = {"bf16": "bf16_mixed", "fp8cs": "bf16_with_fp8_current_scaling_mixed"}
TINY = "recipes/tiny_gpt_pretrain.py"
TINY_ARGS = ("train.train_iters=40", NO_FUSION)
WINDOW_START, WINDOW_END = 10, 15  # traces steps 11..15; step 16 pays for stopping the trace
AFTER_WINDOW = WINDOW_END + 1
WINDOW = (
    f"profiling.profile_step_start={WINDOW_START}",
    f"profiling.profile_step_end={WINDOW_END}",
    "profiling.profile_ranks=[0]",
)


def ours(recipe: str, *args: str, env: tuple[str, ...] = ()) -> list[str]:
    return [*(("env", *env) if env else ()), str(REPO / "srun.sh"), "--local", recipe, *args]


def upstream(recipe: str, *args: str, gpus: int = GPUS, port: int = 29500, plugin: bool = False) -> list[str]:
    """B; with plugin=True, B plus our VizTracer plugin and nothing else of ours."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={gpus}",
        f"--master_port={port}",
        "bench/upstream_pretrain.py",
        *(("--viztracer-plugin",) if plugin else ()),
        recipe,
        *args,
    ]


MICRO_BATCH_SIZES = (1, 2)


@dataclass(frozen=True)
class Tuning:
    """A change to our launch (A), measured against the A case of the same precision and micro-batch size."""

    env: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    precisions: tuple[str, ...] = tuple(PRECISIONS)


TUNING = {
    # FSDP's collectives on high-priority streams. Within step noise (bench/results): srun.sh does not set it.
    "nccl_high_priority": Tuning(env=("TORCH_NCCL_HIGH_PRIORITY=1",)),
    # cuDNN's RMSNorm kernels instead of TE's. Within step noise: not set.
    "cudnn_norms": Tuning(env=("NVTE_NORM_FWD_USE_CUDNN=1", "NVTE_NORM_BWD_USE_CUDNN=1")),
    # The FP8 current-scaling preset keeps the first and last transformer layers in BF16 for numerical headroom;
    # Megatron Bridge's performance scripts run every layer in FP8. 1.021x: recipes/llama3_8b_h200_fp8cs_pretrain.py.
    "fp8_all_layers": Tuning(overrides=("mixed_precision.first_last_layers_bf16=false",), precisions=("fp8cs",)),
    # Megatron's NaN checks of the loss (each micro-batch) and of the gradients (each step), which upstream's
    # performance scripts turn off. 1.001x, within step noise: the recipes keep them.
    "no_nan_checks": Tuning(
        overrides=("ddp.check_for_nan_in_grad=false", "rerun_state_machine.check_for_nan_in_loss=false")
    ),
    # NCCL user-buffer registration for Megatron FSDP's all-gathers and reduce-scatters, whose kernels then occupy
    # fewer SMs. 1.009x on the FP8 recipe; not shipped (untried with EFA across nodes).
    "nccl_ub": Tuning(overrides=("ddp.nccl_ub=true",)),
    # Transformer Engine's operation fuser: the MLP as one sequence of TE operations, neighbouring ones fused.
    # 1.030-1.038x in FP8: recipes/llama3_8b_h200_fp8cs_pretrain.py sets it. 1.000x in BF16: not set there.
    "te_op_fuser": Tuning(overrides=("model.use_transformer_engine_op_fuser=true",)),
    # Attention in FP8 (cuDNN): about 1.02x, but every attention layer's numerics change; not shipped.
    "fp8_attention": Tuning(overrides=("model.fp8_dot_product_attention=true",), precisions=("fp8cs",)),
    # cuDNN's attention backward with dP in a workspace instead of accumulating dQ with atomics. cuDNN takes that
    # path only below a workspace limit (256 MB by default); sequence 8192 at micro-batch 2 needs 8.6 GB. 0.998x with
    # peak memory unchanged, so cuDNN 9 did not take that path: not set.
    "attn_dp_workspace": Tuning(env=("CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT=17179869184",)),
    # NCCL's Simple protocol only: the profile shows FSDP's collectives in the LL protocol, whose kernels poll flags
    # on their SMs while compute kernels want them. 0.998x: not set.
    "nccl_simple": Tuning(env=("NCCL_PROTO=Simple",)),
    # At most 8 SMs (CTAs) per NCCL collective instead of up to 32: more SMs left to compute; on NVLink between two
    # GPUs 8 still move FSDP's all-gathers and reduce-scatters under the compute they overlap. 0.993x: not set.
    "nccl_8_ctas": Tuning(env=("NCCL_MAX_CTAS=8",)),
}
# One step of rank 0 under the PyTorch profiler; bench/kernel_breakdown.py says where its GPU time went.
KERNEL_PROFILE = (
    "profiling.use_pytorch_profiler=true",
    "profiling.profile_step_start=4",
    "profiling.profile_step_end=5",
    "profiling.profile_ranks=[0]",
)
RECIPE_CASE = "llama3_8b_h200_fp8cs_recipe"
RECIPE_SETS = ("fp8_all_layers", "te_op_fuser")  # tuning the FP8 recipe already has
RUN_DIR = re.compile(r"entrypoint\.py: outputs in (.+)$", re.MULTILINE)


def cases() -> dict[str, list[str]]:
    table = {}
    for name, precision in PRECISIONS.items():
        for mbs in MICRO_BATCH_SIZES:
            args = (*LLAMA_ARGS, f"train.micro_batch_size={mbs}", f"mixed_precision={precision}")
            case = f"llama3_8b_fsdp_{name}_mbs{mbs}"
            table[f"{case}_A_ours"] = ours(LLAMA, *args)
            table[f"{case}_B_upstream"] = upstream(LLAMA, *args)
            for variant, tuning in TUNING.items():
                if name in tuning.precisions:
                    table[f"{case}_A_ours+{variant}"] = ours(LLAMA, *args, *tuning.overrides, env=tuning.env)
            table[f"{case}_A_ours+kernel_profile"] = ours(LLAMA, *args, *KERNEL_PROFILE)
    table[f"{RECIPE_CASE}_A_ours"] = ours(LLAMA_H200_FP8, *LLAMA_ARGS)
    table[f"{RECIPE_CASE}_B_upstream"] = upstream(LLAMA_H200_FP8, *LLAMA_ARGS)
    table[f"{RECIPE_CASE}_A_ours+kernel_profile"] = ours(LLAMA_H200_FP8, *LLAMA_ARGS, *KERNEL_PROFILE)
    recipe_tuning = [variant for variant, tuning in TUNING.items() if "fp8cs" in tuning.precisions]
    for chosen in (*combinations(recipe_tuning, 1), *combinations(recipe_tuning, 2)):
        if not set(chosen) & set(RECIPE_SETS):
            tunings = [TUNING[variant] for variant in chosen]
            args = (*LLAMA_ARGS, *(o for t in tunings for o in t.overrides))
            env = tuple(e for t in tunings for e in t.env)
            table[f"{RECIPE_CASE}_A_ours+{'+'.join(chosen)}"] = ours(LLAMA_H200_FP8, *args, env=env)
    table["tiny_viztracer_not_installed"] = upstream(TINY, *TINY_ARGS)
    table["tiny_viztracer_installed_window_10_15"] = ours(TINY, *TINY_ARGS, "profiling.use_viztracer=true", *WINDOW)
    return table


def stop(case: subprocess.Popen) -> None:
    """SIGTERM first: srun.sh starts each rank in its own session and stops them on TERM; SIGKILL would orphan them
    on the GPUs (and on the rendezvous port) for the next case."""
    os.killpg(case.pid, signal.SIGTERM)
    try:
        case.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(case.pid, signal.SIGKILL)
        case.wait()


def start_case(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start one case in its own process group, so that a case past its time can be stopped with all its ranks."""
    with log.open("w") as out:
        return subprocess.Popen(
            command,
            cwd=REPO,
            env={**os.environ, "GPUS_PER_NODE": str(GPUS), **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish_case(case: subprocess.Popen, log: Path, started: float, timeout_s: int) -> dict:
    """Wait for a case started at `started` (time.monotonic()) until timeout_s after that, then read its log."""
    try:
        returncode: int | str = case.wait(timeout=max(0.0, started + timeout_s - time.monotonic()))
    except subprocess.TimeoutExpired:
        stop(case)
        returncode = f"timeout {timeout_s} s"
    training = megatron_log.parse(log.read_text())
    return {
        "date": report.timestamp(),
        "returncode": returncode,
        "wall_s": round(time.monotonic() - started, 1),
        "step_ms": training.step_ms,
        "logged_at": training.logged_at,
        "median_step_ms": training.median_step_ms(),
        "peak_mem_gb": training.peak_mem_gb,
        "median_tflops_per_gpu": training.median_tflops_per_gpu(),
    }


def run_case(command: list[str], log: Path, timeout_s: int) -> dict:
    started = time.monotonic()
    return finish_case(start_case(command, log), log, started, timeout_s)


def add_derived(name: str, row: dict) -> None:
    if name.startswith("llama3_8b") and row["median_step_ms"]:
        tokens_per_step = LLAMA_GLOBAL_BATCH * LLAMA_SEQUENCE
        row["tokens_per_s_per_gpu"] = round(tokens_per_step / (row["median_step_ms"] / 1000) / GPUS)
    if name.startswith("tiny_viztracer_installed") and row["step_ms"]:
        row["median_step_ms_outside_window"] = statistics.median(outside_window(row["step_ms"]))
        row["step_16_ms"] = row["step_ms"].get(AFTER_WINDOW)


def outside_window(step_ms: dict[int, float]) -> list[float]:
    """Step times after warm-up, without the traced steps and the step that pays for writing the trace."""
    return [
        ms
        for step, ms in step_ms.items()
        if step > megatron_log.WARMUP_STEPS and not WINDOW_START < step <= AFTER_WINDOW
    ]


def profiled_kernels(log: Path) -> dict | None:
    """Where the GPU time went in the step a +kernel_profile case traced: rank 0's trace, in the run directory that
    entrypoint.py logged (Megatron Bridge writes it beside tb_logs/)."""
    run_dir = RUN_DIR.search(log.read_text())
    trace = Path(run_dir.group(1)) / "torch_profile" / "rank-0.json.gz" if run_dir else None
    if trace is None or not trace.exists():
        return None
    return kernel_breakdown.breakdown(kernel_breakdown.load_kernels(trace))


def markdown(result: dict) -> str:
    columns = (
        "case",
        "returncode",
        "median_step_ms",
        "median_tflops_per_gpu",
        "tokens_per_s_per_gpu",
        "peak_mem_gb",
        "wall_s",
    )
    lines = [
        f"# Launch benchmark, {result['date']}",
        "",
        result["hardware"],
        "",
        ", ".join(f"{package} {version}" for package, version in result["versions"].items()),
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for name, row in result["cases"].items():
        lines.append("| " + " | ".join(str(row.get(c, name if c == "case" else "")) for c in columns) + " |")
    lines += ["", "Ratios:", ""] + [f"- {k}: {v}" for k, v in result["ratios"].items()]
    for name, row in result["cases"].items():
        if row.get("kernels"):
            lines += ["", f"GPU time of one step, `{name}` (rank 0):", "", kernel_breakdown.markdown(row["kernels"])]
    lines += ["", "Commands:", ""] + [f"- `{name}`: `{' '.join(cmd)}`" for name, cmd in result["commands"].items()]
    return "\n".join(lines) + "\n"


def faster(before: dict | None, after: dict | None) -> float | None:
    """Throughput of `after` over `before` (same tokens per step), if both ran."""
    if before and after and before["median_step_ms"] and after["median_step_ms"]:
        return round(before["median_step_ms"] / after["median_step_ms"], 3)
    return None


def ratios(rows: dict) -> dict:
    out = {}
    for name in PRECISIONS:
        for mbs in MICRO_BATCH_SIZES:
            case = f"llama3_8b_fsdp_{name}_mbs{mbs}"
            a, b = rows.get(f"{case}_A_ours"), rows.get(f"{case}_B_upstream")
            measured = {"A/B": faster(b, a)}
            for variant in TUNING:
                measured[f"A+{variant} / A"] = faster(a, rows.get(f"{case}_A_ours+{variant}"))
            out |= {f"{name} mbs{mbs} {what} throughput": r for what, r in measured.items() if r is not None}
        mbs1, mbs2 = rows.get(f"llama3_8b_fsdp_{name}_mbs1_A_ours"), rows.get(f"llama3_8b_fsdp_{name}_mbs2_A_ours")
        if (ratio := faster(mbs1, mbs2)) is not None:
            out[f"{name} A mbs2 / mbs1 throughput"] = ratio
    recipe_a = rows.get(f"{RECIPE_CASE}_A_ours")
    if (ratio := faster(rows.get(f"{RECIPE_CASE}_B_upstream"), recipe_a)) is not None:
        out[f"{RECIPE_CASE} A/B throughput"] = ratio
    for name, row in rows.items():
        tuned = name.removeprefix(f"{RECIPE_CASE}_A_ours+")
        if tuned not in (name, "kernel_profile") and (ratio := faster(recipe_a, row)) is not None:
            out[f"{RECIPE_CASE} A+{tuned} / A throughput"] = ratio
    base, traced = rows.get("tiny_viztracer_not_installed"), rows.get("tiny_viztracer_installed_window_10_15")
    if base and traced and base["median_step_ms"] and traced.get("median_step_ms_outside_window"):
        out["viztracer installed / not, outside window"] = round(
            traced["median_step_ms_outside_window"] / base["median_step_ms"], 3
        )
        if traced.get("step_16_ms"):
            out["step after window / normal step"] = round(
                traced["step_16_ms"] / traced["median_step_ms_outside_window"], 2
            )
    return out


def hardware() -> str:
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    return subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip().replace("\n", "; ")


def versions() -> dict[str, str]:
    return {p: metadata.version(p) for p in ("torch", "megatron-core", "megatron-bridge", "transformer-engine")}


def fix_dataset_helpers() -> None:
    """Like run_gpu_suite.sh: a pip-installed megatron-core needs this once, or rank 0 exits at start-up."""
    fix = ["bash", str(REPO / "tools" / "fix_dataset_helpers.sh")]
    subprocess.run(fix, env={**os.environ, "PYTHON": sys.executable}, check=True)


def write(prefix: Path, rows: dict, commands: dict) -> str:
    """Write PREFIX.json and PREFIX.md; called after every case, so a device call cut short keeps what it measured.
    Returns the Markdown."""
    result = {
        "date": report.timestamp(),
        "hardware": f"{GPUS} x {hardware()}",
        "versions": versions(),
        "cases": rows,
        "ratios": ratios(rows),
        "commands": {name: commands[name] for name in rows},
    }
    return report.write(prefix, result, markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("prefix", type=Path)
    parser.add_argument("--case", action="append", choices=sorted(cases()), help="run only these (default: all)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds one case may run (default: 300)")
    args = parser.parse_args()
    table = cases()
    selected = {name: table[name] for name in (args.case or table)}
    fix_dataset_helpers()
    results = report.json_path(args.prefix)
    earlier = json.loads(results.read_text()) if results.exists() else {}
    rows, commands = earlier.get("cases", {}), {**earlier.get("commands", {}), **selected}
    for name, command in selected.items():
        log = args.prefix.parent / f"{name}.log"
        rows[name] = run_case(command, log, args.timeout)
        if name.endswith("+kernel_profile"):
            rows[name]["kernels"] = profiled_kernels(log)
        add_derived(name, rows[name])
        print(name, {k: v for k, v in rows[name].items() if k != "step_ms"}, flush=True)
        written = write(args.prefix, rows, commands)
    print(written)


if __name__ == "__main__":
    main()
