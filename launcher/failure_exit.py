"""A rank whose training raised exits within GRACE_S, also when Megatron Bridge's clean-up after the error hangs.

When training raises, Megatron Bridge 0.6.2's pretrain() logs the error (logger.exception, in its pretrain module)
and then aborts the process groups before it re-raises. On the H200 that abort never returned (a CUDA-graph capture
error under Megatron FSDP, bench/results/per-step-ab.md): the rank neither trained nor exited, so srun did not stop
the other ranks, and the job sat until srun.sh's hang watch (SRUNSH_HANG_TIMEOUT_S, 300 s or more). The error's log
record starts a timer instead; when it runs out the rank says so and exits 1, and srun.sh reports it as the rank that
failed first, with the error at the end of its log.
"""

import logging
import os
import sys
import threading

PRETRAIN_LOGGER = "megatron.bridge.training.pretrain"  # logs only on the failure path, at ERROR
GRACE_S = 60.0  # an abort of healthy NCCL communicators and of async checkpointing takes seconds


class ExitAfterFailure(logging.Handler):
    """On the first ERROR record, a daemon timer that ends the process unless it has ended by itself."""

    def __init__(self, grace_s: float) -> None:
        super().__init__(level=logging.ERROR)
        self.grace_s = grace_s
        self.timer: threading.Timer | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.timer is None:
            self.timer = threading.Timer(self.grace_s, self.exit_now)
            self.timer.daemon = True
            self.timer.start()

    def exit_now(self) -> None:
        print(
            f"entrypoint.py: Megatron Bridge's clean-up after the error above did not return in {self.grace_s:g} s:"
            " the rank exits 1",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)


def install(grace_s: float = GRACE_S) -> None:
    logging.getLogger(PRETRAIN_LOGGER).addHandler(ExitAfterFailure(grace_s))
