"""Which mount holds a path: SRUNSH_MOUNT's entries, and this host's for SRUNSH_COMPILE_CACHE (docs/launch.md)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from launcher.errors import UsageError, q

ESCAPED = re.compile(r"\\([0-7]{3})")  # the kernel writes space, tab, newline and backslash in a path as \ooo
# Kernel names (the third field of /proc/self/mounts) of file systems that many hosts mount at once.
SHARED_TYPES = frozenset(
    "nfs nfs4 lustre cifs smb3 smbfs gpfs beegfs ceph glusterfs ocfs2 gfs2 afs 9p pvfs2 orangefs wekafs panfs virtiofs"
    " fuse.glusterfs fuse.sshfs fuse.s3fs fuse.juicefs fuse.mountpoint-s3 fuse.gcsfuse fuse.rclone fuse.weka"
    " fuse.cephfs fuse.ceph-fuse fuse.lustre fuse.alluxio-fuse".split()
)


def holds(point: str, path: str) -> bool:
    """Whether the mount at POINT holds PATH (both absolute, symlinks resolved)."""
    return point in ("/", path) or path.startswith(point.rstrip("/") + "/")


@dataclasses.dataclass
class Mount:
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
    """An SRUNSH_MOUNT entry's SRC, DST and FLAGS, and whether more fields follow, as bash's read splits it."""
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
    """The file system type holding PATH, or to hold it: the longest mount point above it, the last mounted there."""
    found, depth = "", -1
    for point, kind in table:
        if holds(point, path) and len(point) >= depth:
            found, depth = kind, len(point)
    return found


def shared_file_system(directory: str, mounts_text: str) -> str:
    """The shared file system type DIRECTORY is on, as MOUNTS_TEXT (/proc/self/mounts) places it; "" on a local disk."""
    kind = file_system_type(os.path.realpath(directory), mount_table(mounts_text))
    return kind if kind in SHARED_TYPES else ""


def node_directory(name: str, value: str, why: str) -> str:
    """The directory of knob NAME on every node's own disk ("" when off), refused where the nodes share it."""
    if value == "off":
        return ""
    if shared := shared_file_system(value, Path("/proc/self/mounts").read_text()):
        raise UsageError(
            f"{name}={q(value)} is on {shared}, a file system the nodes share, where {why}: name a directory on every"
            f" node's own disk, e.g. {name}=/var/tmp, or off"
        )
    return os.path.normpath(value)
