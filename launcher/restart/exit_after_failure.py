"""A rank whose training raised exits within GRACE_S, even if the clean-up after the error hangs (docs/failures.md)."""

import logging
import os
import sys
import threading

from launcher.restart.log import say

PRETRAIN_LOGGER = "megatron.bridge.training.pretrain"  # logs only on the failure path, at ERROR
GRACE_S = 60.0  # an abort of healthy NCCL communicators and of async checkpointing takes seconds
EXIT_GRACE_S = 10.0  # after training's own exit: its checkpoint is written, only the process groups are left


class ExitAfterFailure(logging.Handler):
    """On the first ERROR record, a daemon timer that ends the process unless it has ended by itself."""

    def __init__(self, grace_s: float, exit_grace_s: float) -> None:
        super().__init__(level=logging.ERROR)
        self.grace_s, self.exit_grace_s = grace_s, exit_grace_s
        self.timer: threading.Timer | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.timer is not None:
            return
        status = chosen_exit_status(record)
        if status is None:
            grace, status = self.grace_s, 1
            line = f"Megatron Bridge's clean-up after the error above did not return in {grace:g} s: the rank exits 1"
        else:
            say(f"training ended by its own sys.exit({status}); Megatron Bridge logs that as"
                ' "Pretrain failed": it is not one', sys.stderr)  # fmt: skip
            grace = self.exit_grace_s
            line = (f"Megatron Bridge's clean-up after training's exit did not return in {grace:g} s: the rank exits"
                    f" {status}, as training chose")  # fmt: skip
        self.timer = threading.Timer(grace, leave, args=(status, line))
        self.timer.daemon = True
        self.timer.start()


def leave(status: int, line: str) -> None:
    """End the process now, whatever its threads do, after saying why."""
    say(line, sys.stderr)
    os._exit(status)


def chosen_exit_status(record: logging.LogRecord) -> int | None:
    """The status a SystemExit in the record asks for (sys.exit's rules); None for any other error."""
    error = record.exc_info[1] if record.exc_info else None
    if not isinstance(error, SystemExit):
        return None
    if error.code is None or isinstance(error.code, int):
        return error.code or 0
    return 1  # sys.exit("message") prints the message and exits 1


def install(grace_s: float = GRACE_S, exit_grace_s: float = EXIT_GRACE_S) -> None:
    logging.getLogger(PRETRAIN_LOGGER).addHandler(ExitAfterFailure(grace_s, exit_grace_s))
