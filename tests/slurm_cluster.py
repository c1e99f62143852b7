"""A real two-node SLURM on this machine (Debian's slurm-wlm 22.05 and munge), for tests that run srun.sh as a user.

Load it with `pytest_plugins = ["tests.slurm_cluster"]`. The session fixture `slurm_cluster` builds three hosts, a
controller `ctl` and the compute nodes `node1` and `node2`, each a holder process with its own network, UTS (hostname)
and mount namespace. A Linux bridge in a namespace of its own joins them on a private /24 that exists only between
these namespaces: no default route, nothing added to the machine's own network namespace. Each host bind-mounts its
own /etc/hosts (with Debian's `127.0.1.1 <hostname>` line, the cause of loopback master addresses),
an nsswitch.conf that resolves names from files only, and its own directory as its local disk (munge socket, spool,
logs, pid files). Every host runs munged; ctl runs slurmctld, each node slurmd (proctrack/linuxproc, task/none, no
cgroups). Client commands run on ctl, the login node: `cluster.run(["salloc", ...])`.

A second layout, `slurm_cluster_by_name`, is SLURM's default naming: no NodeAddr (slurmctld reaches a node by its
name), and each host's /etc/hosts lists its own name only as 127.0.1.1, the other hosts by their addresses, as
Debian's installer leaves it: a node then knows no address of its own name that another node reaches.

Resources are those of a GPU cluster: select/cons_tres, 8 CPUs and 4 GPUs per node, typed as GPU clusters declare them
(`Gres=gpu:h100:4`: a job may ask for `gpu:4` or `h100:4`; GRES without device files), a default partition `gpu` that
hands out whole nodes, and a partition `shared` that does not.
When the cluster cannot start, the test fails with the daemon logs; it is never skipped. Afterwards every job is
cancelled, the daemons and holders stopped, and the directory removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SUBNET = "10.231.77"
NODE_CPUS = 8
NODE_GPUS = 4
GPU_TYPE = "h100"
START_TIMEOUT_S = 60
CONTROLLER = "ctl"
NODES = ("node1", "node2")
THREE_NODES = ("node1", "node2", "node3")
ADDRESSES = {CONTROLLER: f"{SUBNET}.10", **{node: f"{SUBNET}.{11 + index}" for index, node in enumerate(THREE_NODES)}}


@dataclasses.dataclass
class Host:
    name: str
    address: str
    holder: subprocess.Popen  # `sleep infinity` inside the host's namespaces
    local: Path  # what the host sees at the cluster's `local` directory

    @property
    def pid(self) -> int:
        return self.holder.pid

    def enter(self, args: list[str], cwd: Path | str = "/") -> list[str]:
        """`args` run inside this host's namespaces, in `cwd` (entering a mount namespace resets the directory)."""
        namespaces = ["--net", "--uts", "--mount"]
        return ["nsenter", f"--target={self.pid}", *namespaces, f"--wd={cwd}", "--", *args]

    def uts_namespace(self) -> str:
        return os.readlink(f"/proc/{self.pid}/ns/uts")


@dataclasses.dataclass
class SlurmCluster:
    root: Path
    conf: Path
    hosts: dict[str, Host]
    env: dict[str, str]  # os.environ without SLURM job variables, plus SLURM_CONF
    daemons: dict[str, subprocess.Popen] = dataclasses.field(default_factory=dict)
    nodes: tuple[str, ...] = NODES
    bridge: subprocess.Popen | None = None  # the holder of the bridge's namespace, where each node's veth ends

    @property
    def login(self) -> Host:
        return self.hosts[CONTROLLER]

    def command(self, args: list[str], host: str = CONTROLLER, cwd: Path | str = "/") -> list[str]:
        return self.hosts[host].enter(args, cwd)

    def run(
        self, args: list[str], timeout: float = 60, host: str = CONTROLLER, **kwargs
    ) -> subprocess.CompletedProcess:
        """Run a command on one host of the cluster (by default ctl, where users type salloc and sbatch)."""
        kwargs.setdefault("env", self.env)
        cwd = kwargs.pop("cwd", "/")
        return subprocess.run(
            self.command(args, host, cwd), capture_output=True, text=True, timeout=timeout, check=False, **kwargs
        )

    def popen(self, args: list[str], host: str = CONTROLLER, **kwargs) -> subprocess.Popen:
        kwargs.setdefault("env", self.env)
        cwd = kwargs.pop("cwd", "/")
        return subprocess.Popen(self.command(args, host, cwd), **kwargs)

    def logs(self) -> str:
        parts = []
        for path in sorted([*self.root.glob("hosts/*/*.log"), *self.root.glob("hosts/*/*.out")]):
            text = path.read_text(errors="replace")
            name = f"{path.parent.name}/{path.name}"
            parts.append(f"----- {name} (last 60 lines) -----\n" + "\n".join(text.splitlines()[-60:]))
        return "\n".join(parts)

    def node_states(self) -> list[str]:
        try:
            result = self.run(["sinfo", "--noheader", "--Node", "--partition=gpu", "--format=%T"], timeout=10)
        except subprocess.TimeoutExpired:
            return ["no answer from slurmctld"]
        return result.stdout.split()

    def job_listed(self, job: str) -> bool:
        """Whether squeue still lists `job`. squeue fails the same way for a job slurmctld has purged (MinJobAge) and
        for an answer that came too late on a loaded machine; only the first means the job is gone."""
        deadline = time.monotonic() + 120
        while True:
            result = self.run(["squeue", "--noheader", "--jobs", job], timeout=60)
            if result.returncode == 0:
                return bool(result.stdout.strip())
            if "Invalid job id" in result.stderr:
                return False
            assert time.monotonic() < deadline, f"squeue kept failing: {result.stderr}"
            time.sleep(0.5)

    def job_ids(self) -> list[str]:
        return self.run(["squeue", "--noheader", "--format=%i"], timeout=10).stdout.split()

    def wait_idle(self, timeout: float = 30) -> None:
        """Wait until no job is left and every node is idle again (jobs complete asynchronously)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # "planned": idle, but the backfill scheduler held the node for a job that has ended since.
            if not self.job_ids() and all(state in ("idle", "planned") for state in self.node_states()):
                return
            time.sleep(0.2)
        jobs = self.run(["squeue", "--format=%i %T %r"], timeout=10).stdout
        raise AssertionError(f"SLURM not idle after {timeout}s: nodes {self.node_states()}, jobs {jobs}\n{self.logs()}")

    def processes_on(self, host: str) -> list[int]:
        """Processes on a node other than its holder and daemons: what a job left behind."""
        own = {self.hosts[host].pid, *(p.pid for p in self.daemons.values())}
        namespace = self.hosts[host].uts_namespace()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in own:
                continue
            try:
                if os.readlink(entry / "ns" / "uts") == namespace and not pid_gone(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found


def _wait_for(ready: Callable[[], bool], procs: dict[str, subprocess.Popen], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [f"{name} exited with {p.returncode}" for name, p in procs.items() if p.poll() is not None]
        if dead:
            raise RuntimeError(f"waiting for {what}: " + ", ".join(dead))
        if ready():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready after {timeout}s")


def _holder(flags: list[str], name: str) -> subprocess.Popen:
    """A `sleep infinity` in new namespaces; returns once unshare has exec'd it (so the namespaces exist)."""
    proc = subprocess.Popen(["unshare", *flags, "--", "sleep", "infinity"])
    _wait_for(lambda: os.readlink(f"/proc/{proc.pid}/exe").endswith("sleep"), {name: proc}, 10, f"{name} namespaces")
    return proc


def _sh(args: list[str]) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=20)


def _hosts_file(name: str, lists_itself: bool, nodes: tuple[str, ...]) -> str:
    lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{name}"]  # as Debian's installer writes it
    lines += [f"{ADDRESSES[host]}\t{host}" for host in (CONTROLLER, *nodes) if lists_itself or host != name]
    return "\n".join(lines) + "\n"


def _make_host(root: Path, name: str, bridge: subprocess.Popen, node_addr: bool, names: tuple[str, ...]) -> Host:
    holder = _holder(["--net", "--uts", "--mount", "--propagation", "private"], name)
    host = Host(name=name, address=ADDRESSES[name], holder=holder, local=root / "hosts" / name)
    host.local.mkdir(parents=True)
    (host.local / "hosts").write_text(_hosts_file(name, node_addr, names))
    inside = ["nsenter", f"--target={holder.pid}"]
    _sh([*inside, "--uts", "hostname", name])
    for source, target in (
        (host.local / "hosts", Path("/etc/hosts")),
        (root / "nsswitch.conf", Path("/etc/nsswitch.conf")),
        (host.local, root / "local"),
    ):
        _sh([*inside, "--mount", "mount", "--bind", str(source), str(target)])
    veth = f"v-{name}"
    _sh(
        [
            "nsenter",
            f"--target={bridge.pid}",
            "--net",
            "ip",
            "link",
            "add",
            veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            str(holder.pid),
        ]
    )
    _sh(["nsenter", f"--target={bridge.pid}", "--net", "ip", "link", "set", veth, "master", "br0", "up"])
    _sh([*inside, "--net", "ip", "addr", "add", f"{host.address}/24", "dev", "eth0"])
    _sh([*inside, "--net", "ip", "link", "set", "eth0", "up"])
    _sh([*inside, "--net", "ip", "link", "set", "lo", "up"])
    return host


def _make_bridge() -> subprocess.Popen:
    bridge = _holder(["--net"], "bridge")
    inside = ["nsenter", f"--target={bridge.pid}", "--net", "ip", "link"]
    _sh([*inside, "add", "br0", "type", "bridge"])
    _sh([*inside, "set", "br0", "up"])
    return bridge


def _write_config(root: Path, node_addr: bool, names: tuple[str, ...]) -> Path:
    local = root / "local"  # each host mounts its own directory here
    local.mkdir()
    (root / "nsswitch.conf").write_text("passwd: files\ngroup: files\nshadow: files\nhosts: files\n")
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)  # munged insists: key readable by its owner only, socket directory searchable by everyone
    root.chmod(0o755)
    (root / "plugstack.conf").write_text("")  # no SPANK plugins (pyxis), whatever /etc/slurm holds
    (root / "cgroup.conf").write_text("IgnoreSystemd=yes\n")
    span = f"node[1-{len(names)}]"
    gpus = f"Name=gpu Type={GPU_TYPE} File={local}/gpu[0-{NODE_GPUS - 1}]"
    (root / "gres.conf").write_text(f"NodeName={span} {gpus}\n")
    nodes = "\n".join(
        f"NodeName={node}{f' NodeAddr={ADDRESSES[node]}' if node_addr else ''} CPUs={NODE_CPUS}"
        f" Gres=gpu:{GPU_TYPE}:{NODE_GPUS} State=UNKNOWN"
        for node in names
    )
    conf = root / "slurm.conf"
    conf.write_text(
        f"""\
ClusterName=srunshtest
SlurmctldHost={CONTROLLER}({ADDRESSES[CONTROLLER]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={local}/munge.socket,cred_expire=5
StateSaveLocation={local}/state
SlurmdSpoolDir={local}/spool
SlurmctldPidFile={local}/slurmctld.pid
SlurmdPidFile={local}/slurmd.pid
SlurmctldLogFile={local}/slurmctld.log
SlurmdLogFile={local}/slurmd.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
InactiveLimit=0
MessageTimeout=20
MinJobAge=2
SchedulerParameters=bf_interval=1,sched_interval=2
{nodes}
PartitionName=gpu Nodes={span} Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE
PartitionName=shared Nodes={span} MaxTime=INFINITE State=UP
"""
    )
    return conf


def _start_daemons(cluster: SlurmCluster) -> None:
    conf, key = cluster.conf, cluster.root / "munge.key"
    local = cluster.root / "local"
    for host in cluster.hosts.values():
        (host.local / "spool").mkdir()
        (host.local / "state").mkdir()
        for gpu in range(NODE_GPUS):
            os.mknod(host.local / f"gpu{gpu}", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null's numbers
        munged = [
            "munged",
            "--foreground",
            f"--socket={local}/munge.socket",
            f"--key-file={key}",
            f"--log-file={local}/munged.log",
            f"--pid-file={local}/munged.pid",
            f"--seed-file={local}/munged.seed",
        ]
        socket_file = host.local / "munge.socket"
        name = f"munged@{host.name}"
        cluster.daemons[name] = _daemon(cluster, munged, host.name)
        _wait_for(socket_file.exists, cluster.daemons, 10, f"{name} socket")
    cluster.daemons["slurmctld"] = _daemon(cluster, ["slurmctld", "-D", "-i", "-f", str(conf)], CONTROLLER)
    for node in cluster.nodes:
        cluster.daemons[f"slurmd@{node}"] = _daemon(cluster, ["slurmd", "-D", "-f", str(conf)], node)


def _daemon(cluster: SlurmCluster, args: list[str], host: str) -> subprocess.Popen:
    """A daemon in the foreground on `host`, its console in that host's <daemon>.out beside its log."""
    with open(cluster.hosts[host].local / f"{Path(args[0]).name}.out", "wb") as out:
        return cluster.popen(args, host=host, stdout=out, stderr=subprocess.STDOUT)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def job_environment(base: dict[str, str]) -> dict[str, str]:
    """`base` without the variables of an enclosing SLURM job, which would leak into the test cluster's jobs."""
    job = ("SLURM_", "SALLOC_", "SBATCH_", "SRUN_")
    return {k: v for k, v in base.items() if k == "SLURM_CONF" or not k.startswith(job)}


@contextlib.contextmanager
def running_cluster(node_addr: bool, nodes: tuple[str, ...] = NODES) -> Iterator[SlurmCluster]:
    """ctl and the nodes (node1 and node2, or THREE_NODES) up until the block ends; node_addr=False: SLURM's default
    naming (see the module text)."""
    root = Path(tempfile.mkdtemp(prefix="srunsh-slurm-"))
    env = {**job_environment(dict(os.environ)), "SLURM_CONF": str(root / "slurm.conf")}
    holders: list[subprocess.Popen] = []
    cluster = SlurmCluster(root=root, conf=root / "slurm.conf", hosts={}, env=env, nodes=nodes)
    try:
        try:
            started = time.monotonic()
            _write_config(root, node_addr, nodes)
            cluster.bridge = bridge = _make_bridge()
            holders.append(bridge)
            for name in (CONTROLLER, *nodes):
                cluster.hosts[name] = _make_host(root, name, bridge, node_addr, nodes)
                holders.append(cluster.hosts[name].holder)
            _start_daemons(cluster)
            idle = ["idle"] * len(nodes)
            _wait_for(lambda: cluster.node_states() == idle, cluster.daemons, START_TIMEOUT_S, "SLURM nodes idle")
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            detail = getattr(err, "stderr", "") or ""
            pytest.fail(f"could not start SLURM: {err} {detail}\n{cluster.logs()}", pytrace=False)
        print(f"\n[slurm_cluster] {', '.join((CONTROLLER, *nodes))} up in {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        if cluster.daemons.get("slurmctld") and cluster.daemons["slurmctld"].poll() is None:
            leftover = cluster.job_ids()
            if leftover:
                cluster.run(["scancel", "--full", *leftover], timeout=20)
            try:
                cluster.wait_idle()
            except AssertionError:
                pass  # stop the daemons anyway; their logs are in the failure that caused this
        _stop(list(reversed(cluster.daemons.values())))
        for host in cluster.hosts.values():
            for pid in cluster.processes_on(host.name) if host.holder.poll() is None else []:
                os.kill(pid, signal.SIGKILL)
        _stop(holders)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    with running_cluster(node_addr=True) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_cluster_by_name() -> Iterator[SlurmCluster]:
    with running_cluster(node_addr=False) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def slurm_cluster_three() -> Iterator[SlurmCluster]:
    """ctl, node1, node2 and node3 (the two-node layout otherwise): for what needs a majority of healthy nodes."""
    with running_cluster(node_addr=True, nodes=THREE_NODES) as cluster:
        yield cluster


@contextlib.contextmanager
def capped_link(cluster: SlurmCluster, node: str, mbit: int) -> Iterator[None]:
    """`node`'s link to the bridge carries at most `mbit` Mbit/s each way while the block runs: tc's token-bucket
    filter (tbf) on both ends of its veth, eth0 in the node (what it sends) and v-NODE at the bridge (what it gets).
    The bucket holds 64 KiB, one GSO packet: a link that is slow sends no message faster, while a bucket of a few
    milliseconds of the rate would let a 1 MiB message through at full speed."""
    assert cluster.bridge is not None
    tbf = ["tbf", "rate", f"{mbit}mbit", "burst", str(64 << 10), "latency", "50ms"]
    ends = [(cluster.hosts[node].pid, "eth0"), (cluster.bridge.pid, f"v-{node}")]
    for pid, device in ends:
        _sh(["nsenter", f"--target={pid}", "--net", "tc", "qdisc", "add", "dev", device, "root", *tbf])
    try:
        yield
    finally:
        for pid, device in ends:
            _sh(["nsenter", f"--target={pid}", "--net", "tc", "qdisc", "del", "dev", device, "root"])


def pid_gone(pid: int) -> bool:
    """No such process, or only its zombie (this machine's init may not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())
