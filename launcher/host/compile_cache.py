"""SRUNSH_COMPILE_CACHE, checked on the launching host: the node-local directory where every rank keeps its Triton and
TorchInductor caches from one launch to the next (launcher/rank/rank.sh names each rank's folder in it).

Without it a rank compiles its fused kernels again at every launch: enroot mounts a new tmpfs on the container's /tmp
at every start (its conf/mounts/10-system.fstab), where those caches live by default. On a file system the nodes
share (NFS, Lustre) the same caches fail a rank instead: Triton's cache writes race across nodes there (stale file
handles, EBUSY: triton-lang/triton#11512, pytorch/pytorch#173679). So a directory there is refused before anything
starts, as this host sees it; the nodes mount the same paths in a homogeneous cluster.
"""

from __future__ import annotations

import os
import re

# Kernel names (the third field of /proc/self/mounts) of file systems that many hosts mount at once.
SHARED_TYPES = frozenset(
    {
        *("nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "gpfs", "beegfs", "ceph", "glusterfs", "ocfs2", "gfs2"),
        *("afs", "9p", "pvfs2", "orangefs", "wekafs", "panfs", "virtiofs"),
        *("fuse.glusterfs", "fuse.sshfs", "fuse.s3fs", "fuse.juicefs", "fuse.mountpoint-s3", "fuse.gcsfuse"),
        *("fuse.rclone", "fuse.weka", "fuse.cephfs", "fuse.ceph-fuse", "fuse.lustre", "fuse.alluxio-fuse"),
    }
)
ESCAPED = re.compile(r"\\([0-7]{3})")  # the kernel writes space, tab, newline and backslash in a path as \ooo


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
        inside = point in ("/", path) or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= depth:
            found, depth = kind, len(point)
    return found


def shared_file_system(directory: str, mounts_text: str) -> str:
    """The type of the file system the nodes share that DIRECTORY is on, as MOUNTS_TEXT (this host's
    /proc/self/mounts) places it; "" when it is on a disk of this host's own."""
    kind = file_system_type(os.path.realpath(directory), mount_table(mounts_text))
    return kind if kind in SHARED_TYPES else ""
