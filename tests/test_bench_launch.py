"""bench/bench_launch.py: one run's throughput from the TensorBoard event files Megatron Bridge writes (read back from
files torch's own SummaryWriter wrote), A/B per round as throughput (> 1: A faster), and the same overrides for both."""

from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from bench import bench_launch, launches

# Step times (s) of a 7-step Llama 3 8B FP8 run on 2 x H200 (bench/results/launch-ab.md): step 1 builds kernels.
STEP_S = {1: 15.16, 2: 4.61, 3: 4.35, 4: 4.36, 5: 4.34, 6: 4.37, 7: 4.33}


def megatron_run(
    directory: Path, step_s: dict[int, float], tflops: dict[int, float], peak_gb: dict[int, float]
) -> None:
    """What Megatron Bridge's training_log writes with launches.MEASURED, in a run directory below `directory`."""
    writer = SummaryWriter(log_dir=str(directory / "outputs" / "llama3_8b_h200_fp8cs_pretrain" / "bench" / "tb_logs"))
    for step, seconds in step_s.items():
        writer.add_scalar(launches.STEP_TIME_S, seconds, step)
        writer.add_scalar(launches.TFLOPS_PER_GPU, tflops[step], step)
        writer.add_scalar(launches.PEAK_ALLOCATED_GB, peak_gb[step], step)
    writer.close()


def test_a_run_reads_as_medians_after_warm_up_tokens_per_gpu_and_peak_memory(tmp_path: Path):
    tflops = {step: 7.4e2 * 4.35 / seconds for step, seconds in STEP_S.items()}
    peak = {step: 119.45 if step == 1 else 120.08 for step in STEP_S}
    megatron_run(tmp_path, STEP_S, tflops, peak)
    row = bench_launch.throughput(launches.scalars(tmp_path), tokens_per_step=16 * 8192, gpus=2)
    # Steps 3-7: 4.35 4.36 4.34 4.37 4.33 -> median 4.35 s.
    assert row == {
        "steps": 7,
        "step_ms": 4350.0,
        "tflops_per_gpu": 740.0,
        "tokens_per_s_per_gpu": round(16 * 8192 / 4.35 / 2),
        "peak_allocated_gb": pytest.approx(120.08),
    }
    assert row["tokens_per_s_per_gpu"] == 15066


def test_a_run_that_logged_nothing_has_no_figures(tmp_path: Path):
    row = bench_launch.throughput(launches.scalars(tmp_path), tokens_per_step=16 * 8192, gpus=2)
    assert row == {
        "steps": 0,
        "step_ms": None,
        "tflops_per_gpu": None,
        "tokens_per_s_per_gpu": None,
        "peak_allocated_gb": None,
    }


def test_round_ratio_is_a_throughput_over_b_throughput():
    runs = [
        {"round": 0, "launch": "A", "step_ms": 4352.8},
        {"round": 0, "launch": "B", "step_ms": 4344.8},
        {"round": 1, "launch": "B", "step_ms": 4400.0},
        {"round": 1, "launch": "A", "step_ms": 4356.4},
    ]
    assert launches.per_round(runs, "step_ms", over=("B", "A")) == [0.9982, 1.01]


def test_both_launches_carry_the_case_the_measured_logging_and_the_extra_overrides():
    case = bench_launch.CASES["llama3_8b_h200_fp8cs"]
    commands = bench_launch.commands(case, gpus=1, extra=["model.num_layers=4"])
    a, b = commands["A"], commands["B"]
    assert a[-1] == b[-1] == "model.num_layers=4"
    assert a[a.index(str(launches.REPO / case.recipe)) :] == b[b.index(str(launches.REPO / case.recipe)) :]
    assert {"train.global_batch_size=16", "logger.log_throughput_to_tensorboard=true"} <= set(a)
    assert "--nproc-per-node=1" in b


def test_markdown_has_a_row_per_run_and_the_ratios(tmp_path: Path):
    result = {
        "case": "tiny",
        "date": "2026-12-01 10:00 UTC",
        "hardware": "1 x NVIDIA H200, 580.159.04",
        "gpus": 1,
        "versions": "torch 2.11.0",
        "commands": {"A": ["srun.sh"], "B": ["torchrun"]},
        "runs": [
            {"round": 0, "launch": "A", "returncode": 0, "wall_s": 61.2, "step_ms": 150.0, "peak_allocated_gb": 5.9},
            {"round": 0, "launch": "B", "returncode": "timeout 400 s", "wall_s": 400.0, "step_ms": None},
        ],
        "throughput_a_over_b": [],
    }
    table = bench_launch.markdown(result)
    assert "| 0 | A | 0 | 61.2 | None | 150.0 | None | None | 5.9 |" in table
    assert "| 0 | B | timeout 400 s | 400.0 |" in table
    assert "A/B throughput per round: -; none (no round where both launches got there)." in table
