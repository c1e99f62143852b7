"""The rendezvous address of a SLURM launch: an address of the job's first node that the other nodes reach.

`python3 master_address.py FIRST_NODE [SECOND_NODE]` prints it: SLURM's NodeAddr of the first node, or the first of
its IPv4 addresses outside 127.0.0.0/8 (Debian and Ubuntu map a host's own name to 127.0.1.1 in /etc/hosts, which only
that host reaches). On the first node itself (a batch job, salloc from that node), when its name gives only loopback:
the address of its interface that routes to the second node, as the kernel chooses it (ip route get), said once on
stderr. With none of them: one line on stderr, exit 2.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

IPV4 = re.compile(r"[0-9]+(\.[0-9]+){3}")


def output(command: list[str]) -> str:
    """COMMAND's stdout; empty when it fails."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


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
    print(
        f"srun.sh: {first}'s name gives no address but loopback here; MASTER_ADDR={address.group(1)}, the address of"
        f" {device.group(1) if device else ''}, which routes to {second} ({peer})",
        file=sys.stderr,
    )
    return address.group(1)


def master_address(hosts: list[str]) -> str:
    address = node_address(hosts[0])
    if len(hosts) == 1:
        return address or hosts[0]
    return address or address_toward(hosts[0], hosts[1])


def main() -> None:
    hosts = sys.argv[1:3]
    address = master_address(hosts)
    if not address:
        print(
            f"srun.sh: no address of {hosts[0]} that other nodes reach"
            " (scontrol's NodeAddr, getent ahostsv4, ip route): set MASTER_ADDR to its IP address",
            file=sys.stderr,
        )
        sys.exit(2)
    print(address)


if __name__ == "__main__":
    main()
