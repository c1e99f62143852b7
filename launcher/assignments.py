"""The launch's arguments as assignments (NAME=VALUE, ~NAME), read alike on the launching host and every rank."""

import dataclasses

from launcher.errors import UsageError, q


@dataclasses.dataclass(frozen=True)
class Assignment:
    """One argument as given (text): NAME=VALUE split at its first `=`, or ~NAME with value None."""

    name: str
    value: str | None
    text: str


class NotAssignmentError(UsageError, ValueError):
    """An argument that is neither NAME=VALUE nor ~NAME; the message is srun.sh's line for it."""

    def __init__(self, text: str) -> None:
        super().__init__(f"argument {q(text)} is not NAME=VALUE: write it as NAME=VALUE, e.g. train.train_iters=1000")
        self.text = text


def assignment(text: str) -> Assignment:
    """TEXT as an assignment; NotAssignmentError for any other shape."""
    if text.startswith("~") and len(text) > 1:
        return Assignment(text[1:].partition("=")[0], None, text)
    name, equals, value = text.partition("=")
    if not (name and equals):
        raise NotAssignmentError(text)
    return Assignment(name, value, text)


def split(args: list[str]) -> list[Assignment]:
    """Every argument as an assignment, in order; NotAssignmentError for the first that is none."""
    return [assignment(text) for text in args]


def section(assignments: list[Assignment], prefix: str) -> dict[str, str]:
    """The values of the PREFIX.FIELD=VALUE assignments by FIELD, the last one winning (docs/launch.md)."""
    found: dict[str, str] = {}
    for given in assignments:
        if given.text in (f"~{prefix}", f"{prefix}=null"):
            found.clear()
        elif given.value is not None and given.name.startswith(f"{prefix}."):
            found[given.name.removeprefix(f"{prefix}.")] = given.value.strip()
    return found
