"""The program every rank of srun.sh's health check runs, at the path its launch command names: health/check.py."""

import runpy
from pathlib import Path

runpy.run_path(str(Path(__file__).with_name("health") / "check.py"), run_name="__main__")
