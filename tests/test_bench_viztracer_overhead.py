"""bench/bench_viztracer_overhead.py: which steps each pair compares, the ratio and the step after the window, and
how the two runs of a round are kept apart."""

from bench import bench_viztracer_overhead as overhead


def steps(normal: float, window: float, after: float) -> dict[str, float]:
    """Step times as PREFIX.json holds them (string keys): warm-up 1-2, window 11-15, step 16 writes the trace."""
    times = {step: normal for step in range(1, 41)} | {1: 9000.0, 2: 500.0, 16: after}
    times |= {step: window for step in range(11, 16)}
    return {str(step): ms for step, ms in times.items()}


def test_pair_compares_the_same_steps_outside_the_window():
    pair = {
        "not_installed": {"step_ms": steps(100.0, 100.0, 100.0), "gpu": "0"},
        "installed": {"step_ms": steps(101.0, 400.0, 130.0), "gpu": "1"},
    }
    overhead.compare(pair)
    assert pair["not_installed"]["median_compared_step_ms"] == 100.0
    assert pair["installed"]["median_compared_step_ms"] == 101.0
    assert pair["installed / not"] == 1.01
    assert pair["step after window / installed median"] == 1.29


def test_rounds_alternate_gpus_and_the_runs_never_share_a_port():
    assert overhead.gpus_of_round(0) == ("0", "1")
    assert overhead.gpus_of_round(1) == ("1", "0")
    commands = overhead.commands(steps=120)
    assert "--nproc_per_node=1" in commands["not_installed"]
    assert f"--master_port={overhead.PORTS['not_installed']}" in commands["not_installed"]
    assert overhead.PORTS["not_installed"] != overhead.PORTS["installed"]
    assert commands["installed"][1] == "--local"
    assert "profiling.use_viztracer=true" in commands["installed"]
    assert "profiling.use_viztracer=true" not in commands["not_installed"]
    for command in commands.values():
        assert "train.train_iters=120" in command
