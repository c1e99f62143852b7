"""A real single-node SLURM (Debian's slurm-wlm 22.05 and munge) on this host, for tests that run srun.sh as a user.

Load it with `pytest_plugins = ["tests.slurm_cluster"]` (tests/conftest.py or a test module). The session fixture
`slurm_cluster` writes slurm.conf into a temporary directory, starts munged, slurmctld and slurmd in the foreground
as children of this process (root, no cgroups: proctrack/linuxproc, task/none), waits until the node is idle, and
yields a SlurmCluster. Afterwards it cancels every job, stops the three daemons by pid and removes the directory.
When the cluster cannot start, the test fails with the daemon logs; it is never skipped.

The node has 8 CPUs whatever the host has (SlurmdParameters=config_overrides) and select/linear hands out whole
nodes, as GPU clusters do, so `salloc -N1` can run up to 8 tasks on a 2-core CI runner.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

NODE_CPUS = 8
START_TIMEOUT_S = 60
DAEMONS = ("munged", "slurmctld", "slurmd")


@dataclasses.dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str
    env: dict[str, str]  # os.environ without SLURM_* job variables, plus SLURM_CONF
    mpi: str  # the srun --mpi plugin that works here: pmix when libpmix is installed, else pmi2
    mpi_note: str

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")
            parts.append(f"----- {path.name} (last 60 lines) -----\n" + "\n".join(text.splitlines()[-60:]))
        return "\n".join(parts)

    def run(self, args: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run a command (e.g. a SLURM client) against this cluster."""
        kwargs.setdefault("env", self.env)
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)

    def node_state(self) -> str:
        try:
            result = self.run(["sinfo", "--noheader", "--Node", "--format=%T"], timeout=10)
        except subprocess.TimeoutExpired:
            return "no answer from slurmctld"
        return result.stdout.strip()

    def job_ids(self) -> list[str]:
        result = self.run(["squeue", "--noheader", "--format=%i"], timeout=10)
        return result.stdout.split()

    def wait_idle(self, timeout: float = 30) -> None:
        """Wait until no job is left and the node is idle again (jobs complete asynchronously)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.job_ids() and self.node_state() == "idle":
                return
            time.sleep(0.2)
        raise AssertionError(f"SLURM node not idle after {timeout}s: {self.node_state()!r}\n{self.logs()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(root: Path, node: str) -> Path:
    for name in ("munge", "run", "log", "state", "spool"):
        (root / name).mkdir()
    # munged insists: key readable by its owner only, socket directory searchable by everyone.
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    root.chmod(0o755)
    (root / "run").chmod(0o755)
    (root / "plugstack.conf").write_text("")  # no SPANK plugins (pyxis), whatever /etc/slurm holds
    (root / "cgroup.conf").write_text("IgnoreSystemd=yes\n")
    conf = root / "slurm.conf"
    conf.write_text(
        f"""\
ClusterName=srunshtest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/run/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
PlugStackConfig={root}/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/linear
SlurmdParameters=config_overrides
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
KillWait=5
InactiveLimit=0
MessageTimeout=20
NodeName={node} NodeAddr=127.0.0.1 CPUs={NODE_CPUS} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""
    )
    return conf


def _start(root: Path, conf: Path, env: dict[str, str]) -> dict[str, subprocess.Popen]:
    munge = root / "munge"
    commands = {
        "munged": [
            "munged",
            "--foreground",
            f"--socket={root}/run/munge.socket",
            f"--key-file={munge}/munge.key",
            f"--log-file={root}/log/munged.log",
            f"--pid-file={munge}/munged.pid",
            f"--seed-file={munge}/munged.seed",
        ],
        "slurmctld": ["slurmctld", "-D", "-i", "-f", str(conf)],
        "slurmd": ["slurmd", "-D", "-f", str(conf)],
    }
    procs = {}
    for name in DAEMONS:
        with open(root / "log" / f"{name}.out", "wb") as out:
            procs[name] = subprocess.Popen(commands[name], env=env, stdout=out, stderr=subprocess.STDOUT)
        if name == "munged":
            _wait_for((root / "run" / "munge.socket").exists, procs, 10, "munged socket")
    return procs


def _wait_for(ready, procs: dict[str, subprocess.Popen], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [f"{name} exited with {p.returncode}" for name, p in procs.items() if p.poll() is not None]
        if dead:
            raise RuntimeError(f"waiting for {what}: " + ", ".join(dead))
        if ready():
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout}s")


def _stop(procs: dict[str, subprocess.Popen]) -> None:
    for name in reversed(DAEMONS):
        proc = procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


def _probe_mpi(cluster: SlurmCluster) -> tuple[str, str]:
    """Debian's mpi/pmix plugin loads libpmix.so, which only libpmix-dev installs (slurm-wlm does not pull it in)."""
    result = cluster.run(["salloc", "--quiet", "-N1", "srun", "--mpi=pmix", "-n1", "true"], timeout=60)
    cluster.wait_idle()
    if result.returncode == 0:
        return "pmix", "srun --mpi=pmix works here"
    first = (result.stderr.strip().splitlines() or ["no output"])[0]
    return "pmi2", f"srun --mpi=pmix fails here ({first}); tests use SRUN_MPI=pmi2 (install libpmix-dev for pmix)"


@pytest.fixture(scope="session")
def slurm_cluster():
    node = socket.gethostname().split(".")[0]
    root = Path(tempfile.mkdtemp(prefix="srunsh-slurm-"))
    conf = _write_config(root, node)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
    env["SLURM_CONF"] = str(conf)
    cluster = SlurmCluster(root=root, conf=conf, node=node, env=env, mpi="", mpi_note="")
    procs: dict[str, subprocess.Popen] = {}
    try:
        try:
            procs = _start(root, conf, env)
            _wait_for(lambda: cluster.node_state() == "idle", procs, START_TIMEOUT_S, "SLURM node idle")
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            pytest.fail(f"could not start SLURM: {err}\n{cluster.logs()}", pytrace=False)
        cluster.mpi, cluster.mpi_note = _probe_mpi(cluster)
        print(f"\n[slurm_cluster] node {node}, {cluster.mpi_note}")
        yield cluster
    finally:
        if procs.get("slurmctld") and procs["slurmctld"].poll() is None:
            leftover = cluster.job_ids()
            if leftover:
                cluster.run(["scancel", "--full", *leftover], timeout=20)
            try:
                cluster.wait_idle()
            except AssertionError:
                pass  # stop the daemons anyway; their logs are in the failure that caused this
        _stop(procs)
        shutil.rmtree(root, ignore_errors=True)


# ---- The world an srun.sh test runs in ----------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
SRUN_SH = REPO / "srun.sh"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Arguments no shell may touch on their way from the user's command line to every rank.
HOSTILE_ARGS = [
    "train.name=with spaces  and two",
    "model.note='single quotes'",
    'model.note="double quotes"',
    "a=$(touch /tmp/srunsh-pwned)",
    "b=`id`",
    "c=x;echo pwned;",
    "d=*",
    "e=back\\slash\\n",
    "f=line1\nline2",
    "g=ünïcødé→✓ 中文",
    "profiling.profile_ranks=[0,1]",
    "h=b=c",
    "-leading-dash",
    "--looks-like=an-option",
    "i=$HOME ${PATH} $1 $@",
    "j=~/tilde ?[a-z]* {x,y}",
    "k=tab\there",
    "l=",
    " ",
    "m=%s %q %% \\x41",
    "n=!bang |pipe &amp <in >out",
    "",
]


# A one-node allocation for one test command.
SALLOC = ["salloc", "--quiet", "--nodes=1", "--job-name=srunsh-test"]


@dataclasses.dataclass
class SrunWorld:
    """A temporary directory holding recipe.py and the records the fake python writes; runs srun.sh there."""

    dir: Path
    records_dir: Path
    env: dict[str, str]
    cluster: SlurmCluster | None = None

    def srun_sh(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
        """Run srun.sh directly (no allocation)."""
        return subprocess.run(
            [str(SRUN_SH), *args],
            cwd=self.dir,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def in_allocation(self, *args: str, env: dict[str, str] | None = None, timeout: float = 90):
        """Run srun.sh inside a one-node `salloc`; then run one more srun there to learn how many steps srun.sh
        started (step ids count from 0). Returns (result, steps_started_by_srun_sh)."""
        assert self.cluster is not None, "this world has no SLURM cluster"
        step_file = self.dir / "next_step_id"
        script = (
            '"$@"; status=$?; srun --quiet --ntasks=1 --mpi=none printenv SLURM_STEP_ID >"$STEP_FILE" 2>/dev/null;'
            " exit $status"
        )
        result = subprocess.run(
            [
                *SALLOC,
                "bash",
                "-c",
                script,
                "bash",
                str(SRUN_SH),
                *args,
            ],
            cwd=self.dir,
            env={**self.env, **(env or {}), "STEP_FILE": str(step_file)},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        steps = int(step_file.read_text()) if step_file.exists() and step_file.read_text().strip() else -1
        return result, steps

    def start_in_allocation(self, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        """Start srun.sh inside `salloc` without waiting; returns the salloc process and a file that will hold
        srun.sh's pid (bash writes it, then execs srun.sh, which execs srun)."""
        assert self.cluster is not None, "this world has no SLURM cluster"
        pid_file = self.dir / "srun_sh.pid"
        proc = subprocess.Popen(
            [
                *SALLOC,
                "bash",
                "-c",
                'echo $$ >"$PID_FILE"; exec "$@"',
                "bash",
                str(SRUN_SH),
                *args,
            ],
            cwd=self.dir,
            env={**self.env, **(env or {}), "PID_FILE": str(pid_file)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return proc, pid_file

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start srun.sh directly without waiting."""
        return subprocess.Popen(
            [str(SRUN_SH), *args],
            cwd=self.dir,
            env={**self.env, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def records(self) -> dict[int, dict]:
        """What each rank saw, by RANK: argv (bytes, after the python executable), env, pid, host, cwd."""
        out = {}
        for path in self.records_dir.glob("rank-*.json"):
            record = json.loads(path.read_text())
            record["argv"] = [bytes.fromhex(a) for a in record.pop("argv_hex")]
            out[int(record["env"]["RANK"])] = record
        return out

    def nsys_records(self) -> dict[int, dict]:
        out = {}
        for path in self.records_dir.glob("nsys-rank*.json"):
            record = json.loads(path.read_text())
            record["argv"] = [bytes.fromhex(a).decode() for a in record.pop("argv_hex")]
            out[int(record["rank"])] = record
        return out

    def calls(self) -> list[dict]:
        """Every time the fake python ran, pre-flight checks included."""
        path = self.records_dir / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_for_ranks(self, count: int, timeout: float = 30) -> dict[int, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = self.records()
            if len(records) >= count:
                return records
            time.sleep(0.1)
        raise AssertionError(f"only ranks {sorted(self.records())} started within {timeout}s")


def test_env(base: dict[str, str], records_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))}
    for name in (
        "NCCL_DEBUG",
        "OMP_NUM_THREADS",
        "NCCL_GIN_TYPE",
        "DEEP_EP_BACKEND",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "GPUS_PER_NODE",
        "MASTER_PORT",
        "MASTER_ADDR",
        "SQSH",
        "MOUNT",
        "PYTHON",
        "NSYS",
        "RANK",
    ):
        env.pop(name, None)
    env.update(PYTHON=str(FIXTURES / "fake_python"), FAKE_RECORD_DIR=str(records_dir), CUDA_VISIBLE_DEVICES="0,1,2,3")
    return env


def _world(tmp_path: Path, base_env: dict[str, str], cluster: SlurmCluster | None) -> SrunWorld:
    records = tmp_path / "records"
    records.mkdir()
    (tmp_path / "recipe.py").write_text("def configure():\n    raise AssertionError('the fake python never runs me')\n")
    env = test_env(base_env, records)
    if cluster is not None:
        env["SRUN_MPI"] = cluster.mpi
    return SrunWorld(dir=tmp_path, records_dir=records, env=env, cluster=cluster)


@pytest.fixture
def srun_world(tmp_path):
    """A world for srun.sh without SLURM (--local, --dry-run, errors outside an allocation)."""
    return _world(tmp_path, dict(os.environ), None)


@pytest.fixture
def slurm_world(tmp_path, slurm_cluster):
    """A world for srun.sh against the session's SLURM; afterwards waits until the node is idle again."""
    world = _world(tmp_path, slurm_cluster.env, slurm_cluster)
    world.env["SLURM_CONF"] = str(slurm_cluster.conf)
    yield world
    leftover = slurm_cluster.job_ids()
    if leftover:  # a failed test may leave its job behind: cancel it so the next test finds an idle node
        slurm_cluster.run(["scancel", "--full", *leftover], timeout=20)
    slurm_cluster.wait_idle()


def pid_gone(pid: int) -> bool:
    """No such process, or only its zombie (this machine's init may not reap orphans)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
