"""The world an srun.sh test runs in: a temporary directory holding recipe.py, the records that
tests/fixtures/fake_python writes for every rank, and the environment; srun.sh runs there directly (--local,
--dry-run, errors outside an allocation) or inside an allocation of the two-node test SLURM, from its login node.

Load it with `pytest_plugins = ["tests.srun_world"]`: fixtures `srun_world` (no SLURM) and `slurm_world` (with the
session's SLURM; afterwards it checks that every job ended and no process is left on either node).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import (  # noqa: F401
    NODES,
    SlurmCluster,
    job_environment,
    pid_gone,
    slurm_cluster,
    slurm_cluster_by_name,
)

REPO = Path(__file__).resolve().parent.parent
SRUN_SH = REPO / "srun.sh"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# Arguments no shell may touch on their way from the user's command line to every rank (each NAME=VALUE or ~NAME, the
# shapes srun.sh lets through).
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
    "-leading-dash=1",
    "--looks-like=an-option",
    "i=$HOME ${PATH} $1 $@",
    "j=~/tilde ?[a-z]* {x,y}",
    "k=tab\there",
    "l=",
    "o= ",
    "m=%s %q %% \\x41",
    "n=!bang |pipe &amp <in >out",
    "~p",
]

# The first bytes of a squashfs file (its superblock's magic), all that srun.sh reads of SRUNSH_SQSH.
SQUASHFS_MAGIC = b"hsqs"

# Two whole nodes and their GPUs: steps see a GPU only when the job asked for it, as on a GPU cluster with GRES.
ALLOCATION = ("--nodes=2", "--gpus-per-node=4")

# What the launcher's own environment must not pass on to the ranks of a test.
LAUNCHER_VARIABLES = (
    "NCCL_DEBUG",
    "OMP_NUM_THREADS",
    "NCCL_GIN_TYPE",
    "DEEP_EP_BACKEND",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "SRUNSH_GPUS_PER_NODE",
    "MASTER_PORT",
    "MASTER_ADDR",
    "SRUNSH_SQSH",
    "SRUNSH_CONTAINER_NAME",
    "SRUNSH_MOUNT",
    "SRUNSH_PYTHON",
    "SRUNSH_NSYS",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "SRUNSH_RUN_ID",
    "RUN_DIR",
    "SRUNSH_OUTPUT_ROOT",
    "GLOO_SOCKET_IFNAME",
    "SRUNSH_SRUN_EXTRA_ARGS",
    "SRUNSH_COMPILE_CACHE",
    "SRUNSH_CONSOLE_RANKS",
    # torch's Inductor sets its cache directory in the environment of a process that compiled (a test's own)
    *("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR"),
    *("SRUNSH_SAVE_LEAD_S", "SRUNSH_MAX_RETRIES", "SRUNSH_HEALTH", "SRUNSH_HEALTH_TIMEOUT_S", "SRUNSH_HANG_TIMEOUT_S"),
    # The knobs' names before they took the SRUNSH_ prefix (issue 35), which srun.sh names on stderr when they are set.
    *("SQSH", "CONTAINER_NAME", "MOUNT", "PYTHON", "NSYS", "GPUS_PER_NODE", "OUTPUT_ROOT", "SRUN_EXTRA_ARGS", "HEALTH"),
    *("SAVE_LEAD_S", "MAX_RETRIES", "HEALTH_TIMEOUT_S", "HANG_TIMEOUT_S"),
)


@dataclasses.dataclass
class SrunWorld:
    dir: Path
    records_dir: Path
    env: dict[str, str]
    cluster: SlurmCluster | None = None

    def _env(self, env: dict[str, str] | None) -> dict[str, str]:
        return {**self.env, **(env or {})}

    def srun_sh(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
        """Run srun.sh here, outside any allocation."""
        command = [str(SRUN_SH), *args]
        env = self._env(env)
        return subprocess.run(
            command, cwd=self.dir, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start srun.sh here without waiting."""
        return subprocess.Popen(
            [str(SRUN_SH), *args],
            cwd=self.dir,
            env=self._env(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def on_login_node(self, args: list[str], env: dict[str, str] | None = None, timeout: float = 120):
        assert self.cluster is not None, "this world has no SLURM cluster"
        return self.cluster.run(args, timeout=timeout, env=self._env(env), cwd=self.dir)

    def in_allocation(
        self,
        *args: str,
        salloc: tuple[str, ...] = ALLOCATION,
        env: dict[str, str] | None = None,
        timeout: float = 120,
        command: tuple[str, ...] = (),
    ) -> tuple[subprocess.CompletedProcess, int]:
        """`salloc SALLOC [COMMAND] srun.sh ARGS` on the login node; then one more srun in the same allocation
        learns how many job steps srun.sh started (step ids count from 0). Returns (result, steps started)."""
        step_file = self.dir / "next_step_id"
        step_file.unlink(missing_ok=True)
        count_steps = 'srun --quiet --nodes=1 --ntasks=1 --overlap printenv SLURM_STEP_ID >"$STEP_FILE"'
        script = f'"$@"; status=$?; {count_steps}; exit $status'
        result = self.on_login_node(
            [
                "salloc",
                "--quiet",
                "--job-name=srunsh-test",
                *salloc,
                "bash",
                "-c",
                script,
                "bash",
                *command,
                str(SRUN_SH),
                *args,
            ],
            env={**(env or {}), "STEP_FILE": str(step_file)},
            timeout=timeout,
        )
        text = step_file.read_text().strip() if step_file.exists() else ""
        return result, int(text) if text else -1

    def start_in_allocation(
        self, *args: str, salloc: tuple[str, ...] = ALLOCATION, env: dict[str, str] | None = None
    ) -> tuple[subprocess.Popen, Path]:
        """Start `salloc SALLOC srun.sh ARGS` in a session of its own, as a terminal would (Ctrl-C reaches its whole
        process group); returns salloc and a file that will hold srun.sh's pid."""
        assert self.cluster is not None, "this world has no SLURM cluster"
        pid_file = self.dir / "srun_sh.pid"
        command = [
            "salloc",
            "--quiet",
            *salloc,
            "bash",
            "-c",
            'echo $$ >"$PID_FILE"; exec "$@"',
            "bash",
            str(SRUN_SH),
            *args,
        ]
        proc = self.cluster.popen(
            command,
            env=self._env({**(env or {}), "PID_FILE": str(pid_file)}),
            cwd=self.dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        return proc, pid_file

    def records(self) -> dict[int, dict]:
        """What each rank saw, by RANK: argv (bytes, after the python executable), env, pid, host, cwd, and what
        the rendezvous gave it."""
        out = {}
        for path in self.records_dir.glob("rank-*.json"):
            record = json.loads(path.read_text())
            record["argv"] = [bytes.fromhex(a) for a in record.pop("argv_hex")]
            out[int(record["env"]["RANK"])] = record
        return out

    def calls(self) -> list[dict]:
        """Every time the fake python ran."""
        path = self.records_dir / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def signals_seen(self) -> dict[int, list[str]]:
        """The signals each rank's handler saw, by RANK, in order."""
        seen: dict[int, list[str]] = {}
        for path in self.records_dir.glob("signals-*.txt"):
            seen[int(path.stem.split("-")[1])] = path.read_text().split()
        return seen

    def wait_for_ranks(self, count: int, timeout: float = 60) -> dict[int, dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = self.records()
            if len(records) >= count:
                return records
            time.sleep(0.1)
        raise AssertionError(f"only ranks {sorted(self.records())} started within {timeout}s")

    def run_dirs(self) -> list[Path]:
        return sorted(p for p in (self.dir / "outputs" / "recipe").glob("*") if p.is_dir())


def wait_gone(pids: list[int], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(pid_gone(pid) for pid in pids):
            return True
        time.sleep(0.1)
    return False


def _world(tmp_path: Path, base_env: dict[str, str], cluster: SlurmCluster | None) -> SrunWorld:
    records = tmp_path / "records"
    records.mkdir()
    (tmp_path / "recipe.py").write_text("def configure():\n    raise AssertionError('the fake python never runs me')\n")
    env = {k: v for k, v in job_environment(base_env).items() if k not in LAUNCHER_VARIABLES}
    env.update(
        SRUNSH_PYTHON=str(FIXTURES / "fake_python"), FAKE_RECORD_DIR=str(records), CUDA_VISIBLE_DEVICES="0,1,2,3"
    )
    return SrunWorld(dir=tmp_path, records_dir=records, env=env, cluster=cluster)


@pytest.fixture
def srun_world(tmp_path):
    return _world(tmp_path, dict(os.environ), None)


def _world_on(tmp_path: Path, cluster: SlurmCluster) -> Iterator[SrunWorld]:
    """A world on `cluster`; afterwards every job has ended and no process is left on either node."""
    yield _world(tmp_path, cluster.env, cluster)
    leftover = cluster.job_ids()
    if leftover:  # a failed test may leave its job behind: cancel it so the next test finds idle nodes
        cluster.run(["scancel", "--full", *leftover], timeout=20)
    cluster.wait_idle()
    deadline = time.monotonic() + 10
    while any(cluster.processes_on(node) for node in cluster.nodes) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {node: cluster.processes_on(node) for node in cluster.nodes}
    assert not any(left.values()), f"processes left on the nodes after the job: {left}"


@pytest.fixture
def slurm_world(tmp_path, slurm_cluster: SlurmCluster):  # noqa: F811
    yield from _world_on(tmp_path, slurm_cluster)


@pytest.fixture
def slurm_world_by_name(tmp_path, slurm_cluster_by_name: SlurmCluster):  # noqa: F811
    """A world on the cluster whose nodes have no NodeAddr and know their own name only as 127.0.1.1."""
    yield from _world_on(tmp_path, slurm_cluster_by_name)
