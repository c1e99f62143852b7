"""bench/bench_viztracer_overhead.py: which steps each pair compares (by the wall time TensorBoard recorded with each
step), the ratio and the step after the window, and how the two runs of a round are kept apart."""

from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from bench import bench_viztracer_overhead as overhead
from bench import launches, upstream_pretrain

T0 = 1_796_000_000.0  # a wall time, in seconds


def steps(normal_s: float, window_s: float, after_s: float, start: float, count: int = 40) -> dict:
    """{step: (wall time, seconds)} as TensorBoard has them: step N logged at start + N seconds; warm-up steps 1-2,
    window 11-15, step 16 writes the trace."""
    seconds = {step: normal_s for step in range(1, count + 1)} | {1: 9.0, 2: 0.5, 16: after_s}
    seconds |= {step: window_s for step in range(11, 16)}
    return {step: (start + step, s) for step, s in seconds.items()}


def test_pair_compares_the_same_steps_outside_the_window():
    pair = overhead.compare(
        {"not_installed": steps(0.100, 0.100, 0.100, T0), "installed": steps(0.101, 0.400, 0.130, T0)}
    )
    assert pair["not_installed"] == {"compared_steps": 40 - 2, "median_ms": 100.0}  # warm-up left out
    assert pair["installed"] == {"compared_steps": 40 - 2 - 6, "median_ms": 101.0}  # warm-up, window, step 16
    assert pair["installed / not"] == 1.01
    assert pair["step after window / median"] == 1.29
    assert pair["concurrent_s"] == 37.0  # steps 3 to 40


def test_only_steps_logged_while_both_runs_trained_are_compared():
    """The installed run starts 10 s later; the not-installed run was faster (90 ms) while it ran alone."""
    alone = {step: (T0 + step, 0.090) for step in range(3, 13)}
    pair = overhead.compare(
        {
            "not_installed": steps(0.100, 0.100, 0.100, T0) | alone,
            "installed": steps(0.100, 0.400, 0.130, T0 + 10),
        }
    )
    assert pair["concurrent_s"] == 27.0  # from T0 + 13 (the installed run's step 3) to T0 + 40
    assert pair["not_installed"]["compared_steps"] == 40 - 12  # steps 13-40
    assert pair["installed"]["compared_steps"] == 30 - 2 - 6  # steps 3-30
    assert pair["installed / not"] == 1.0


def test_a_run_that_logged_no_steps_gives_no_ratio():
    pair = overhead.compare({"not_installed": steps(0.100, 0.100, 0.100, T0), "installed": {}})
    assert pair["installed / not"] is None
    assert pair["installed"]["compared_steps"] == 0
    assert pair["concurrent_s"] is None


def test_steps_come_from_the_event_files_megatron_bridge_writes(tmp_path: Path):
    writer = SummaryWriter(log_dir=str(tmp_path / "0-installed" / "nemo_experiments" / "default" / "tb_logs"))
    for step, (wall, seconds) in steps(0.101, 0.400, 0.130, T0).items():
        writer.add_scalar(launches.STEP_TIME_S, seconds, step, walltime=wall)
    writer.close()
    found = launches.scalars(tmp_path / "0-installed")[launches.STEP_TIME_S]
    assert found[16] == (T0 + 16, pytest.approx(0.13))
    assert (
        overhead.compare({"not_installed": steps(0.100, 0.1, 0.1, T0), "installed": found})["installed / not"] == 1.01
    )


def test_rounds_alternate_gpus_and_the_runs_never_share_a_port():
    assert overhead.gpus_of_round(0) == ("0", "1")
    assert overhead.gpus_of_round(1) == ("1", "0")
    commands = overhead.commands(steps=120)
    assert "--nproc-per-node=1" in commands["not_installed"]
    assert overhead.PORTS["not_installed"] != overhead.PORTS["installed"]
    for run in overhead.RUNS:
        assert f"--master-port={overhead.PORTS[run]}" in commands[run]
        assert "train.train_iters=120" in commands[run]
    assert "profiling.use_viztracer=true" in commands["installed"]
    assert "profiling.use_viztracer=true" not in commands["not_installed"]


def script_arguments(command: list[str]) -> list[str]:
    return command[command.index(str(launches.REPO / "bench" / "upstream_pretrain.py")) + 1 :]


def test_the_two_runs_differ_by_the_plugin_and_its_window_alone():
    commands = overhead.commands(steps=120)
    with_plugin, recipe, overrides = upstream_pretrain.split_arguments(script_arguments(commands["installed"]))
    without_plugin, same_recipe, same_overrides = upstream_pretrain.split_arguments(
        script_arguments(commands["not_installed"])
    )
    assert (with_plugin, without_plugin) == (True, False)
    assert commands["installed"][:4] == commands["not_installed"][:4]  # torchrun, one process; the ports differ
    assert recipe == same_recipe
    assert [o for o in overrides if o not in overhead.WINDOW] == same_overrides
