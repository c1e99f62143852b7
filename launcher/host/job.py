"""The job a launch runs as: its nodes, its run (id, folder, lock), its rendezvous address and port (docs/launch.md)."""

from __future__ import annotations

import fcntl
import os
import time
import zlib

from launcher.errors import UsageError, q, say
from launcher.host.plan import LaunchPlan
from launcher.host.preflight import Knobs
from launcher.host.slurm import master_address, output
from launcher.run_files import private_files, read_text

PORT_BASE, PORT_SPAN = 20000, 12768  # below Linux's ephemeral range (32768+)


def resolve_hosts(local: bool, master_addr: str) -> tuple[list[str], str]:
    """The nodes, and the first node's address the others reach (its NodeAddr, its name, or its route)."""
    node_list = os.environ.get("SLURM_JOB_NODELIST", "")
    if local:
        return [os.uname().nodename], master_addr or "127.0.0.1"
    if not node_list:
        return ["NODE1"], master_addr or "NODE1"
    hosts = output(["scontrol", "show", "hostnames", node_list]).splitlines()
    if not hosts:
        raise UsageError(f"scontrol could not expand SLURM_JOB_NODELIST={q(node_list)}: check the SLURM client setup")
    master_addr = master_addr or master_address(hosts[:2])
    if not master_addr:
        raise UsageError(
            f"no address of {hosts[0]} that other nodes reach (scontrol's NodeAddr, getent ahostsv4, ip route):"
            " set MASTER_ADDR to its IP address"
        )
    return hosts, master_addr


def run_port(run_root: str, run_base: str, taken: int) -> str:
    """20000-32767, from the run's folder (RUN_BASE: its id before -N) and the ids TAKEN before (docs/launch.md)."""
    checksum = zlib.crc32(os.fsencode(f"{run_root}/{run_base}"))
    return str(PORT_BASE + (checksum + taken) % PORT_SPAN)


def unwritable(path: str, error: OSError) -> UsageError:
    """The refusal of a run folder that could not be created, with the error as the shell's tools word it."""
    return UsageError(
        f"cannot create the run folder {q(path)} ({error.strerror or error}): set SRUNSH_OUTPUT_ROOT to a folder you"
        " can write"
    )


def claim_run_dir(plan: LaunchPlan, new_run: bool) -> int:
    """The run's folder, taken and locked; how many ids of this second were taken (its id then gets -N)."""
    base, taken = plan.run_id, 0
    with private_files():
        try:
            os.makedirs(plan.run_root, exist_ok=True)
        except OSError as error:
            raise unwritable(plan.run_root, error) from None
        while new_run:
            try:
                os.mkdir(plan.run_dir)
                break
            except OSError as error:
                if not os.path.lexists(plan.run_dir):
                    raise unwritable(plan.run_dir, error) from None
            taken += 1
            plan.run_id = f"{base}-{taken + 1}"
        os.makedirs(f"{plan.run_dir}/logs", exist_ok=True)
    lock_run(plan.run_id, f"{plan.run_dir}/.lock")
    return taken


def lock_run(run_id: str, path: str) -> None:
    """Holds PATH's lock until this process and its children end (they inherit its descriptor); notes the holder."""
    with private_files():
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    os.set_inheritable(fd, True)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        who = read_text(path).rstrip("\n")
        raise UsageError(
            f"run {run_id} is still running ({who}): wait for it to end, or leave SRUNSH_RUN_ID unset for a new run"
        ) from None
    except OSError as error:
        say(
            f"srun.sh: {path} cannot be locked on this file system ({error.strerror}), so a"
            f" second launch of run {run_id} is not refused while this one runs"
        )
    job_id = os.environ.get("SLURM_JOB_ID")
    with open(path, "w") as holder:
        holder.write(f"srun.sh pid {os.getpid()} on {os.uname().nodename}{f', job {job_id}' if job_id else ''}\n")


def resolve_job(plan: LaunchPlan, knobs: Knobs) -> bool:
    """The job facts every rank shares into PLAN (run, nodes, MASTER_ADDR); whether it resumes a run. Writes nothing."""
    stamp = time.strftime("%Y%m%d-%H%M%S")  # a new run's id: <job id>-<date>-<time>, or local-<date>-<time>-<pid>
    new = f"local-{stamp}-{os.getpid()}" if plan.local else f"{os.environ.get('SLURM_JOB_ID') or 'JOBID'}-{stamp}"
    plan.run_id = knobs["SRUNSH_RUN_ID"] or new
    plan.hosts, plan.master_addr = resolve_hosts(plan.local, knobs["MASTER_ADDR"])
    return bool(knobs["SRUNSH_RUN_ID"]) and os.path.isdir(plan.run_dir)


def take_run(plan: LaunchPlan, knobs: Knobs) -> None:
    """The run's folder taken, unless it is a dry run (a new run's id then gets -N where it must), and MASTER_PORT."""
    base, taken = plan.run_id, 0
    if not plan.dry_run:
        taken = claim_run_dir(plan, new_run=not knobs["SRUNSH_RUN_ID"])
    plan.master_port = knobs["MASTER_PORT"] or run_port(plan.run_root, base, taken)
