"""DeepEP for real (issue 29): Megatron's flex dispatcher with the DeepEP backend on 2 GPUs, EP=2.

The ranks must import deep_ep: the image builds it; elsewhere build it with tools/build_deepep.sh and put its folder
on PYTHONPATH. Two tests, as each catches what the other cannot: the dispatch check compares every received token
count and every combined value and gradient with what the routing implies; the training run shows that a real model
trains through DeepEP as it does through the alltoall dispatcher (at random init the loss hardly depends on the
routing, so a loss curve alone would miss a wrong route).
"""

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests import hf_models
from tests.gpu.conftest import REPO, Run, tail
from tests.gpu.test_training import DSV2_LITE, DSV2_ON_TWO_GPUS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        torch.cuda.device_count() < 2,
        reason="needs 2 GPUs: DeepEP's intranode kernels run 2, 4 or 8 ranks, one per GPU, and EP=2 needs 2 ranks",
    ),
]

ITERATIONS = 20
# Alternated, so that the drift of the GPUs within a call falls on both dispatchers alike.
ORDER = ("alltoall", "deepep", "deepep", "alltoall")
TWO_GPUS = tuple(o for o in DSV2_ON_TWO_GPUS if not o.startswith("moe_token_dispatcher_type="))
# The least loss difference taken as noise: the dispatchers sum each token's expert outputs in different orders
# (bf16), which two runs of one dispatcher on the same seed may not show at all.
RELATIVE_FLOOR = 0.01


def test_deepep_dispatch_and_combine_match_the_routing_on_two_gpus(tmp_path: Path, record):
    prefix = tmp_path / "deepep-dispatch"
    command = [sys.executable, str(REPO / "tests" / "gpu" / "deepep_dispatch.py"), str(prefix), "--ranks", "2"]
    start = time.monotonic()
    result = subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True, timeout=300)
    log = result.stdout + result.stderr
    checks = json.loads(prefix.with_suffix(".json").read_text()) if prefix.with_suffix(".json").exists() else {}
    worst = {
        key: max((row[key] for row in checks.get("rows", [])), default=None)
        for key in ("combined_error", "grad_x_error", "grad_probs_error")
    }
    record(Run(result.returncode, log, time.monotonic() - start, None, None), **worst)
    assert result.returncode == 0, log[-3000:]
    assert checks["ok"] and len(checks["rows"]) == 2 * 3, checks


def loss_agreement(runs: dict[str, list[Run]]) -> dict[str, object]:
    """Per step: the two dispatchers' mean losses, their difference, and the run-to-run noise (the larger of the two
    dispatchers' own differences), with the tolerance max(3 x noise, RELATIVE_FLOOR x loss)."""
    steps = sorted(set.intersection(*(set(run.losses) for group in runs.values() for run in group)))
    rows = []
    for step in steps:
        means = {name: statistics.fmean(run.losses[step] for run in group) for name, group in runs.items()}
        noise = max(abs(group[0].losses[step] - group[1].losses[step]) for group in runs.values())
        difference = abs(means["deepep"] - means["alltoall"])
        tolerance = max(3 * noise, RELATIVE_FLOOR * means["alltoall"])
        rows.append({"step": step, **means, "difference": difference, "noise": noise, "tolerance": tolerance})
    return {"steps": len(steps), "worst": max(rows, key=lambda row: row["difference"] / row["tolerance"], default={})}


def test_deepep_trains_the_deepseek_v2_lite_shape_like_alltoall_with_ep2(launch, record, tmp_path: Path):
    hf_path = hf_models.write("deepseek_v2", tmp_path / "deepseek_v2_config_only")
    runs: dict[str, list[Run]] = {"alltoall": [], "deepep": []}
    for dispatcher in ORDER:
        run = launch(
            DSV2_LITE,
            f"hf_path={hf_path}",
            *TWO_GPUS,
            f"moe_token_dispatcher_type={dispatcher}",
            f"train.train_iters={ITERATIONS}",
        )
        runs[dispatcher].append(run)
        if run.returncode != 0:
            break
    finished = all(len(group) == 2 for group in runs.values())
    agreement = loss_agreement(runs) if finished else {}
    medians = {name: [run.median_step_ms() for run in group] for name, group in runs.items()}
    # ABBA: the first pair is A then B, the second B then A.
    ratios = [b / a for a, b in zip(medians["alltoall"], medians["deepep"], strict=False) if a and b]
    record(
        runs["deepep"][-1] if runs["deepep"] else runs["alltoall"][-1],
        order=list(ORDER),
        median_step_ms_alltoall=medians["alltoall"],
        median_step_ms_deepep=medians["deepep"],
        step_time_ratio_deepep_over_alltoall=[round(r, 3) for r in ratios],
        loss_agreement=agreement,
        final_losses={name: [run.losses.get(ITERATIONS) for run in group] for name, group in runs.items()},
    )
    for group in runs.values():
        for run in group:
            assert run.returncode == 0, tail(run)
    assert finished
    for run in runs["deepep"]:
        config = yaml.safe_load((run.run_dir / "config.yaml").read_text())["model"]
        assert (config["moe_token_dispatcher_type"], config["moe_flex_dispatcher_backend"]) == ("flex", "deepep")
    for run in runs["deepep"] + runs["alltoall"]:
        losses = [run.losses[step] for step in sorted(run.losses)]
        assert len(losses) == ITERATIONS and all(math.isfinite(loss) for loss in losses), losses
        assert losses[-1] < losses[0] - 1.0, losses
    assert agreement["steps"] == ITERATIONS
    worst = agreement["worst"]
    assert worst["difference"] <= worst["tolerance"], agreement
