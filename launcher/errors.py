"""The one exception type a user sees, how ranks and srun.sh say it, and what srun.sh handed a rank (docs/launch.md)."""

import os
import shlex
import sys
from pathlib import Path


class UsageError(Exception):
    """Bad input; the message names the problem and the fix."""


def first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def report(error: UsageError) -> None:
    """One line on stderr; a rank srun.sh started leaves it in logs/usage-error, the job's first only, for srun.sh."""
    line = f"entrypoint.py: error: {error}\n"
    if "RANK" in os.environ and "RUN_DIR" in os.environ:
        try:
            with open(Path(os.environ["RUN_DIR"]) / "logs" / "usage-error", "x") as first:
                first.write(line)
            return
        except FileExistsError:
            return
        except OSError:
            pass  # no run directory to leave it in: say it here
    sys.stderr.write(line)


def from_srun_sh(name: str) -> str | None:
    """NAME as srun.sh set it for the rank it started (it gives every rank RUN_DIR); None in any other process."""
    return os.environ.get(name) if "RUN_DIR" in os.environ else None


def stack_fix() -> str:
    """How a rank's Python gets what the pinned stack holds: from the image srun.sh ran it in, or by an install."""
    image = from_srun_sh("SRUNSH_SQSH")  # set for the ranks srun.sh runs in its container
    if image:
        return f"the image {image} lacks it: rebuild it with 'make build', or point SRUNSH_SQSH at an image that has it"
    return f"install it with PYTHON={sys.executable} bash tools/install_python_stack.sh, or set SRUNSH_PYTHON"


def say(line: str) -> None:
    """A line of srun.sh's on stderr, as bytes: a path that is no UTF-8 keeps its own."""
    sys.stderr.buffer.write(os.fsencode(f"{line}\n"))
    sys.stderr.flush()


def q(value: str) -> str:
    """VALUE as one shell word on one line: shlex's quoting, or bash's $'...' where a character does not print."""
    if value.isprintable():
        return shlex.quote(value)
    return "$'" + "".join(map(ansi_c_char, value)) + "'"


def ansi_c_char(char: str) -> str:
    """CHAR inside $'...': itself where it prints, else its bytes as \\xHH (a lone surrogate as its byte)."""
    if char.isprintable() and char not in "\\'":
        return char
    return "".join(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape"))
