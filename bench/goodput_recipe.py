"""Bench-only recipe (bench/bench_goodput.py): recipes/llama3_8b_h200_fp8cs_pretrain.py, and SIGUSR1 to the rank
raised as RuntimeError("bench fault") at the start of its next training step, by wrapping Megatron Bridge 0.6.2's
`megatron.bridge.training.train.train_step`. bench/README.md."""

import os
import signal
import time
from collections.abc import Callable
from typing import Any

PENDING = {"fault": False}


def fault(*_: object) -> None:
    """SIGUSR1's handler: the fault is raised at the next step's start. Raised inside the step, in the FP8 recipe, it
    left Transformer Engine's FP8 state behind and every restart failed an assertion (bench/results/goodput.md)."""
    PENDING["fault"] = True


def with_faults(train_step: Callable[..., Any]) -> Callable[..., Any]:
    def train_step_with_faults(*args: object, **kwargs: object) -> Any:
        if PENDING["fault"]:
            PENDING["fault"] = False
            os.write(1, f"goodput_recipe: bench fault at {time.time():.3f}\n".encode())
            raise RuntimeError("bench fault")
        return train_step(*args, **kwargs)

    return train_step_with_faults


def configure() -> Any:  # a ConfigContainer
    # The training stack is imported here, so that the fault's machinery above imports without it (its tests).
    import megatron.bridge.training.train as upstream_train

    from recipes import llama3_8b_h200_fp8cs_pretrain

    signal.signal(signal.SIGUSR1, fault)
    upstream_train.train_step = with_faults(upstream_train.train_step)
    # One GPU needs no FSDP, and local checkpoints hold Megatron Core's sharded state (torch_dist): both arms alike.
    return llama3_8b_h200_fp8cs_pretrain.configure(use_megatron_fsdp=False)
