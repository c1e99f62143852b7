"""srun.sh's health check and hang report on the GPU machine (issue 28), with --local: the check's figures on the
real GPUs and NCCL, and the hang report of a real training rank whose GPU stalls (a test-only recipe,
tests/gpu/stalled_tiny_gpt_pretrain.py). One GPU is enough; with two, the NCCL parts and the stalled rank's peer too.

    bash bench/run_gpu_suite.sh DIR tests/gpu/test_health_and_hang.py
"""

import json
import os
import re
from pathlib import Path

import pytest
import torch

from tests.gpu.conftest import REPO, Run, run_with_time_limit

pytestmark = pytest.mark.gpu

GPUS = min(2, torch.cuda.device_count())
# Sane lower bounds only: an H200 measures about 790 TFLOP/s (bf16 matmul) and 4.3 TB/s (HBM copy).
MATMUL_TFLOPS_AT_LEAST = 400.0
HBM_TB_S_AT_LEAST = 2.5
NVLINK_GB_S_AT_LEAST = 50.0


def srun_sh(tmp_path: Path, *args: str, env: dict[str, str], timeout: int) -> Run:
    environment = {
        **os.environ,
        "SRUNSH_GPUS_PER_NODE": str(GPUS),
        "SRUNSH_OUTPUT_ROOT": str(tmp_path / "outputs"),
        **env,
    }
    command = [str(REPO / "srun.sh"), "--local", *args]
    finished = run_with_time_limit(command, cwd=tmp_path, env=environment, timeout_s=timeout)
    log = "".join(finished.lines)
    (tmp_path / "launch.log").write_text(log)
    run_dirs = sorted((tmp_path / "outputs").glob("*/*/"))
    return Run(finished.returncode, log, finished.wall_s, None, run_dirs[-1] if run_dirs else None)


def test_health_check_measures_the_gpus_and_nccl(tmp_path: Path, record):
    run = srun_sh(tmp_path, "--health", env={}, timeout=180)
    report = json.loads((run.run_dir / "health.json").read_text()) if run.run_dir else {}
    gpus = [rank["results"].get("gpu", {}) for rank in report.get("ranks", {}).values()]
    node = (report.get("nodes") or [{}])[0]
    record(
        run,
        gpus=GPUS,
        check_s=report.get("seconds"),
        matmul_tflops=[round(g.get("matmul_tflops", 0), 1) for g in gpus],
        hbm_tb_s=[round(g.get("hbm_tb_s", 0), 3) for g in gpus],
        free_gib=[round(g.get("free_gib", 0), 1) for g in gpus],
        node_all_reduce_gb_s=node.get("figures", {}).get("node.all_reduce"),
        node_broadcast_gb_s=node.get("figures", {}).get("node.broadcast"),
        table=[line for line in run.log.splitlines() if re.match(r"(node|\S+ +0)", line)],
    )
    assert run.returncode == 0, run.log[-3000:]
    assert report["passed"] and len(gpus) == GPUS
    for result in gpus:
        assert result["applicable"] and result["name"].startswith("NVIDIA")
        assert result["matmul_tflops"] > MATMUL_TFLOPS_AT_LEAST, result
        assert result["hbm_tb_s"] > HBM_TB_S_AT_LEAST, result
        assert result["free_gib"] > 0.5 * result["total_gib"], result
    if GPUS > 1:
        assert node["figures"]["node.all_reduce"] > NVLINK_GB_S_AT_LEAST, node
        assert node["figures"]["node.broadcast"] > NVLINK_GB_S_AT_LEAST, node


def test_hang_report_names_the_training_rank_whose_gpu_stalled(tmp_path: Path, record):
    stalled = GPUS - 1
    recipe = str(REPO / "tests" / "gpu" / "stalled_tiny_gpt_pretrain.py")
    overrides = (f"stall_rank={stalled}", "stall_at_step=5", "train.train_iters=1000")
    run = srun_sh(tmp_path, recipe, *overrides, env={"SRUNSH_HANG_TIMEOUT_S": "15"}, timeout=300)
    report = (run.run_dir / "hang-report.txt").read_text() if run.run_dir else ""
    summary = [line for line in run.log.splitlines() if line.startswith(("srun.sh: hang report", "srun.sh:   "))]
    record(run, gpus=GPUS, summary=summary, report_head=report.splitlines()[:12])
    assert run.returncode == 124, run.log[-3000:]
    assert f"rank {stalled}'s GPU spins from step 5 on" in run.log
    assert len(summary) == 3 and summary[0].startswith("srun.sh: hang report (no training step completed for 1")
    assert f"flight recorder records from {GPUS}" in report and f"stacks from {GPUS}" in report
    assert "torchfrtrace" in report and "nccl:" in report
    if GPUS > 1:
        assert f"not in it: rank {stalled} on " in summary[1], summary
    else:
        # The one rank is in its collective, and its GPU never started it (launcher/hang/report.py's summary).
        assert "is in it, and none completed it" in summary[0], summary
        assert summary[1].startswith("srun.sh:   no member's GPU started it: the work queued before it is stuck"), (
            summary
        )
