"""Which mount holds a path: among SRUNSH_MOUNT's entries (pyxis's SRC:DST[:FLAGS], what the container sees), and in
this host's own mount table (/proc/self/mounts, which file system a directory is on)."""

from __future__ import annotations

import dataclasses
import os
import re

ESCAPED = re.compile(r"\\([0-7]{3})")  # the kernel writes space, tab, newline and backslash in a path as \ooo


def holds(point: str, path: str) -> bool:
    """Whether the mount at POINT holds PATH (both absolute, symlinks resolved)."""
    return point in ("/", path) or path.startswith(point.rstrip("/") + "/")


@dataclasses.dataclass
class Mount:
    """One SRUNSH_MOUNT entry."""

    src: str
    dst: str
    flags: str

    @property
    def holds_paths(self) -> bool:
        return self.src not in ("tmpfs", "umount")

    @property
    def real(self) -> str:
        return os.path.realpath(self.src)


def split_mount(entry: str) -> tuple[str, str, str, bool]:
    """An SRUNSH_MOUNT entry's SRC, DST and FLAGS, and whether more fields follow, as bash's read splits it (IFS=:):
    a ":" that ends the entry ends its last field."""
    src, dst, flags, rest = [*entry.split(":", 3), "", "", ""][:4]
    return src, dst, flags, rest not in ("", ":")


def mount_of(mounts: list[Mount], path: str) -> Mount | None:
    """The SRUNSH_MOUNT entry whose source holds PATH, the longest such (the first of equals)."""
    holding = [mount for mount in mounts if mount.holds_paths and holds(mount.real, path)]
    return max(holding, key=lambda mount: len(mount.real), default=None)


def container_path(mounts: list[Mount], path: str) -> str | None:
    """PATH's name inside the container; None when no SRUNSH_MOUNT entry holds it."""
    mount = mount_of(mounts, path)
    if mount is None:
        return None
    return mount.dst.rstrip("/") + path if mount.real == "/" else mount.dst + path[len(mount.real) :]


def mount_table(text: str) -> list[tuple[str, str]]:
    """Each line of /proc/self/mounts TEXT as (mount point, file system type), in the kernel's order."""
    table = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) >= 3:
            table.append((ESCAPED.sub(lambda m: chr(int(m.group(1), 8)), fields[1]), fields[2]))
    return table


def file_system_type(path: str, table: list[tuple[str, str]]) -> str:
    """The type of the file system that holds PATH (absolute, symlinks resolved), or would hold it once created:
    the mount at the longest mount point above it, the last one mounted there."""
    found, depth = "", -1
    for point, kind in table:
        if holds(point, path) and len(point) >= depth:
            found, depth = kind, len(point)
    return found
