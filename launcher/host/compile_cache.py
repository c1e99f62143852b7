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
from pathlib import Path

from launcher.errors import UsageError, q
from launcher.host.mounts import file_system_type, mount_table

# Kernel names (the third field of /proc/self/mounts) of file systems that many hosts mount at once.
SHARED_TYPES = frozenset(
    "nfs nfs4 lustre cifs smb3 smbfs gpfs beegfs ceph glusterfs ocfs2 gfs2 afs 9p pvfs2 orangefs wekafs panfs virtiofs"
    " fuse.glusterfs fuse.sshfs fuse.s3fs fuse.juicefs fuse.mountpoint-s3 fuse.gcsfuse fuse.rclone fuse.weka"
    " fuse.cephfs fuse.ceph-fuse fuse.lustre fuse.alluxio-fuse".split()
)


def shared_file_system(directory: str, mounts_text: str) -> str:
    """The type of the file system the nodes share that DIRECTORY is on, as MOUNTS_TEXT (this host's
    /proc/self/mounts) places it; "" when it is on a disk of this host's own."""
    kind = file_system_type(os.path.realpath(directory), mount_table(mounts_text))
    return kind if kind in SHARED_TYPES else ""


def directory(value: str) -> str:
    """SRUNSH_COMPILE_CACHE's directory ("" when off), refused where the nodes share it."""
    if value == "off":
        return ""
    shared = shared_file_system(value, Path("/proc/self/mounts").read_text())
    if shared:
        raise UsageError(
            f"SRUNSH_COMPILE_CACHE={q(value)} is on {shared}, a file system the nodes share, where Triton's cache"
            " writes race across nodes and fail ranks: name a directory on every node's own disk, e.g."
            " SRUNSH_COMPILE_CACHE=/var/tmp, or off"
        )
    return os.path.normpath(value)
