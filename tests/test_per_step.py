"""bench/bench_turns.py's analysis: which steps of a turn count, per-round ratios and their spread, the verdict and
the loss gap, and the whole analysis of a recorded call read back from event files that torch's own SummaryWriter
wrote."""

from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from bench import bench_turns, launches

# A turn from wall 100 to 110: the step logged at 101 was in flight when the arm was paused (its time holds the
# pause), the one at 102 settles; 103-105 count. 99 and 111 belong to other turns.
STEPS = {10: (99.0, 1.0), 11: (101.0, 31.0), 12: (102.0, 1.2), 13: (103.0, 1.0), 14: (104.0, 1.1), 15: (105.0, 0.9)}
STEPS[16] = (111.0, 1.0)


def test_a_turn_counts_its_steps_after_the_one_that_spans_the_pause_and_the_settling_ones():
    assert bench_turns.counted_steps(STEPS, 100.0, 110.0, settle=1) == [13, 14, 15]
    assert bench_turns.counted_steps(STEPS, 100.0, 110.0, settle=0) == [12, 13, 14, 15]
    assert bench_turns.counted_steps(STEPS, 200.0, 210.0, settle=1) == []
    record = {
        "settle": 1,
        "arms": {"a": {"tokens_per_step": 8000}},
        "turns": [{"arm": "a", "began": 100.0, "ended": 110.0}],
    }
    assert bench_turns.turn_figures(record, {"a": STEPS}) == (
        {("a", 0): pytest.approx(8000 / 1.0)},
        {"a": [13, 14, 15]},
    )


def test_spread_is_median_quartiles_and_range_and_the_verdict_needs_the_whole_iqr_on_one_side():
    faster = bench_turns.spread([1.02, 1.03, 1.01, 1.04, 1.02])
    assert faster == {"n": 5, "median": 1.02, "q1": 1.02, "q3": 1.03, "min": 1.01, "max": 1.04}
    assert bench_turns.verdict(faster) == "faster, outside the spread"
    assert bench_turns.verdict(bench_turns.spread([0.99, 0.98, 0.995, 0.97])) == "slower, outside the spread"
    assert bench_turns.verdict(bench_turns.spread([0.99, 1.01, 1.0, 0.98, 1.02])) == "within the spread"
    assert bench_turns.verdict(bench_turns.spread([1.1, 1.2])) == "too few rounds"
    assert bench_turns.spread([]) is None


def test_each_round_pairs_an_arm_with_the_reference_of_its_block():
    block = {"index": 0, "arms": ["ours", "upstream"]}
    turns = [
        {"block": 0, "round": 0, "arm": "ours"},
        {"block": 0, "round": 0, "arm": "upstream"},
        {"block": 0, "round": 1, "arm": "upstream"},
        {"block": 0, "round": 1, "arm": "ours"},
        {"block": 0, "round": 2, "arm": "ours"},  # upstream failed: no pair
        {"block": 1, "round": 0, "arm": "ours"},
    ]
    throughput = {("ours", 0): 100.0, ("upstream", 1): 98.0, ("upstream", 2): 103.0, ("ours", 3): 100.0}
    throughput |= {("ours", 4): 99.0, ("ours", 5): 50.0}
    assert bench_turns.block_rounds(block, turns, throughput) == {"upstream": [0.98, 1.03]}


def test_loss_gap_is_taken_where_both_logged_the_same_consumed_samples_and_judged_against_the_seed_noise():
    reference = {8: 10.8, 16: 10.2, 24: 9.7, 32: 9.1}
    larger_batch = {16: 10.25, 32: 9.0}
    gap = bench_turns.loss_gap(larger_batch, reference)
    assert gap == {"points": 2, "mean_abs": 0.075, "max_abs": 0.1}
    assert bench_turns.loss_agrees(gap, {"points": 4, "mean_abs": 0.08, "max_abs": 0.2}) == "within noise"
    assert bench_turns.loss_agrees(gap, {"points": 4, "mean_abs": 0.01, "max_abs": 0.02}) == "outside noise"
    assert bench_turns.loss_agrees(bench_turns.loss_gap({1: 1.0}, reference), None) == "no common points"


def write_events(directory: Path, steps: dict[int, tuple[float, float]], loss: dict[int, float], tflops: float) -> None:
    """What Megatron Bridge's training_log writes with launches.MEASURED, at the given wall times; TFLOP/s of a step
    as its time says (`tflops` at 1 s)."""
    writer = SummaryWriter(log_dir=str(directory / "outputs" / "tb_logs"))
    for step, (wall, seconds) in steps.items():
        writer.add_scalar(launches.STEP_TIME_S, seconds, step, walltime=wall)
        writer.add_scalar("throughput/tflops/device", tflops / seconds, step, walltime=wall)
        writer.add_scalar("memory/mem-max-allocated-gigabytes", 40.0 + step / 100, step, walltime=wall)
        writer.add_scalar("memory/mem-max-reserved-gigabytes", 45.0, step, walltime=wall)
    for samples, value in loss.items():
        writer.add_scalar(bench_turns.LOSS_VS_SAMPLES, value, samples)
    writer.close()


def test_a_recorded_call_reads_as_per_arm_figures_per_block_ratios_and_loss_noise(tmp_path: Path):
    # ours and seed take turns (block 0), then ours and no_checks (block 1); 2 rounds each, 4 steps a turn.
    record = {"settle": 1, "turn_steps": 2, "arms": {}, "blocks": [], "turns": []}
    for name, noise_of in (("ours", None), ("seed", "ours"), ("no_checks", None)):
        record["arms"][name] = {"tokens_per_step": 65536, "gpus": 1, "noise_of": noise_of}
    record["blocks"] = [{"index": 0, "arms": ["ours", "seed"]}, {"index": 1, "arms": ["ours", "no_checks"]}]
    seconds = {"ours": 1.0, "seed": 1.0, "no_checks": 0.95}
    order = [(0, 0, "ours"), (0, 0, "seed"), (0, 1, "seed"), (0, 1, "ours")]
    order += [(1, 0, "ours"), (1, 0, "no_checks"), (1, 1, "no_checks"), (1, 1, "ours")]
    steps: dict[str, dict[int, tuple[float, float]]] = {name: {} for name in seconds}
    wall = 1000.0
    for block, round_index, arm in order:
        began = wall
        for index in range(4):
            wall += seconds[arm]
            step = len(steps[arm]) + 1
            steps[arm][step] = (wall, 30.0 if index == 0 else seconds[arm])  # the first step spans the pause
        record["turns"].append({"block": block, "round": round_index, "arm": arm, "began": began, "ended": wall})
        wall += 0.5
    losses = {"ours": {32: 10.0, 64: 9.0}, "seed": {32: 10.1, 64: 9.1}, "no_checks": {32: 10.0, 64: 9.02}}
    for name in seconds:
        write_events(tmp_path / name, steps[name], losses[name], tflops=600.0)
    found = {name: launches.scalars(tmp_path / name) for name in seconds}
    analysis = bench_turns.analyse(record, found)
    ours = analysis["arms"]["ours"]
    assert ours == {"counted_steps": 8, "step_ms": 1000.0, "tokens_per_s_per_gpu": 65536}
    seed_block, lever_block = analysis["blocks"]
    assert seed_block["ratios"] == {"seed": [1.0, 1.0]}
    assert lever_block["ratios"] == {"no_checks": [round(1 / 0.95, 4)] * 2}
    assert analysis["loss_noise"] == {"points": 2, "mean_abs": 0.1, "max_abs": 0.1}
    assert lever_block["loss"]["no_checks"] == {
        "gap": {"points": 2, "mean_abs": 0.01, "max_abs": 0.02},
        "agrees": "within noise",
    }
