"""Test-only recipe: the tiny recipe, with the GPU of one rank stalled from one step on, for the GPU test of srun.sh's
hang report (tests/gpu/test_health_and_hang.py). Not a product recipe: it lives with the test that uses it.

At step `stall_at_step`, rank `stall_rank` queues a kernel that spins for hours (torch.cuda._sleep) ahead of the
step's work, as a hung kernel or a failing GPU would: that rank's CPU then blocks at its next synchronization, in
native code, and the other ranks wait in their next NCCL collective. It wraps, in megatron-bridge 0.6.2,
`megatron.bridge.training.train.train_step`, which train() looks up when training starts, after configure() ran.
"""

import megatron.bridge.training.train as upstream_train
import torch
from megatron.bridge.training.config import ConfigContainer

from recipes.tiny_gpt_pretrain import configure as tiny_configure

SPIN_CYCLES = 1 << 45  # about five hours at 2 GHz


def stall(rank: int, at_step: int) -> None:
    original = upstream_train.train_step

    def stalled_train_step(*args: object, **kwargs: object) -> object:
        state = kwargs.get("global_state") or args[5]
        if torch.distributed.get_rank() == rank and state.train_state.step + 1 == at_step:
            print(f"stalled_tiny_gpt_pretrain: rank {rank}'s GPU spins from step {at_step} on", flush=True)
            torch.cuda._sleep(SPIN_CYCLES)
        return original(*args, **kwargs)

    upstream_train.train_step = stalled_train_step


def configure(stall_rank: int = 1, stall_at_step: int = 5) -> ConfigContainer:
    stall(stall_rank, stall_at_step)
    return tiny_configure()
