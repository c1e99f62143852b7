"""bench/kernel_breakdown.py on a Chrome trace in the PyTorch profiler's format, with kernel names taken from a real
profiled step of Llama 3 8B in FP8 on H200 (bench/results/2026-11-30-eve-launch-bench.md); timings are laid out so
that every figure can be worked out by hand."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import kernel_breakdown
from tests.conftest import REPO

GEMM = "nvjet_sm90_qrtst_128x160_128x5_2x1_v_bz_coopA_algo2_TNT"
ATTENTION = "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1_kernel0_0"
ALL_GATHER = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
REDUCE_SCATTER = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CAST = (
    "void transformer_engine::detail::(anonymous namespace)::cast_transpose_general_kernel<4ul, 4ul, __nv_bfloat16, "
    "__nv_fp8_e4m3>(__nv_bfloat16 const*, float const*"
)
SWIGLU = "triton_poi_fused_add_cat_mul_rsub_sigmoid_silu_split_0"


def kernel(name: str, start_ms: float, end_ms: float, stream: int = 7) -> dict:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": start_ms * 1000,
        "dur": (end_ms - start_ms) * 1000,
        "args": {"device": 0, "stream": stream},
    }


# Compute runs 0-150, 160-170 and 190-200 ms; the all-gather runs under compute, the reduce-scatter alone.
EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 500_000},
    kernel(GEMM, 0, 100),
    kernel(ATTENTION, 100, 150),
    kernel(ALL_GATHER, 50, 130, stream=20),
    kernel(CAST, 160, 170),
    kernel(REDUCE_SCATTER, 170, 190, stream=20),
    kernel(SWIGLU, 190, 200),
]


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "rank-0.json.gz"
    with gzip.open(path, "wt") as out:
        json.dump({"traceEvents": EVENTS}, out)
    return path


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        (GEMM, "gemm"),
        (ATTENTION, "attention"),
        (ALL_GATHER, "nccl"),
        (CAST, "casts, amax, FP8 quantize"),
        (SWIGLU, "other elementwise"),
        ("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<", "norm"),
        (
            "void multi_tensor_apply_kernel<TensorListMetadata<4, false>, transformer_engine::multi_tensor_adam::",
            "optimizer",
        ),
    ],
)
def test_kernel_names_of_a_real_step_get_their_kind(name: str, kind: str):
    assert kernel_breakdown.Kernel(name, 0.0, 1.0).kind == kind


def test_kernel_time_by_kind_idle_time_and_hidden_nccl(trace: Path):
    result = kernel_breakdown.breakdown(kernel_breakdown.load_kernels(trace))
    assert result == {
        "span_ms": 200.0,
        "kernel_ms": {
            "gemm": 100.0,
            "nccl": 100.0,
            "attention": 50.0,
            "casts, amax, FP8 quantize": 10.0,
            "other elementwise": 10.0,
        },
        "compute_busy_ms": 170.0,
        "idle_ms": 30.0,
        "nccl_hidden_share": 0.8,
    }


def test_command_prints_the_table_and_writes_the_json(trace: Path, tmp_path: Path):
    out = tmp_path / "kernels.json"
    command = [sys.executable, str(REPO / "bench" / "kernel_breakdown.py"), str(trace), "--json", str(out)]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert "| gemm | 100.0 | 50.0% |" in printed
    assert "| no compute kernel running (idle) | 30.0 | 15.0% |" in printed
    assert json.loads(out.read_text())["nccl_hidden_share"] == 0.8


def test_a_trace_without_kernels_is_refused(tmp_path: Path):
    path = tmp_path / "cpu_only.json"
    path.write_text(json.dumps({"traceEvents": EVENTS[:1]}))
    with pytest.raises(ValueError, match="no GPU kernels"):
        kernel_breakdown.breakdown(kernel_breakdown.load_kernels(path))
