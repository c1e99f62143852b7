"""bench/bench_launch.py's ratios: every one is a throughput ratio (> 1: the first-named case is faster), and the
VizTracer step-16 figure leaves the traced steps and the step after them out of the median."""

import gzip
import json
from pathlib import Path

from bench import bench_launch


def row(step_ms: float) -> dict:
    return {"median_step_ms": step_ms}


def test_ratios_read_as_throughput_of_the_first_named_case():
    case = "llama3_8b_fsdp_fp8cs_mbs1"
    rows = {
        f"{case}_A_ours": row(100.0),
        f"{case}_B_upstream": row(110.0),
        f"{case}_A_ours+nccl_high_priority": row(80.0),
        "llama3_8b_fsdp_fp8cs_mbs2_A_ours": row(90.0),
    }
    ratios = bench_launch.ratios(rows)
    assert ratios == {
        "fp8cs mbs1 A/B throughput": 1.1,
        "fp8cs mbs1 A+nccl_high_priority / A throughput": 1.25,
        "fp8cs A mbs2 / mbs1 throughput": 1.111,
    }


def test_viztracer_rows_compare_steps_outside_the_window():
    steps = {i: 100.0 for i in range(1, 31)} | {i: 150.0 for i in range(11, 16)} | {16: 140.0}
    traced = {"median_step_ms": 105.0, "step_ms": steps}
    bench_launch.add_derived("tiny_viztracer_installed_window_10_15", traced)
    assert traced["median_step_ms_outside_window"] == 100.0
    assert traced["step_16_ms"] == 140.0
    ratios = bench_launch.ratios(
        {"tiny_viztracer_not_installed": row(125.0), "tiny_viztracer_installed_window_10_15": traced}
    )
    assert ratios == {"viztracer installed / not, outside window": 0.8, "step after window / normal step": 1.4}


def test_precision_specific_tuning_runs_only_at_its_precision():
    cases = bench_launch.cases()
    assert "llama3_8b_fsdp_fp8cs_mbs2_A_ours+fp8_all_layers" in cases
    assert "llama3_8b_fsdp_bf16_mbs2_A_ours+fp8_all_layers" not in cases
    command = cases["llama3_8b_fsdp_bf16_mbs2_A_ours+no_nan_checks"]
    assert command[-3:] == [
        "mixed_precision=bf16_mixed",
        "ddp.check_for_nan_in_grad=false",
        "rerun_state_machine.check_for_nan_in_loss=false",
    ]


def test_recipe_ab_ratio_is_reported():
    recipe = "llama3_8b_h200_fp8cs_recipe"
    ratios = bench_launch.ratios({f"{recipe}_A_ours": row(100.0), f"{recipe}_B_upstream": row(101.0)})
    assert ratios == {f"{recipe} A/B throughput": 1.01}


def test_recipe_tuning_is_measured_against_the_recipe_and_skips_what_the_recipe_already_sets():
    recipe = bench_launch.RECIPE_CASE
    cases = bench_launch.cases()
    assert f"{recipe}_A_ours+nccl_ub" in cases
    assert f"{recipe}_A_ours+fp8_all_layers" not in cases
    assert f"{recipe}_A_ours+te_op_fuser" not in cases
    assert cases[f"{recipe}_A_ours+kernel_profile"][-4:] == list(bench_launch.KERNEL_PROFILE)
    ratios = bench_launch.ratios({f"{recipe}_A_ours": row(100.0), f"{recipe}_A_ours+nccl_ub": row(99.0)})
    assert ratios == {f"{recipe} A+nccl_ub / A throughput": 1.01}


def test_two_recipe_tunings_together_carry_both_and_are_measured_against_the_recipe():
    recipe = bench_launch.RECIPE_CASE
    cases = bench_launch.cases()
    command = cases[f"{recipe}_A_ours+nccl_ub+nccl_simple"]
    assert command[:2] == ["env", "NCCL_PROTO=Simple"]
    assert command[-1] == "ddp.nccl_ub=true"
    assert f"{recipe}_A_ours+nccl_simple+nccl_ub" not in cases  # one name per pair
    assert not [name for name in cases if name.startswith(f"{recipe}_A_ours+") and "te_op_fuser" in name]
    rows = {f"{recipe}_A_ours": row(100.0), f"{recipe}_A_ours+nccl_ub+nccl_simple": row(98.0)}
    assert bench_launch.ratios(rows) == {f"{recipe} A+nccl_ub+nccl_simple / A throughput": 1.02}


def test_kernel_profile_is_read_from_the_run_directory_the_case_logged(tmp_path: Path):
    run_dir = tmp_path / "outputs" / "llama3_8b_h200_fp8cs_pretrain" / "local-20261130-142158-2604"
    (run_dir / "torch_profile").mkdir(parents=True)
    gemm = {"ph": "X", "cat": "kernel", "name": "nvjet_sm90_qqtst_192x192", "ts": 0.0, "dur": 2000.0}
    with gzip.open(run_dir / "torch_profile" / "rank-0.json.gz", "wt") as out:
        json.dump({"traceEvents": [gemm]}, out)
    log = tmp_path / "case.log"
    log.write_text(f"0: entrypoint.py: ddp.nccl_ub = True\n0: entrypoint.py: outputs in {run_dir}\n")
    assert bench_launch.profiled_kernels(log)["kernel_ms"] == {"gemm": 2.0}
    log.write_text("0: entrypoint.py: outputs in /nowhere\n")
    assert bench_launch.profiled_kernels(log) is None
