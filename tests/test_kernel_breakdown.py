"""bench/kernel_breakdown.py: Holistic Trace Analysis on a trace laid out as torch.profiler's export_chrome_trace writes
it (Megatron Bridge's rank-N.json.gz), with kernel names taken from a real profiled step of Llama 3 8B in FP8 on H200;
timings are laid out so that every figure can be worked out by hand."""

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
T0 = 5_218_917_357_654.0  # microseconds, as the profiler's clock gives them
CPU = {"pid": 3815, "tid": 3815}


def trace_events() -> list[dict]:
    """One profiler step. Compute runs 0-150, 160-170 and 190-200 ms; the all-gather runs under compute, the
    reduce-scatter alone; nothing runs 150-160 ms."""
    events = [
        {"name": "process_name", "ph": "M", "ts": T0, **CPU, "args": {"name": "python"}},
        {"name": "process_name", "ph": "M", "ts": T0, "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#4",
            **CPU,
            "ts": T0 - 50,
            "dur": 201_000.0,
            "args": {"External id": 1, "Record function id": 0, "Ev Idx": 0},
        },
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "aten::mm",
            **CPU,
            "ts": T0 - 20,
            "dur": 15.0,
            "args": {"External id": 2, "Record function id": 0, "Ev Idx": 1},
        },
    ]
    kernels = [(GEMM, 0, 100, 7), (ATTENTION, 100, 150, 7), (ALL_GATHER, 50, 130, 20), (CAST, 160, 170, 7)]
    kernels += [(REDUCE_SCATTER, 170, 190, 20), (SWIGLU, 190, 200, 7)]
    for correlation, (name, start_ms, end_ms, stream) in enumerate(kernels, start=100):
        launched = T0 + start_ms * 1000 - 8
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", **CPU, "ts": launched,
                       "dur": 5.0, "args": {"External id": 2, "cbid": 211, "correlation": correlation}})  # fmt: skip
        events.append({
            "ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": T0 + start_ms * 1000,
            "dur": (end_ms - start_ms) * 1000.0,
            "args": {"External id": 2, "queued": 0, "device": 0, "context": 1, "stream": stream,
                     "correlation": correlation, "registers per thread": 168, "shared memory": 0,
                     "blocks per SM": 1.0, "warps per SM": 4.0, "grid": [132, 1, 1], "block": [128, 1, 1],
                     "est. achieved occupancy %": 6},
        })  # fmt: skip
    return events


def write_trace(path: Path, events: list[dict]) -> Path:
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_011_707_392}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_790_857_026_000_000_000,
        "traceEvents": events,
        "traceName": str(path),
    }
    with gzip.open(path, "wt") as out:
        json.dump(trace, out)
    return path


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "rank-0.json.gz", trace_events())


@pytest.mark.parametrize(
    ("name", "hta_kind", "kind"),
    [
        (GEMM, "COMPUTATION", "gemm"),
        (ATTENTION, "COMPUTATION", "attention"),
        (ALL_GATHER, "COMMUNICATION", "communication (NCCL)"),
        ("Memcpy DtoD (Device -> Device)", "MEMORY", "memory copies and sets"),
        (CAST, "COMPUTATION", "casts, amax, FP8 quantize"),
        (SWIGLU, "COMPUTATION", "other elementwise"),
        ("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<", "COMPUTATION", "norm"),
        (
            "void multi_tensor_apply_kernel<TensorListMetadata<4, false>, transformer_engine::multi_tensor_adam::",
            "COMPUTATION",
            "optimizer",
        ),
    ],
)
def test_kernel_names_of_a_real_step_get_their_kind(name: str, hta_kind: str, kind: str):
    assert kernel_breakdown.kind(name, hta_kind) == kind


def test_kernel_time_by_kind_idle_time_and_hidden_communication(trace: Path):
    assert kernel_breakdown.breakdown(trace) == {
        "span_ms": 200.0,
        "kernel_ms": {
            "gemm": 100.0,
            "communication (NCCL)": 100.0,
            "attention": 50.0,
            "casts, amax, FP8 quantize": 10.0,
            "other elementwise": 10.0,
        },
        "computing_ms": 170.0,
        "only_communication_or_memory_ms": 20.0,  # the reduce-scatter, 170-190 ms
        "idle_ms": 10.0,  # 150-160 ms
        "communication_under_computation": 0.8,  # 80 of the 100 ms of NCCL kernels
    }


def test_command_prints_the_tables_and_writes_the_json(trace: Path, tmp_path: Path):
    out = tmp_path / "kernels.json"
    command = [sys.executable, str(REPO / "bench" / "kernel_breakdown.py"), str(trace), "--json", str(out)]
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert "| gemm | 100.0 | 50.0% |" in printed
    assert "| idle (no kernel) | 10.0 | 5.0% |" in printed
    assert "| running only communication or memory kernels | 20.0 | 10.0% |" in printed
    assert "Communication under computation: 80.0%" in printed
    assert json.loads(out.read_text())["communication_under_computation"] == 0.8


def test_a_trace_without_kernels_is_refused(tmp_path: Path):
    cpu_only = [event for event in trace_events() if event.get("cat") != "kernel"]
    with pytest.raises(ValueError, match="no GPU kernels"):
        kernel_breakdown.breakdown(write_trace(tmp_path / "rank-0.json.gz", cpu_only))
