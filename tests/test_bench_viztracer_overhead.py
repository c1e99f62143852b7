"""bench/bench_viztracer_overhead.py: which steps each pair compares, the ratio and the step after the window, and
how the two runs of a round are kept apart."""

from bench import bench_launch, upstream_pretrain
from bench import bench_viztracer_overhead as overhead


def steps(normal: float, window: float, after: float) -> dict[str, float]:
    """Step times as PREFIX.json holds them (string keys): warm-up 1-2, window 11-15, step 16 writes the trace."""
    times = {step: normal for step in range(1, 41)} | {1: 9000.0, 2: 500.0, 16: after}
    times |= {step: window for step in range(11, 16)}
    return {str(step): ms for step, ms in times.items()}


def logged_at(first_second: int, steps: int = 40) -> dict[str, str]:
    """Step N logged at second first_second + N of one minute."""
    return {str(step): f"2026-11-30 14:35:{first_second + step:02d}" for step in range(1, steps + 1)}


def test_pair_compares_the_same_steps_outside_the_window():
    pair = {
        "not_installed": {"step_ms": steps(100.0, 100.0, 100.0), "logged_at": logged_at(0), "gpu": "0"},
        "installed": {"step_ms": steps(101.0, 400.0, 130.0), "logged_at": logged_at(0), "gpu": "1"},
    }
    overhead.compare(pair)
    assert pair["not_installed"]["median_compared_step_ms"] == 100.0
    assert pair["installed"]["median_compared_step_ms"] == 101.0
    assert pair["not_installed"]["compared_steps"] == 40 - 2  # warm-up
    assert pair["installed"]["compared_steps"] == 40 - 2 - 6  # warm-up, window, the step after it
    assert pair["installed / not"] == 1.01
    assert pair["step after window / installed median"] == 1.29


def test_only_steps_logged_while_both_runs_trained_are_compared():
    """The installed run starts 10 s later; the not-installed run was faster (90 ms) while it ran alone."""
    alone = {str(step): 90.0 for step in range(3, 13)}
    pair = {
        "not_installed": {"step_ms": steps(100.0, 100.0, 100.0) | alone, "logged_at": logged_at(0), "gpu": "0"},
        "installed": {"step_ms": steps(100.0, 400.0, 130.0), "logged_at": logged_at(10), "gpu": "1"},
    }
    overhead.compare(pair)
    assert pair["concurrent"] == ["2026-11-30 14:35:13", "2026-11-30 14:35:40"]
    assert pair["not_installed"]["compared_steps"] == 40 - 12  # steps 13-40
    assert pair["installed"]["compared_steps"] == 30 - 2 - 6  # steps 3-30
    assert pair["installed / not"] == 1.0


def test_a_run_that_logged_no_steps_gives_no_ratio():
    pair = {
        "not_installed": {"step_ms": steps(100.0, 100.0, 100.0), "logged_at": logged_at(0), "gpu": "0"},
        "installed": {"step_ms": {}, "logged_at": {}, "gpu": "1"},
    }
    overhead.compare(pair)
    assert pair["installed / not"] is None
    assert pair["installed"]["compared_steps"] == 0


def test_rounds_alternate_gpus_and_the_runs_never_share_a_port():
    assert overhead.gpus_of_round(0) == ("0", "1")
    assert overhead.gpus_of_round(1) == ("1", "0")
    commands = overhead.commands(steps=120)
    assert "--nproc_per_node=1" in commands["not_installed"]
    assert f"--master_port={overhead.PORTS['not_installed']}" in commands["not_installed"]
    assert overhead.PORTS["not_installed"] != overhead.PORTS["installed"]
    assert f"--master_port={overhead.PORTS['installed']}" in commands["installed"]
    assert "profiling.use_viztracer=true" in commands["installed"]
    assert "profiling.use_viztracer=true" not in commands["not_installed"]
    for command in commands.values():
        assert "train.train_iters=120" in command


def script_arguments(command: list[str]) -> list[str]:
    return command[command.index("bench/upstream_pretrain.py") + 1 :]


def test_the_two_runs_differ_by_the_plugin_and_its_window_alone():
    commands = overhead.commands(steps=120)
    with_plugin, recipe, overrides = upstream_pretrain.split_arguments(script_arguments(commands["installed"]))
    without_plugin, same_recipe, same_overrides = upstream_pretrain.split_arguments(
        script_arguments(commands["not_installed"])
    )
    assert (with_plugin, without_plugin) == (True, False)
    assert commands["installed"][:4] == commands["not_installed"][:4]  # torchrun, one process; the ports differ
    assert recipe == same_recipe
    traced = ["profiling.use_viztracer=true", *bench_launch.WINDOW]
    assert [o for o in overrides if o not in traced] == same_overrides
