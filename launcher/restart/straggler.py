"""Straggler detection made visible: RUN_DIR/stragglers.log and a console line a straggler (docs/failures.md)."""

import logging
import re
from pathlib import Path

from megatron.bridge.training.config import NVRxStragglerDetectionConfig

from launcher.restart.log import say

STRAGGLER = re.compile(r"StragglerId\(rank=(?P<rank>\d+), node='(?P<node>[^']*)'\)")
STOPPING = "Detected stragglers. Training should be stopped."
LOG_FILE = "stragglers.log"


class StragglerLog(logging.Handler):
    def __init__(self, run_dir: Path) -> None:
        super().__init__(level=logging.INFO)
        self.path = run_dir / LOG_FILE
        self.found: dict[int, str] = {}  # rank -> host

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as log:
            log.write(f"{self.format(record)}\n")
        if "STRAGGLER DETECTION WARNING" in message:
            kind = "relative score" if "relative" in message else "individual score"
            for found in STRAGGLER.finditer(message):
                self.found[int(found["rank"])] = found["node"]
                say(f"straggler ({kind} below threshold): rank {found['rank']} on {found['node']} ({self.path})")
        elif message.startswith(STOPPING):
            named = ", ".join(f"rank {rank} on {host}" for rank, host in sorted(self.found.items()))
            say(f"training stops (nvrx_straggler.stop_if_detected=true): straggler(s) {named or 'unnamed'}")


def install(config: NVRxStragglerDetectionConfig | None, run_dir: Path) -> None:
    if config is None or not config.enabled:
        return
    handler = StragglerLog(run_dir)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger = logging.getLogger(config.logger_name)
    logger.setLevel(logging.INFO)  # the scores are INFO records
    logger.addHandler(handler)
