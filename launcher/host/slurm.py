"""What the launching host asks SLURM and the network, the master address among it (docs/launch.md)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

from launcher.errors import say

IPV4 = re.compile(r"[0-9]+(\.[0-9]+){3}")


def output(command: list[str]) -> str:
    """COMMAND's stdout; empty when it fails."""
    try:
        return subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def config(name: str) -> str | None:
    """The value of NAME in `scontrol show config`; None without one."""
    for line in output(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            return value.strip()
    return None


def job_state(job: str) -> str:
    found = re.search(r" JobState=([^ ]*)", output(["scontrol", "show", "job", "--oneliner", job]))
    return found.group(1) if found and found.group(1) else "no longer known to SLURM"


def gres_gpus_per_node(job: str) -> str:
    """The GPUs a node JOB asked for with --gres=gpu[:TYPE]:N, from its TresPerNode; empty without."""
    tres = re.search(r" TresPerNode=(\S*)", output(["scontrol", "show", "job", "--oneliner", job]))
    gpus = re.search(r"gres[:/]gpu(?::[^:,=]+)?[:=]([0-9]+)", tres.group(1)) if tres else None
    return gpus.group(1) if gpus else ""


def launch_step(job_id: str, step_name: str) -> str:
    """JOB.STEP of the launch's srun step; empty before it exists."""
    out = output(["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i %j"])
    return next((words[0] for words in map(str.split, out.splitlines()) if words[1:2] == [step_name]), "")


def node_address(host: str) -> str:
    """An address of HOST that the other nodes reach; empty when its name gives only loopback."""
    found = re.search(r" NodeAddr=([^ ]*)", output(["scontrol", "show", "node", "--oneliner", host]))
    address = found.group(1) if found and found.group(1) else host
    if IPV4.fullmatch(address):
        return address
    try:
        infos = socket.getaddrinfo(address, None, socket.AF_INET, flags=socket.AI_ADDRCONFIG)
    except OSError:
        return ""
    return next((str(info[4][0]) for info in infos if not str(info[4][0]).startswith("127.")), "")


def address_toward(first: str, second: str) -> str:
    """On FIRST itself: the source address of its route to SECOND; empty elsewhere or without a route."""
    me = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    if me.partition(".")[0] != first.partition(".")[0] or shutil.which("ip") is None:
        return ""
    peer = node_address(second)
    route = output(["ip", "-o", "route", "get", peer]) if peer else ""
    address, device = re.search(r" src ([0-9.]*)", route), re.search(r" dev ([^ ]*)", route)
    if not address or not address.group(1):
        return ""
    say(
        f"srun.sh: {first}'s name gives no address but loopback here; MASTER_ADDR={address.group(1)}, the address of"
        f" {device.group(1) if device else ''}, which routes to {second} ({peer})"
    )
    return address.group(1)


def master_address(hosts: list[str]) -> str:
    """The rendezvous address among HOSTS (the first two of the job's); empty without one."""
    address = node_address(hosts[0])
    if len(hosts) == 1:
        return address or hosts[0]
    return address or address_toward(hosts[0], hosts[1])
