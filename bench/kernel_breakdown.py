"""Where one profiled training step spends its GPU time: kernel time by kind, the time no kernel ran, and how much of
the communication ran under computation, from one rank's PyTorch profiler trace, computed by Holistic Trace Analysis.

    python3 bench/kernel_breakdown.py TRACE [--json OUT.json]

TRACE is what Megatron Bridge writes with profiling.use_pytorch_profiler=true: `<run>/torch_profile/rank-N.json.gz`,
for example from the launch benchmark's command with these overrides added:

    profiling.use_pytorch_profiler=true profiling.profile_step_start=4 profiling.profile_step_end=5 \
        profiling.profile_ranks=[0]

HTA sorts kernels into communication, memory and computation, and measures idle time (no kernel at all), time with
only communication or memory kernels running, and the share of communication time overlapped by computation. Our
part is naming the kinds of computation kernels (GEMM, attention, casts...), which HTA does not do.
"""

import argparse
import json
import logging
import re
from pathlib import Path

from hta.trace_analysis import TraceAnalysis

# Computation kernels by name, first match wins: cuDNN's attention kernels contain "gemm"-like names, and TE's cast
# kernels mention "transpose".
KINDS = (
    ("attention", re.compile(r"sdpa|fmha|flash|attn", re.IGNORECASE)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas", re.IGNORECASE)),
    ("casts, amax, FP8 quantize", re.compile(r"amax|quantiz|cast|scale_from|fp8", re.IGNORECASE)),
    ("optimizer", re.compile(r"multi_tensor|adam", re.IGNORECASE)),
    ("norm", re.compile(r"norm", re.IGNORECASE)),
)
HTA_KINDS = {"COMMUNICATION": "communication (NCCL)", "MEMORY": "memory copies and sets"}
OTHER = "other elementwise"


def kind(name: str, hta_kind: str = "COMPUTATION") -> str:
    if hta_kind in HTA_KINDS:
        return HTA_KINDS[hta_kind]
    return next((kind for kind, pattern in KINDS if pattern.search(name)), OTHER)


def breakdown(trace: Path) -> dict:
    logging.getLogger("hta").setLevel(logging.WARNING)
    analysis = TraceAnalysis(trace_files={0: str(trace)}, include_last_profiler_step=True)
    _, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, duration_ratio=1.0, num_kernels=1_000_000)
    if kernels.empty:
        raise ValueError(f"{trace} has no GPU kernels: was it written by the PyTorch profiler with CUDA activities?")
    temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
    overlap = analysis.get_comm_comp_overlap(visualize=False).iloc[0]
    by_kind: dict[str, float] = {}
    for name, microseconds, hta_kind in zip(kernels["name"], kernels["sum (us)"], kernels["kernel_type"], strict=True):
        by_kind[kind(name, hta_kind)] = by_kind.get(kind(name, hta_kind), 0.0) + microseconds / 1000
    return {
        "span_ms": round(temporal["kernel_time(us)"] / 1000, 1),  # first kernel start to last kernel end
        "kernel_ms": {k: round(ms, 1) for k, ms in sorted(by_kind.items(), key=lambda item: -item[1])},
        "computing_ms": round(temporal["compute_time(us)"] / 1000, 1),
        "only_communication_or_memory_ms": round(temporal["non_compute_time(us)"] / 1000, 1),
        "idle_ms": round(temporal["idle_time(us)"] / 1000, 1),
        "communication_under_computation": round(overlap["comp_comm_overlap_pctg"] / 100, 3),
    }


def markdown(result: dict) -> str:
    span = result["span_ms"]
    lines = [f"Traced span: {span} ms (first kernel start to last kernel end).", "", "| kernels | ms | share of span |"]
    lines.append("|---|---|---|")
    lines += [f"| {kind} | {ms} | {ms / span:.1%} |" for kind, ms in result["kernel_ms"].items()]
    lines += ["", "| the GPU was | ms | share of span |", "|---|---|---|"]
    for what, key in (
        ("computing", "computing_ms"),
        ("running only communication or memory kernels", "only_communication_or_memory_ms"),
        ("idle (no kernel)", "idle_ms"),
    ):
        lines.append(f"| {what} | {result[key]} | {result[key] / span:.1%} |")
    lines += ["", f"Communication under computation: {result['communication_under_computation']:.1%}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="rank-N.json.gz from Megatron Bridge's PyTorch profiler")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    result = breakdown(args.trace)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
