"""Training really starts through the launcher: `srun.sh --local` on 2 GPUs (1 where only one is lent), one python per
GPU (issue 4)."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests import hf_models
from tests.gpu import megatron_log
from tests.gpu.conftest import GPUS, REPO, Run, needs_two_gpus, parse_log, run_with_time_limit, tail

pytestmark = pytest.mark.gpu

TINY = "tiny_gpt_pretrain.py"
DSV2_LITE = "deepseek_v2_lite_pretrain.py"
# The shipped recipe is TP8 for 8-GPU nodes; on 2 GPUs the same model runs TP1 with EP2 over both ranks.
DSV2_ON_TWO_GPUS = (
    "model.tensor_model_parallel_size=1",
    "model.sequence_parallel=false",
    "model.expert_model_parallel_size=2",
    "moe_token_dispatcher_type=alltoall",
    "model.seq_length=1024",
    "dataset.seq_length=1024",
    "train.global_batch_size=8",
    "logger.log_interval=1",
)
WINDOW = ("profiling.profile_step_start=10", "profiling.profile_step_end=15")
TRACE_STEP = re.compile(r"^train_step \(.*megatron/bridge/training/train\.py:\d+\)$")


# Megatron's deterministic mode and what it needs of the stack (cuBLAS's fixed workspace, no non-deterministic TE
# kernel, NCCL's ring): without it two runs of the same launch differ from step 3 in the 5th digit.
DETERMINISTIC = ("model.deterministic_mode=true", "model.cross_entropy_loss_fusion=false")
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "NCCL_ALGO": "Ring"}


@pytest.fixture(scope="module")
def tiny_run(launch) -> Run:
    """One tiny run serves two tests: its loss curve, and the overrides it was given."""
    return launch(TINY, "train.train_iters=30", "model.num_layers=3", f"profiling.profile_ranks=[{GPUS - 1}]")


def test_tiny_recipe_trains_on_every_gpu_with_falling_loss(tiny_run: Run, record):
    run = tiny_run
    record(run, gpus=GPUS)
    assert run.returncode == 0, tail(run)
    losses = [run.losses[i] for i in sorted(run.losses)]
    assert len(losses) == 30
    assert all(math.isfinite(loss) for loss in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0, losses


@needs_two_gpus
def test_deepseek_v2_lite_shape_from_local_config_trains_with_ep2_alltoall(launch, record, tmp_path: Path):
    hf_path = hf_models.write("deepseek_v2", tmp_path / "deepseek_v2_config_only")
    run = launch(DSV2_LITE, f"hf_path={hf_path}", *DSV2_ON_TWO_GPUS, "train.train_iters=10")
    record(run, hf_path="config.json only (4 layers, hidden 512, MLA, 16 routed + 2 shared experts, top-4)")
    assert run.returncode == 0, tail(run)
    assert len(run.losses) == 10
    assert all(math.isfinite(loss) for loss in run.losses.values())
    assert "moe_token_dispatcher_type = 'alltoall'" in run.log


def test_tiny_recipe_trains_as_the_upstream_launch_does(launch, record, tmp_path: Path):
    """Nothing srun.sh or entrypoint.py does changes the training: in Megatron's deterministic mode, the tiny recipe's
    20 losses as Megatron prints them are those of the upstream launch (torchrun running bench/upstream_pretrain.py:
    Megatron Bridge's own overrides and pretrain). Without APEX the upstream launch needs the fusion off, which
    entrypoint.py turns off by itself: both get it."""
    overrides = (
        *DETERMINISTIC,
        "train.train_iters=20",
        "logger.log_interval=1",
        "model.gradient_accumulation_fusion=false",
    )
    ours = launch(TINY, *overrides, env=DETERMINISTIC_ENV)
    record(ours, launch="srun.sh --local")
    upstream_command = [
        *(sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={GPUS}"),
        *(str(REPO / "bench" / "upstream_pretrain.py"), str(REPO / "recipes" / TINY), *overrides),
    ]
    finished = run_with_time_limit(
        upstream_command, cwd=tmp_path, env={**os.environ, **DETERMINISTIC_ENV}, timeout_s=420
    )
    upstream = parse_log(Run(finished.returncode, "".join(finished.lines), finished.wall_s, None, None))
    record(upstream, launch="torchrun bench/upstream_pretrain.py")
    assert ours.returncode == 0, tail(ours)
    assert upstream.returncode == 0, tail(upstream)
    assert sorted(ours.losses) == list(range(1, 21))
    assert ours.losses == upstream.losses


def first_loss_check(launch, record, shape: str, recipe: str, hf_path: Path, *overrides: str) -> None:
    """The constant-prediction checkpoint has the same loss on every token, so HF's loss on any tokens is the loss
    Megatron must report at iteration 1 if, and only if, it loaded the weights (random init gives about log V)."""
    tokens = torch.arange(1, 1025).unsqueeze(0)  # the mock data's pattern: 1, 2, 3, ... then end-of-document
    expected = hf_models.hf_loss(hf_path, tokens)
    run = launch(recipe, f"hf_path={hf_path}", *overrides, "train.train_iters=2")
    tolerance = 0.02
    unmapped = [line for line in run.log.splitlines() if "No mapping found" in line or "Can't find" in line]
    record(
        run,
        shape=shape,
        hf_first_loss=expected,
        tolerance=tolerance,
        random_init_loss_about=math.log(32000),
        unmapped_parameter_lines=len(unmapped),
    )
    assert run.returncode == 0, tail(run)
    assert not unmapped, unmapped[:5]
    assert abs(run.losses[1] - expected) < tolerance, (run.losses[1], expected)
    assert abs(run.losses[1] - math.log(32000)) > 10 * tolerance


def test_llama_weights_in_hf_path_give_the_hf_models_own_first_loss(launch, record, tmp_path: Path):
    hf_path = hf_models.write("llama", tmp_path / "llama_weights", weights="constant")
    small = ("model.seq_length=1024", "dataset.seq_length=1024", "train.global_batch_size=8", "logger.log_interval=1")
    first_loss_check(launch, record, "llama", "llama3_8b_pretrain.py", hf_path, "use_megatron_fsdp=false", *small)


@needs_two_gpus
def test_deepseek_v2_weights_in_hf_path_give_the_hf_models_own_first_loss(launch, record, tmp_path: Path):
    hf_path = hf_models.write("deepseek_v2", tmp_path / "deepseek_v2_weights", weights="constant")
    first_loss_check(launch, record, "deepseek_v2", DSV2_LITE, hf_path, *DSV2_ON_TWO_GPUS)


def test_overrides_reach_the_saved_config_and_the_log(tiny_run: Run):
    run = tiny_run
    assert run.returncode == 0, tail(run)
    config = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert config["train"]["train_iters"] == 30
    assert config["model"]["num_layers"] == 3
    assert config["profiling"]["profile_ranks"] == [GPUS - 1]
    assert "entrypoint.py: model.num_layers = 3" in run.log
    assert f"entrypoint.py: profiling.profile_ranks = [{GPUS - 1}]" in run.log
    assert "entrypoint.py: train.train_iters = 30" in run.log
    assert sorted(run.losses) == list(range(1, 31))
    launch_record = json.loads((run.run_dir / "launch.json").read_text())
    assert launch_record["environment"]["WORLD_SIZE"] == str(GPUS)


def test_viztracer_traces_exactly_the_window_on_rank_0_and_every_rank_exits_0(launch, record):
    run = launch(TINY, "train.train_iters=25", "profiling.use_viztracer=true", *WINDOW, "profiling.profile_ranks=[0]")
    traces = sorted((run.run_dir / "viztracer").glob("*.json"))
    events = json.loads(traces[0].read_text())["traceEvents"] if traces else []
    steps = [e for e in events if e.get("ph") == "X" and TRACE_STEP.match(e["name"])]
    after_window = run.step_ms.get(16)
    record(
        run,
        traces=[t.name for t in traces],
        trace_mb=round(traces[0].stat().st_size / 1e6, 1) if traces else None,
        traced_train_steps=len(steps),
        step_16_ms=after_window,
    )
    assert run.returncode == 0, tail(run)
    assert "0: [profiling] rank 0: viztracer window opens before step 11" in run.log
    assert "1: [profiling]" not in run.log
    assert [t.name for t in traces] == ["trace_rank0.json"]
    assert len(steps) == 5  # profile_step_start=10..end=15: steps 11 to 15
    combined = run.run_dir / "combined.json"
    subprocess.run([sys.executable, "-m", "viztracer", "--combine", str(traces[0]), "-o", str(combined)], check=True)
    assert combined.stat().st_size > 0


def nsys_binary() -> str:
    nsys = os.environ.get("NSYS") or shutil.which("nsys")
    if not nsys:
        pytest.fail("no nsys: set NSYS to the nsys binary")
    return nsys


@needs_two_gpus
def test_nsys_captures_the_window_on_exactly_the_profiled_rank(launch, record):
    """nsys prints its capture messages only when the process ends, so the window's steps are shown by the lines the
    plugin logs where Megatron Bridge calls cudaProfilerStart/Stop, and the report lands per job, host and rank."""
    nsys_binary()
    run = launch(TINY, "train.train_iters=20", *WINDOW, "profiling.profile_ranks=[1]", options=("--nsys",))
    nsys_dir = run.run_dir / "nsys"
    reports = sorted(p.name for p in nsys_dir.glob("profile-*"))
    record(run, reports=reports, step_11_ms=run.step_ms.get(11), step_16_ms=run.step_ms.get(16))
    assert run.returncode == 0, tail(run)
    assert "1: [profiling] rank 1: nsys window opens before step 11" in run.log
    assert "1: [profiling] rank 1: nsys window closes after step 15" in run.log
    assert "0: [profiling]" not in run.log
    assert run.log.count("Capture range started in the application") == 1
    assert "1: Capture range started in the application" in run.log
    assert "1: Capture range ended in the application" in run.log
    assert reports and all(re.fullmatch(r"profile-.+-rank1\.(qdstrm|nsys-rep)", name) for name in reports)


# The recorded runs (bench/results/gpu-suite.md): every rank gone 2.1-2.2 s after the signal. A rank that does not stop
# on SIGTERM is killed only at the end of torchrun's grace (30 s).
GONE_WITHIN_S = 15.0


def test_sigterm_inside_the_viztracer_window_keeps_the_window_steps_up_to_the_signal(tmp_path: Path, record):
    """SIGTERM to srun.sh after step 12 of a window 6..400 (issue 19): rank 0's trace holds the steps from 7 (the
    window's first) to the last one logged, every rank is gone within seconds, and the rank logs that the trace was
    written. The recorded runs traced steps 7-12 and were gone in 2.2 s."""
    env = {**os.environ, "SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_OUTPUT_ROOT": str(tmp_path / "outputs")}
    command = [str(REPO / "srun.sh"), "--local", str(REPO / "recipes" / TINY), "train.train_iters=400",
               "profiling.use_viztracer=true", "profiling.profile_step_start=6", "profiling.profile_step_end=400",
               "profiling.profile_ranks=[0]"]  # fmt: skip
    signalled: list[float] = []
    after_report: list[int] = []  # steps logged after srun.sh printed its hang report: the ranks had SIGTERM then
    reported: list[bool] = []

    def stop_after_step_12(line: str, process: subprocess.Popen) -> None:
        logged = megatron_log.ITERATION.search(line)
        if logged and int(logged.group(1)) == 12 and not signalled:
            signalled.append(time.monotonic())
            process.send_signal(signal.SIGTERM)
        if line.startswith("srun.sh: hang report ("):
            reported.append(True)
        elif logged and reported:
            after_report.append(int(logged.group(1)))

    finished = run_with_time_limit(command, cwd=tmp_path, env=env, timeout_s=420, on_line=stop_after_step_12)
    log = "".join(finished.lines)
    assert signalled, f"no step 12 logged: {log[-3000:]}"
    gone_after_s = finished.ended - signalled[0]
    logged_steps = sorted(megatron_log.parse(log).step_ms)
    traces = sorted((tmp_path / "outputs").glob("*/*/viztracer/trace_rank0.json"))
    events = json.loads(traces[0].read_text())["traceEvents"] if traces else []
    steps = [e for e in events if e.get("ph") == "X" and TRACE_STEP.match(e["name"])]
    record(
        Run(finished.returncode, log, finished.wall_s, None, None),
        stopped_after_s=round(gone_after_s, 1),
        trace_events=len(events),
        traced_train_steps=len(steps),
        last_logged_step=logged_steps[-1] if logged_steps else None,
        steps_logged_after_the_report=after_report,
    )
    assert finished.returncode == 128 + signal.SIGTERM, log[-3000:]
    assert "0: [profiling] rank 0: viztracer trace written to" in log, log[-3000:]
    assert "0: [profiling] rank 0: viztracer window opens before step 7" in log, log[-3000:]
    # The signal follows step 12's line; srun.sh writes its hang report before the ranks get SIGTERM, and the rank
    # trains on meanwhile: 3 steps on the H200 (2026-12-01), more when a rank's answer takes the report's whole grace.
    # Once the report is out the ranks get SIGTERM, and VizTracer's handler ends the rank within the step it is in;
    # its line and one more may still be on their way through the rank's log writer as srun.sh prints the report.
    assert reported, log[-3000:]
    assert logged_steps[-1] >= 12, logged_steps
    assert len(after_report) <= 2, f"steps logged after the hang report, when the ranks had SIGTERM: {after_report}"
    assert len(steps) == logged_steps[-1] - 6, f"{len(steps)} train_step calls for steps 7-{logged_steps[-1]}"
    assert gone_after_s < GONE_WITHIN_S, f"the ranks took {gone_after_s:.1f} s to go after SIGTERM"
