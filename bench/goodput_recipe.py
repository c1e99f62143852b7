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
    """SIGUSR1's handler: the fault is raised at the next step's start, outside any context manager a signal could
    interrupt before its clean-up is set up (Transformer Engine's autocast, Megatron's RNG tracker)."""
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
    cfg = llama3_8b_h200_fp8cs_pretrain.configure(use_megatron_fsdp=False)
    # Without FSDP, megatron-core 0.19.2's fused MLP (the TE op fuser) keeps the DDP parameter-gather hooks it saw at
    # step 1, none (Megatron Bridge removes them for that step): at step 3 an un-waited all-gather fails a bare
    # `assert self.param_gather_handle is None`, with or without a fault (the first run's AssertionError(), read from
    # the code, not yet seen in a traceback; fixed upstream by Megatron-LM PR #6132). No overlap: no hooks needed.
    cfg.ddp.overlap_param_gather = cfg.optimizer.overlap_param_gather = False
    return cfg
