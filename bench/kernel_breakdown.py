"""Where one profiled training step spends its GPU time: kernel time by kind, and how long the GPU computed nothing.

Reads the Chrome trace that Megatron Bridge's PyTorch profiler writes (profiling.use_pytorch_profiler=true; one
rank's file, `<run>/torch_profile/rank-N.json.gz`) and prints a Markdown table; --json writes the same numbers.

    python3 bench/kernel_breakdown.py TRACE [--json OUT.json]

"Compute" is every kernel that is not NCCL. "idle" is the part of the traced span with no compute kernel running: the
time a faster GEMM cannot win back. "NCCL hidden" is the share of NCCL kernel time that ran while compute ran too.
"""

import argparse
import gzip
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# First match wins: cuDNN's attention kernels contain "gemm"-like names, and TE's cast kernels mention "transpose".
KINDS = (
    ("nccl", re.compile(r"nccl", re.IGNORECASE)),
    ("attention", re.compile(r"sdpa|fmha|flash|attn", re.IGNORECASE)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|cublas", re.IGNORECASE)),
    ("casts, amax, FP8 quantize", re.compile(r"amax|quantiz|cast|scale_from|fp8", re.IGNORECASE)),
    ("optimizer", re.compile(r"multi_tensor|adam", re.IGNORECASE)),
    ("norm", re.compile(r"norm", re.IGNORECASE)),
)
OTHER = "other elementwise"


@dataclass(frozen=True)
class Kernel:
    name: str
    start_us: float
    end_us: float

    @property
    def kind(self) -> str:
        return next((kind for kind, pattern in KINDS if pattern.search(self.name)), OTHER)


def load_kernels(trace: Path) -> list[Kernel]:
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    return [
        Kernel(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") == "kernel" and e.get("ph") == "X"
    ]


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def covered(interval: tuple[float, float], spans: list[tuple[float, float]]) -> float:
    """Length of `interval` that lies inside the disjoint, sorted `spans`."""
    start, end = interval
    return sum(max(0.0, min(end, s_end) - max(start, s_start)) for s_start, s_end in spans)


def breakdown(kernels: list[Kernel]) -> dict:
    if not kernels:
        raise ValueError("the trace has no GPU kernels: was it written by the PyTorch profiler with CUDA activities?")
    span_us = max(k.end_us for k in kernels) - min(k.start_us for k in kernels)
    by_kind: dict[str, float] = {}
    for kernel in kernels:
        by_kind[kernel.kind] = by_kind.get(kernel.kind, 0.0) + kernel.end_us - kernel.start_us
    compute = union((k.start_us, k.end_us) for k in kernels if k.kind != "nccl")
    busy_us = sum(end - start for start, end in compute)
    nccl = union((k.start_us, k.end_us) for k in kernels if k.kind == "nccl")
    hidden_us = sum(covered(interval, compute) for interval in nccl)
    nccl_us = sum(end - start for start, end in nccl)
    return {
        "span_ms": round(span_us / 1000, 1),
        "kernel_ms": {kind: round(us / 1000, 1) for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "compute_busy_ms": round(busy_us / 1000, 1),
        "idle_ms": round((span_us - busy_us) / 1000, 1),
        "nccl_hidden_share": round(hidden_us / nccl_us, 3) if nccl_us else None,
    }


def markdown(result: dict) -> str:
    span = result["span_ms"]
    lines = [f"Traced span: {span} ms (first kernel start to last kernel end).", "", "| kind | ms | share of span |"]
    lines.append("|---|---|---|")
    for kind, ms in result["kernel_ms"].items():
        lines.append(f"| {kind} | {ms} | {ms / span:.1%} |")
    lines.append(f"| no compute kernel running (idle) | {result['idle_ms']} | {result['idle_ms'] / span:.1%} |")
    lines += ["", f"NCCL hidden under compute: {result['nccl_hidden_share']}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path, help="rank-N.json.gz from Megatron Bridge's PyTorch profiler")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    result = breakdown(load_kernels(args.trace))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result), end="")


if __name__ == "__main__":
    main()
