"""Which cuDNN a process of the device's stack runs, and that Transformer Engine's fused (cuDNN) attention works with
it: one forward and backward of DotProductAttention in BF16, then the version torch reports and the cuDNN files the
process mapped. Prints one JSON line for the environment it runs in, or for each lever arm named, in that arm's
environment (bench/levers.py):

    python3 -m bench.cudnn_check ours cudnn_9_19 cudnn_9_27
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformer_engine.pytorch import DotProductAttention


def fused_attention_step() -> float:
    """Forward and backward through cuDNN's fused attention: sequence 2048, 8 heads of 128, causal."""
    attention = DotProductAttention(8, 128, attn_mask_type="causal")
    q, k, v = (torch.randn(2048, 2, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = attention(q, k, v)
    out.float().sum().backward()
    torch.cuda.synchronize()
    return float(q.grad.float().abs().sum())


def mapped_cudnn_files() -> list[str]:
    paths = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libcudnn" in line}
    return sorted(paths)


def check_here() -> None:
    os.environ.update(NVTE_FUSED_ATTN="1", NVTE_FLASH_ATTN="0")  # before the first attention call, which reads them
    gradient = fused_attention_step()
    report = {
        "LD_PRELOAD": os.environ.get("LD_PRELOAD", ""),
        "CUDNN_PATH": os.environ.get("CUDNN_PATH", ""),
        # torch.backends.cudnn.version() raises when the two differ.
        "torch_cudnn_compiled": torch._C._cudnn.getCompileVersion(),
        "torch_cudnn_runtime": torch._C._cudnn.getRuntimeVersion(),
        "gradient_sum": gradient,
        "mapped": mapped_cudnn_files(),
    }
    print(json.dumps(report))


def check_arms(names: list[str]) -> None:
    from bench import levers

    for name in names:
        environment = os.environ | dict(levers.CHANGES[name].env)
        print(name, flush=True)
        subprocess.run([sys.executable, "-m", "bench.cudnn_check"], env=environment, check=True, timeout=120)


if __name__ == "__main__":
    check_arms(sys.argv[1:]) if sys.argv[1:] else check_here()
