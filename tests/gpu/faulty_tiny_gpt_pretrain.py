"""Test-only recipe: the tiny recipe, with a fault in one rank's training step, for the GPU tests of in-process restart
and straggler detection (tests/gpu/test_inprocess_restart.py). Not a product recipe: it lives with the tests.

fault="raise": rank `fault_rank` raises RuntimeError in step `fault_at_step`, once per process (the restart that
follows trains on). fault="kill": it SIGKILLs itself there. fault="load": from that step on, a thread of the rank
keeps its GPU busy on a stream of its own (a matmul loop), so that the rank's kernels run slower, as on a throttled
GPU. It wraps, in megatron-bridge 0.6.2, `megatron.bridge.training.train.train_step`, which train() looks up when
training starts, after configure().
"""

import os
import signal
import threading

import megatron.bridge.training.train as upstream_train
import torch
from megatron.bridge.training.config import ConfigContainer

from recipes.tiny_gpt_pretrain import configure as tiny_configure


# The load: a matmul loop on a CUDA stream of the rank's own, in a thread of the rank. Its kernels run beside the
# rank's and take SMs from them, so the rank's kernels themselves take longer, which is what NVRx's GPU scores time
# (CUPTI kernel durations). A second process on the same GPU does not do that: the GPU time-slices between processes,
# and on the H200 it made steps 32% longer (310 to 410 ms) with every individual score at 0.986-1.0.
def load_the_gpu(device: int) -> None:
    torch.cuda.set_device(device)  # a new thread starts on device 0
    with torch.cuda.stream(torch.cuda.Stream()):
        x = torch.randn(8192, 8192, device="cuda")
        while True:
            x = x @ x
            x /= x.norm()


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
            device = torch.cuda.current_device()
            threading.Thread(
                target=load_the_gpu, args=(device,), name="faulty_tiny_gpt_pretrain load", daemon=True
            ).start()
        return original(*args, **kwargs)

    upstream_train.train_step = faulty_train_step


def configure(fault: str = "raise", fault_rank: int = 1, fault_at_step: int = 12) -> ConfigContainer:
    inject(fault, fault_rank, fault_at_step)
    return tiny_configure()
