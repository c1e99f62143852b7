"""What a per-step A/B measured: each arm's counted steps in each of its turns, per-round throughput ratios with their
spread, and how far each arm's loss curve is from the reference's.

Inputs: bench/turns.py's record (when each turn began and ended) and the TensorBoard scalars of each arm's run
(launches.scalars). A step belongs to the turn in which it was logged. The first step of a turn is left out (it was in
flight when the arm was paused, so its time holds the pause), and `settle` more, while caches refill.
"""

import statistics

from bench import launches

LOSS_VS_SAMPLES = "lm loss vs samples"  # Megatron Bridge 0.6.2's training_log: the loss at each consumed-sample count
PEAK_RESERVED_GB = "memory/mem-max-reserved-gigabytes"


def counted_steps(step_times: dict[int, tuple[float, float]], began: float, ended: float, settle: int) -> list[int]:
    """The steps logged within (began, ended], in order, without the first 1 + settle."""
    return sorted(step for step, (wall, _) in step_times.items() if began < wall <= ended)[1 + settle :]


def spread(values: list[float]) -> dict | None:
    """Median, quartiles (inclusive) and range."""
    if not values:
        return None
    quartiles = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {
        "n": len(values),
        "median": round(statistics.median(values), 4),
        "q1": round(quartiles[0], 4),
        "q3": round(quartiles[2], 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def verdict(ratios: dict | None) -> str:
    """Faster or slower only when the interquartile range of the per-round ratios lies wholly on one side of 1."""
    if ratios is None or ratios["n"] < 3:
        return "too few rounds"
    if ratios["q3"] < 1:
        return "slower, outside the spread"
    if ratios["q1"] > 1:
        return "faster, outside the spread"
    return "within the spread"


def block_rounds(block: dict, turns: list[dict], throughput: dict[tuple[str, int], float]) -> dict[str, list[float]]:
    """Per round, each other arm's throughput over the reference's (the block's first arm), in rounds where both
    have one. throughput: {(arm, turn index): tokens/s}."""
    reference, *others = block["arms"]
    rows = [
        {"round": turn["round"], "launch": turn["arm"], "tokens_per_s": throughput.get((turn["arm"], index))}
        for index, turn in enumerate(turns)
        if turn["block"] == block["index"]
    ]
    return {arm: launches.per_round(rows, "tokens_per_s", over=(arm, reference)) for arm in others}


def loss_gap(losses: dict[int, float], reference: dict[int, float]) -> dict | None:
    """Mean and largest |loss - reference loss| at the consumed-sample counts both logged."""
    common = sorted(set(losses) & set(reference))
    if not common:
        return None
    gaps = [abs(losses[samples] - reference[samples]) for samples in common]
    return {"points": len(common), "mean_abs": round(statistics.mean(gaps), 5), "max_abs": round(max(gaps), 5)}


def loss_agrees(gap: dict | None, noise: dict | None) -> str:
    """Within run-to-run noise: the mean gap to the reference no larger than that of the same recipe with another
    seed (the noise arm) over the same kind of run."""
    if gap is None:
        return "no common points"
    if noise is None:
        return "no noise arm"
    return "within noise" if gap["mean_abs"] <= noise["mean_abs"] else "outside noise"


def arm_figures(found: dict, counted: list[int], tokens_per_step: int, gpus: int) -> dict:
    """One arm's figures over its counted steps: step time, tokens/s/GPU, Megatron Bridge's logged TFLOP/s/GPU and
    the FLOPs per token that figure implies; and its peak memory over the whole run."""
    step_times, logged = launches.values(found, launches.STEP_TIME_S), launches.values(found, launches.TFLOPS_PER_GPU)
    step_s = statistics.median(step_times[step] for step in counted) if counted else None
    tflops_counted = [logged[step] for step in counted if step in logged]
    tflops = statistics.median(tflops_counted) if tflops_counted else None
    allocated = launches.values(found, launches.PEAK_ALLOCATED_GB).values()
    reserved = launches.values(found, PEAK_RESERVED_GB).values()
    tokens_per_s = tokens_per_step / step_s / gpus if step_s else None
    return {
        "counted_steps": len(counted),
        "step_ms": round(step_s * 1000, 1) if step_s else None,
        "tokens_per_s_per_gpu": round(tokens_per_s) if tokens_per_s else None,
        "logged_tflops_per_gpu": round(tflops, 1) if tflops else None,
        "logged_gflop_per_token": round(tflops * 1e3 / tokens_per_s, 2) if tflops and tokens_per_s else None,
        "peak_allocated_gb": round(max(allocated), 2) if allocated else None,
        "peak_reserved_gb": round(max(reserved), 2) if reserved else None,
    }


def turn_figures(record: dict, step_times: dict[str, dict]) -> tuple[dict, dict]:
    """Per turn: its throughput, tokens per step over the median counted step ({(arm, turn index): tokens/s}); per
    arm: its counted steps."""
    throughput: dict[tuple[str, int], float] = {}
    counted: dict[str, list[int]] = {arm: [] for arm in record["arms"]}
    for index, turn in enumerate(record["turns"]):
        arm, times = turn["arm"], step_times[turn["arm"]]
        steps = counted_steps(times, turn["began"], turn["ended"], record["settle"])
        counted[arm] += steps
        if steps:
            median_s = statistics.median(times[step][1] for step in steps)
            throughput[(arm, index)] = record["arms"][arm]["tokens_per_step"] / median_s
    return throughput, counted


def block_figures(block: dict, record: dict, throughput: dict, losses: dict, noise: dict | None) -> dict:
    reference = block["arms"][0]
    rounds = block_rounds(block, record["turns"], throughput) if not block.get("skipped") else {}
    gaps = {arm: loss_gap(losses[arm], losses[reference]) for arm in rounds}
    return {
        **block,
        "ratios": rounds,
        "spread": {arm: spread(ratios) for arm, ratios in rounds.items()},
        "verdict": {arm: verdict(spread(ratios)) for arm, ratios in rounds.items()},
        "loss": {arm: {"gap": gap, "agrees": loss_agrees(gap, noise)} for arm, gap in gaps.items()},
    }


def analyse(record: dict, found: dict[str, dict]) -> dict:
    """The whole call: per arm, per block, and the noise. found: {arm: launches.scalars(its directory)}."""
    arms = record["arms"]
    step_times = {arm: found.get(arm, {}).get(launches.STEP_TIME_S, {}) for arm in arms}
    throughput, counted = turn_figures(record, step_times)
    figures = {
        arm: arm_figures(found.get(arm, {}), counted[arm], spec["tokens_per_step"], spec["gpus"])
        for arm, spec in arms.items()
    }
    losses = {arm: launches.values(found.get(arm, {}), LOSS_VS_SAMPLES) for arm in arms}
    noise = noise_gap(record, losses)
    return {
        "arms": figures,
        "blocks": [block_figures(block, record, throughput, losses, noise) for block in record["blocks"]],
        "loss_noise": noise,
    }


def noise_gap(record: dict, losses: dict[str, dict[int, float]]) -> dict | None:
    """The loss gap of the noise arm (the reference recipe with another seed) to its reference, if the call had one."""
    for block in record["blocks"]:
        reference, *others = block["arms"]
        for arm in others:
            if record["arms"][arm].get("noise_of") == reference:
                return loss_gap(losses[arm], losses[reference])
    return None
