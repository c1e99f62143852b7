"""The job a launch runs as: its nodes, its run (id, folder, lock) and its rendezvous address and port.

A new run takes its id by creating its folder, which is atomic on shared file systems too, so launches started
together get ids of their own (the second in one second gets -2, the third -3). A launch holds its run's lock (flock)
while it and the processes it starts run, so a second launch of a run that is still running is refused instead of
resuming into the live run.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import subprocess
import sys
import time

from launcher.host.master_address import master_address
from launcher.host.plan import LaunchPlan
from launcher.host.preflight import BadInputError
from launcher.run_files import private_files
from launcher.shell_quote import q

PORT_BASE, PORT_SPAN = 20000, 12768  # below Linux's ephemeral range (32768+)


@dataclasses.dataclass
class Job:
    run_root: str  # RUN_DIR's parent as this host sees it
    run_id: str
    hosts: list[str]
    ranks_per_node: int
    master_addr: str = ""
    master_port: str = ""
    new_run: bool = True
    run_base: str = ""  # the id before a -N suffix, what the port is derived from
    taken: int = 0  # how many ids of this second were taken before this launch's
    resuming: bool = False
    lock_fd: int | None = None

    @property
    def run_dir(self) -> str:
        return f"{self.run_root}/{self.run_id}"

    @property
    def node_list(self) -> str:
        return ",".join(self.hosts)


def name_run(run_id: str, local: bool) -> tuple[str, bool]:
    """The run's id, and whether it is a new run: <job id>-<date>-<time>, or local-<date>-<time>-<pid>."""
    if run_id:
        return run_id, False
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if local:
        return f"local-{stamp}-{os.getpid()}", True
    return f"{os.environ.get('SLURM_JOB_ID') or 'JOBID'}-{stamp}", True


def slurm_hosts(node_list: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", node_list], stdout=subprocess.PIPE, check=False).stdout
    hosts = os.fsdecode(out).splitlines()
    if not hosts:
        raise BadInputError(
            f"scontrol could not expand SLURM_JOB_NODELIST={q(node_list)}: check the SLURM client setup"
        )
    return hosts


def resolve_hosts(job: Job, local: bool, master_addr: str) -> None:
    """The nodes, and the first node's address the others reach (its NodeAddr, its name, or its route)."""
    node_list = os.environ.get("SLURM_JOB_NODELIST", "")
    if local:
        job.hosts, job.master_addr = [os.uname().nodename], master_addr or "127.0.0.1"
    elif node_list:
        job.hosts = slurm_hosts(node_list)
        job.master_addr = master_addr or master_address(job.hosts[:2])
        if not job.master_addr:
            print(
                f"srun.sh: no address of {job.hosts[0]} that other nodes reach"
                " (scontrol's NodeAddr, getent ahostsv4, ip route): set MASTER_ADDR to its IP address",
                file=sys.stderr,
            )
            raise SystemExit(2)
    else:
        job.hosts, job.master_addr = ["NODE1"], master_addr or "NODE1"


def cksum(data: bytes) -> int:
    """POSIX cksum's CRC of DATA (the CRC-32 of the data and its length, most significant bit first)."""
    crc = 0
    length = len(data)
    tail = b""
    while length:
        tail += bytes([length & 0xFF])
        length >>= 8
    for byte in data + tail:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return ~crc & 0xFFFFFFFF


def run_port(job: Job) -> str:
    """20000-32767, derived from the run's folder, so that two runs on one node differ; launches that took their ids
    in the same second differ by how many were taken before."""
    checksum = cksum(os.fsencode(f"{job.run_root}/{job.run_base}\n"))
    return str(PORT_BASE + (checksum + job.taken) % PORT_SPAN)


def make_dir(path: str) -> str:
    """The error that creating PATH (mode 700) gave, as the shell's tools word it; empty on success."""
    try:
        with private_files():
            os.mkdir(path)
    except OSError as error:
        return error.strerror or str(error)
    return ""


def unwritable(path: str, why: str) -> BadInputError:
    return BadInputError(
        f"cannot create the run folder {q(path)} ({why}): set SRUNSH_OUTPUT_ROOT to a folder you can write"
    )


def claim_run_dir(job: Job) -> int:
    """The run's folder, taken, and its lock held; the lock's file descriptor."""
    try:
        with private_files():
            os.makedirs(job.run_root, exist_ok=True)
    except OSError as error:
        raise unwritable(job.run_root, error.strerror or str(error)) from None
    if job.new_run:
        while error := make_dir(job.run_dir):
            if not os.path.lexists(job.run_dir):
                raise unwritable(job.run_dir, error)
            job.taken += 1
            job.run_id = f"{job.run_base}-{job.taken + 1}"
    else:
        job.resuming = os.path.isdir(job.run_dir)
    with private_files():
        os.makedirs(f"{job.run_dir}/logs", exist_ok=True)
    return lock_run(job, f"{job.run_dir}/.lock")


def lock_run(job: Job, path: str) -> int:
    """Holds the lock on PATH until this process and those it starts have ended (they inherit it), and notes who
    holds it."""
    with private_files():
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.set_inheritable(fd, True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with open(path, errors="surrogateescape") as holder:
            who = holder.read().rstrip("\n")
        raise BadInputError(
            f"run {job.run_id} is still running ({who}): wait for it to end, or leave SRUNSH_RUN_ID unset for a new run"
        ) from None
    except OSError as error:
        print(
            f"srun.sh: {path} cannot be locked on this file system ({error.strerror}), so a"
            f" second launch of run {job.run_id} is not refused while this one runs",
            file=sys.stderr,
        )
    job_id = os.environ.get("SLURM_JOB_ID")
    with open(path, "w") as holder:
        holder.write(f"srun.sh pid {os.getpid()} on {os.uname().nodename}{f', job {job_id}' if job_id else ''}\n")
    return fd


def resolve_job(plan: LaunchPlan, knobs: dict[str, str]) -> Job:
    """Job facts every rank shares: the run, the nodes, MASTER_ADDR and MASTER_PORT."""
    run_id, new = name_run(knobs["SRUNSH_RUN_ID"], plan.local)
    job = Job(plan.run_root, run_id, [], plan.ranks_per_node, new_run=new, run_base=run_id)
    resolve_hosts(job, plan.local, knobs["MASTER_ADDR"])
    if not plan.dry_run:
        job.lock_fd = claim_run_dir(job)
    job.master_port = knobs["MASTER_PORT"] or run_port(job)
    return job
