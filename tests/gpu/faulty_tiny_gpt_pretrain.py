"""Test-only recipe: the tiny recipe, with a fault in one rank's training step, for the GPU tests of in-process restart
and straggler detection (tests/gpu/test_inprocess_restart.py). Not a product recipe: it lives with the tests.

fault="raise": rank `fault_rank` raises RuntimeError in step `fault_at_step`, once per process (the restart that
follows trains on). fault="kill": it SIGKILLs itself there. fault="load": from that step on, a second process on the
same GPU keeps it busy (a matmul loop), as a co-tenant or a throttled GPU would slow it. It wraps, in megatron-bridge
0.6.2, `megatron.bridge.training.train.train_step`, which train() looks up when training starts, after configure().
"""

import os
import signal
import subprocess
import sys

import megatron.bridge.training.train as upstream_train
import torch
from megatron.bridge.training.config import ConfigContainer

from recipes.tiny_gpt_pretrain import configure as tiny_configure

LOAD = "import torch\nx = torch.randn(8192, 8192, device='cuda')\nwhile True:\n    x = x @ x\n    x /= x.norm()\n"
DONE: set[str] = set()


def inject(fault: str, rank: int, at_step: int) -> None:
    original = upstream_train.train_step

    def faulty_train_step(*args: object, **kwargs: object) -> object:
        state = kwargs.get("global_state") or args[5]
        if torch.distributed.get_rank() == rank and state.train_state.step + 1 == at_step and fault not in DONE:
            DONE.add(fault)
            print(f"faulty_tiny_gpt_pretrain: rank {rank}: {fault} at step {at_step}", flush=True)
            if fault == "raise":
                raise RuntimeError(f"injected fault at step {at_step}")
            if fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            subprocess.Popen(
                [sys.executable, "-c", LOAD],
                env={**os.environ, "CUDA_VISIBLE_DEVICES": str(torch.cuda.current_device())},
                start_new_session=False,
            )
        return original(*args, **kwargs)

    upstream_train.train_step = faulty_train_step


def configure(fault: str = "raise", fault_rank: int = 1, fault_at_step: int = 12) -> ConfigContainer:
    inject(fault, fault_rank, fault_at_step)
    return tiny_configure()
