"""srun.sh's container steps on the two-node test SLURM: SRUNSH_HEALTH=1's health check and training share one
container of the launch's own, created once per node and gone from every node however the launch ends; another
launch, or a changed image, never gets it; use_squashfuse=1 in pyxis's plugstack line leaves the steps unnamed.

No pyxis can be built where CI runs (its source and enroot's are on GitHub only; neither is a Debian or PyPI
package), so the steps run under tests/fixtures/pyxis_lifecycle: a stand-in for pyxis 0.24's container lifecycle
(an unnamed container per step, created and removed; a named one created by the first step that lacks it and kept;
every task on a new tmpfs at /tmp, with the step's mounts over it, as enroot v4.1.2's conf/mounts/10-system.fstab
mounts one),
which keeps each node's containers as folders on that node's own disk and logs every create, start and remove.
srun.sh's own removal step runs the stand-in's `enroot list` / `enroot remove -f`. What the stand-in models was
checked against a real pyxis 0.24.0 + enroot 4.1.2 on this test cluster (bench/results/container-start.md,
with the commit of its script). launcher/host/container.py reads the real plugstack configuration through the real
`scontrol show config`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.host.container import Pyxis, launch_container_name, plugstack_lines, read_pyxis, start_note
from tests.srun_world import FIXTURES, NODES, REPO, SQUASHFS_MAGIC, SRUN_SH, SrunWorld

pytest_plugins = ["tests.srun_world"]

STAND_IN = FIXTURES / "pyxis_lifecycle"
SHARED = ("--partition=shared", "--nodes=2", "--gpus-per-node=1")
LAUNCH_NAME = re.compile(r"pyxis_srunsh-(?P<run>\S+)-[0-9a-f]{12}")


@dataclasses.dataclass
class Nodes:
    """The test nodes' containers under the stand-in, and the environment a container launch needs."""

    world: SrunWorld
    image: Path

    def data(self, node: str) -> Path:
        assert self.world.cluster is not None
        return self.world.cluster.hosts[node].local / "enroot"  # what the node sees at root/local/enroot

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "SRUNSH_SQSH": str(self.image),
            "SRUNSH_MOUNT": f"{REPO}:{REPO},{self.world.dir}:{self.world.dir}",
            "PATH": f"{STAND_IN}:{self.world.env['PATH']}",
            "REAL_SRUN": str(shutil.which("srun")),
            "PYXIS_STAND_IN_DATA": str(self.world.cluster.root / "local" / "enroot"),  # each node's own
            "SRUNSH_GPUS_PER_NODE": "1",
            **extra,
        }

    def events(self, node: str) -> list[list[str]]:
        log = self.data(node) / "events.log"
        return [line.split() for line in log.read_text().splitlines()] if log.exists() else []

    def created(self, node: str) -> list[str]:
        return [event[1] for event in self.events(node) if event[0] == "create"]

    def containers(self, node: str) -> list[str]:
        return sorted(p.name for p in self.data(node).iterdir() if p.is_dir()) if self.data(node).exists() else []

    def wait_for_starts(self, container_count: int, timeout: float = 90) -> None:
        """Until each node has seen `container_count` task starts."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(sum(e[0] == "start" for e in self.events(n)) >= container_count for n in NODES):
                return
            time.sleep(0.2)
        raise AssertionError(f"not {container_count} starts a node within {timeout}s: {self.all_events()}")

    def all_events(self) -> dict[str, list[list[str]]]:
        return {node: self.events(node) for node in NODES}


def squash_file(path: Path, content: bytes = b"") -> Path:
    path.write_bytes(SQUASHFS_MAGIC + bytes(92) + content)
    return path


@pytest.fixture
def nodes(slurm_world: SrunWorld) -> Iterator[Nodes]:
    assert slurm_world.cluster is not None
    for node in NODES:
        shutil.rmtree(slurm_world.cluster.hosts[node].local / "enroot", ignore_errors=True)
    yield Nodes(world=slurm_world, image=squash_file(slurm_world.dir / "image.sqsh"))
    for node in NODES:
        shutil.rmtree(slurm_world.cluster.hosts[node].local / "enroot", ignore_errors=True)


def assert_one_container_for_both_steps(nodes: Nodes, steps: int = 2) -> str:
    """Each node created one container of the launch's own, its tasks of `steps` steps all started in it, and it is
    gone. Returns its name."""
    names = set()
    for node in NODES:
        events = nodes.events(node)
        (container,) = nodes.created(node)
        assert LAUNCH_NAME.fullmatch(container), events
        started = {e[2] for e in events if e[0] == "start" and e[1] == container}
        assert len(started) == steps, events
        assert [e[0] for e in events if e[0] == "start" and e[1] != container] == [], events
        assert [e[0] for e in events if e[1] == container][-1] == "remove", events
        assert nodes.containers(node) == [], events
        names.add(container)
    (name,) = names
    return name


def test_health_check_and_training_share_one_container_created_once_per_node_and_removed(nodes: Nodes):
    result, _ = nodes.world.in_allocation("recipe.py", env=nodes.env(SRUNSH_HEALTH="1"))

    assert result.returncode == 0, result.stderr
    name = assert_one_container_for_both_steps(nodes)
    (run_dir,) = nodes.world.run_dirs()
    assert LAUNCH_NAME.fullmatch(name)["run"] == run_dir.name
    header = [line for line in result.stderr.splitlines() if line.startswith("# srun.sh: container start: ")]
    assert len(header) == 1, result.stderr
    assert f"once, into {name.removeprefix('pyxis_')}, which the 2 steps share" in header[0]
    assert "use_squashfuse=1 in pyxis's plugstack line skips it (bench/results/container-start.md" in header[0]


def test_a_launch_of_one_container_step_keeps_pyxis_unnamed_container_and_says_so(nodes: Nodes):
    result, steps = nodes.world.in_allocation("recipe.py", env=nodes.env())

    assert result.returncode == 0, result.stderr
    assert steps == 1  # no removal step: there is nothing of srun.sh's to remove
    for node in NODES:
        (container,) = nodes.created(node)
        assert container.startswith("pyxis_") and not LAUNCH_NAME.fullmatch(container)
        assert nodes.containers(node) == []
    assert "unpacks " + str(nodes.image) + " (0.0 GB) on every node at every step; use_squashfuse=1" in result.stderr


def test_a_users_container_name_is_used_as_given_and_kept(nodes: Nodes):
    result, _ = nodes.world.in_allocation(
        "recipe.py", env=nodes.env(SRUNSH_HEALTH="1", SRUNSH_CONTAINER_NAME="megatron")
    )

    assert result.returncode == 0, result.stderr
    for node in NODES:
        assert nodes.created(node) == ["pyxis_megatron"]
        assert nodes.containers(node) == ["pyxis_megatron"]  # the user's: srun.sh leaves it
    assert "named container megatron (SRUNSH_CONTAINER_NAME)" in result.stderr


ENDINGS = {
    "a failed rank": ({"FAKE_FAIL_RANK": "1", "FAKE_FAIL_EXIT": "3"}, 3),
    "a stall": ({"FAKE_STEPS": "50", "FAKE_STUCK": "1:python@3", "SRUNSH_HANG_TIMEOUT_S": "3"}, 124),
    "a failed health check": (
        {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_HEALTH_HANG": "3", "SRUNSH_HEALTH_TIMEOUT_S": "8"},
        1,
    ),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_the_launch_container_is_gone_from_every_node_after(nodes: Nodes, ending: str):
    extra, status = ENDINGS[ending]
    result, _ = nodes.world.in_allocation("recipe.py", env=nodes.env(SRUNSH_HEALTH="1", **extra), timeout=180)

    assert result.returncode == status, result.stderr
    assert_one_container_for_both_steps(nodes, steps=1 if ending == "a failed health check" else 2)


def test_the_launch_container_is_gone_from_every_node_after_sigterm(nodes: Nodes):
    salloc, pid_file = nodes.world.start_in_allocation("recipe.py", env=nodes.env(SRUNSH_HEALTH="1", FAKE_SLEEP="300"))
    try:
        nodes.wait_for_starts(2)  # the health check's task and a training task on each node
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        _, stderr = salloc.communicate(timeout=120)
    finally:
        if salloc.poll() is None:
            salloc.kill()
    assert salloc.returncode == 143, stderr
    assert_one_container_for_both_steps(nodes)


# SLURM's USR1 at a batch job's time limit (sbatch --signal=B:USR1@SRUNSH_SAVE_LEAD_S), sent by the test once the
# job is where it should land: slurmctld sends it up to a minute early, at a moment of its own 30 s clock, which on a
# 1-minute job may fall anywhere (tests/test_srun_batch.py has SLURM send it). In training, the ranks save and the
# job requeues; before training (the health check then runs to its verdict), the job requeues untrained.
TIME_LIMIT_AT = {
    "training": {"FAKE_SLEEP": "300", "FAKE_SLEEP_RESUMED": "0"},
    "the health check": {},
}


def time_limit_signal_when(nodes: Nodes, job: str, when: str) -> None:
    """USR1 to the batch script alone, as SLURM's B: signal, once the job's first run is in training or in its
    health check."""
    if when == "training":
        nodes.world.wait_for_ranks(len(NODES), timeout=90)
    else:
        deadline = time.monotonic() + 90
        while sum("health_check" in call for call in nodes.world.calls()) < len(NODES):
            assert time.monotonic() < deadline, nodes.all_events()
            time.sleep(0.2)
    signalled = nodes.world.on_login_node(["scancel", "--batch", "--signal=USR1", job])
    assert signalled.returncode == 0, signalled.stderr


@pytest.mark.parametrize("when", TIME_LIMIT_AT)
def test_a_batch_job_removes_each_launchs_container_before_it_requeues_at_its_time_limit(nodes: Nodes, when: str):
    env = nodes.env(SRUNSH_HEALTH="1", FAKE_CHECKPOINT="1", SRUNSH_SAVE_LEAD_S="45", **TIME_LIMIT_AT[when])
    submitted = nodes.world.on_login_node(
        [str(SRUN_SH), "--sbatch", *SHARED[1:], "--time=10", "--", "recipe.py"], env=env
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.split()[4].rstrip(":")
    time_limit_signal_when(nodes, job, when)
    deadline = time.monotonic() + 180
    while nodes.world.cluster.job_listed(job):
        assert time.monotonic() < deadline, nodes.all_events()
        time.sleep(1)

    log = (nodes.world.dir / "outputs" / "recipe" / f"slurm-{job}.out").read_text()
    first_run, second_run = log.split("# srun.sh: knobs from the environment:")[1:]
    records = nodes.world.records()
    assert sorted(records) == [0, 1]
    assert {record["env"]["SLURM_RESTART_COUNT"] for record in records.values()} == {"1"}
    if when == "training":
        assert "saved before the time limit (exit status 0): requeueing job" in first_run, log
        assert {record["resumed_from"] for record in records.values()} == {f"run={job} restart=0 saved at SIGTERM"}
    else:
        signal_at = first_run.index("reaches its time limit in 45s before training started")
        assert signal_at < first_run.index("srun.sh: health check passed on all 2 node(s)"), log
        assert "its time limit came before training started: requeueing job" in first_run, log
        assert "rank 0 started" not in first_run, log
        assert {record["resumed_from"] for record in records.values()} == {None}  # the first run saved nothing
    assert "rank 0 started" in second_run and "requeueing" not in second_run, log
    for node in NODES:
        events = nodes.events(node)
        first, second = nodes.created(node)  # one a launch: the job's first run and its requeue
        assert LAUNCH_NAME.fullmatch(first)["run"] == LAUNCH_NAME.fullmatch(second)["run"] == job
        order = [(e[0], e[1]) for e in events if e[0] in ("create", "remove")]
        assert order == [("create", first), ("remove", first), ("create", second), ("remove", second)], events
        assert nodes.containers(node) == []


def test_a_second_launch_with_a_changed_image_never_sees_the_first_launchs_container(nodes: Nodes):
    first, pid_file = nodes.world.start_in_allocation(
        "recipe.py", salloc=SHARED, env=nodes.env(SRUNSH_HEALTH="1", FAKE_SLEEP="300")
    )
    try:
        nodes.wait_for_starts(2)
        (running,) = {container for node in NODES for container in nodes.containers(node)}
        before = {node: len(nodes.events(node)) for node in NODES}
        replaced = squash_file(nodes.world.dir / "new.sqsh", b"another image")
        replaced.replace(nodes.image)  # the same path, another file: as a rebuilt image is copied into place
        second, _ = nodes.world.in_allocation("recipe.py", salloc=SHARED, env=nodes.env(SRUNSH_HEALTH="1"))
        assert second.returncode == 0, second.stderr
        for node in NODES:
            assert nodes.containers(node) == [running]  # the first launch's, still in use, untouched
            later = nodes.events(node)[before[node] :]
            (created,) = [e for e in later if e[0] == "create"]
            assert created[1] != running
            assert (nodes.data(node) / running / "image").exists()
            assert all(e[1] != running for e in later), later
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
        first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    for node in NODES:
        assert nodes.containers(node) == []


@pytest.fixture
def squashfuse_site(nodes: Nodes) -> Iterator[Path]:
    """The cluster's plugstack configuration as sites lay it out: an include of plugstack.conf.d, whose pyxis.conf
    turns squashfuse on. pyxis itself is optional (the stand-in plays it), so SLURM runs steps without it."""
    assert nodes.world.cluster is not None
    plugstack = nodes.world.cluster.root / "plugstack.conf"
    drop_ins = nodes.world.cluster.root / "plugstack.conf.d"
    drop_ins.mkdir(exist_ok=True)
    (drop_ins / "pyxis.conf").write_text(
        "optional /usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis use_squashfuse=1 # squashfuse\n"
    )
    plugstack.write_text(f"# site plugins\ninclude {drop_ins}/*.conf\n")
    yield plugstack
    plugstack.write_text("")


def test_with_use_squashfuse_the_steps_stay_unnamed(nodes: Nodes, squashfuse_site: Path):
    result, _ = nodes.world.in_allocation("recipe.py", env=nodes.env(SRUNSH_HEALTH="1"))

    assert result.returncode == 0, result.stderr
    for node in NODES:
        created = nodes.created(node)
        assert len(created) == 2 and not any(LAUNCH_NAME.fullmatch(name) for name in created), created
    assert f"container start: from the squash file, no unpack (use_squashfuse=1 in {squashfuse_site})" in (
        result.stderr
    )


# ---- launcher/host/container.py on its own --------------------------------------------------------------------------

# pyxis's README: its plugstack line, in a drop-in that the site's plugstack.conf includes.
PYXIS_README_LINE = "required /usr/local/lib/slurm/spank_pyxis.so\n"


def test_a_containers_tmp_is_new_at_every_launch_as_enroot_mounts_it(nodes: Nodes):
    """What SRUNSH_COMPILE_CACHE is for: the stand-in, like enroot, gives every task a new tmpfs on /tmp, so what a
    rank leaves there is gone at the next launch."""
    rank = nodes.world.dir / "rank-leaving-a-file-in-tmp"
    rank.write_text('#!/bin/sh\nls -A /tmp >"$RUN_DIR/tmp-$RANK.txt"\ntouch "/tmp/left-by-$RUN_ID"\n')
    rank.chmod(0o755)
    for _ in range(2):
        result, _ = nodes.world.in_allocation("recipe.py", salloc=SHARED, env=nodes.env(SRUNSH_PYTHON=str(rank)))
        assert result.returncode == 0, result.stderr

    first, second = nodes.world.run_dirs()
    for rank_id in (0, 1):
        assert not [name for name in (second / f"tmp-{rank_id}.txt").read_text().split() if name.startswith("left")]
    assert (first / "tmp-0.txt").exists()


def test_a_ranks_compiled_kernels_outlive_its_container_in_its_nodes_compile_cache(nodes: Nodes):
    """Real torch.compile in each rank of two nodes, at two launches: the second launch's ranks hit TorchInductor's
    FX graph cache, each in its own node's SRUNSH_COMPILE_CACHE (the test nodes' own disks), though their /tmp is
    new (the test above)."""
    assert nodes.world.cluster is not None
    local = nodes.world.cluster.root / "local"  # each node sees its own disk there
    env = nodes.env(SRUNSH_PYTHON=str(FIXTURES / "compiling_python"), SRUNSH_COMPILE_CACHE=f"{local}/compile-cache")
    for node in NODES:  # a mount's source exists on every node, as pyxis needs
        (nodes.world.cluster.hosts[node].local / "compile-cache").mkdir()
    reports = []
    try:
        for _ in range(2):
            result, _ = nodes.world.in_allocation("recipe.py", salloc=SHARED, env=env, timeout=300)
            assert result.returncode == 0, result.stderr
            logs = nodes.world.run_dirs()[-1] / "logs"
            reports.append([json.loads((logs / f"rank-{r}.log").read_text().splitlines()[-1]) for r in (0, 1)])

        assert [[r["fx_graph_cache"] for r in launch] for launch in reports] == [[{"miss": 1}] * 2, [{"hit": 1}] * 2]
        folder = f"{local}/compile-cache/srunsh-compile-cache-uid{os.getuid()}/local-rank-0"
        assert {r["TORCHINDUCTOR_CACHE_DIR"] for r in reports[1]} == {f"{folder}/inductor"}
        for node in NODES:
            own = nodes.world.cluster.hosts[node].local / "compile-cache"
            assert (own / f"srunsh-compile-cache-uid{os.getuid()}" / "local-rank-0" / "inductor" / "fxgraph").is_dir()
    finally:
        for node in NODES:
            shutil.rmtree(nodes.world.cluster.hosts[node].local / "compile-cache", ignore_errors=True)


def test_plugstack_include_is_followed_from_the_including_files_folder(tmp_path: Path):
    (tmp_path / "plugstack.conf.d").mkdir()
    (tmp_path / "plugstack.conf.d" / "pyxis.conf").write_text(PYXIS_README_LINE)
    (tmp_path / "plugstack.conf").write_text("optional /usr/lib/slurm/other.so a=b\ninclude plugstack.conf.d/*\n")

    pyxis = read_pyxis(str(tmp_path / "plugstack.conf"))

    assert pyxis.found and not pyxis.squashfuse and pyxis.options == {}


def test_an_unreadable_plugstack_is_said_and_taken_as_pyxis_default(tmp_path: Path):
    image = squash_file(tmp_path / "i.sqsh")
    pyxis = read_pyxis(str(tmp_path / "missing.conf"))

    assert pyxis.file is None
    note = start_note(pyxis, image, 2, "", "srunsh-r-0123456789ab")
    assert note.startswith("container start: pyxis's settings unread")
    assert "once, into srunsh-r-0123456789ab" in note


OPTION = st.sampled_from(["use_squashfuse", "container_scope", "runtime_path", "sbatch_support", "remap_root"])
VALUE = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789/_.", min_size=1, max_size=12)


@given(options=st.dictionaries(OPTION, VALUE), kind=st.sampled_from(["required", "optional"]))
def test_pyxis_options_are_read_as_written(tmp_path_factory, options: dict[str, str], kind: str):
    conf = tmp_path_factory.mktemp("plugstack") / "plugstack.conf"
    words = " ".join(f"{key}={value}" for key, value in options.items())
    conf.write_text(f"# comment\n\n{kind}   /opt/slurm/lib/spank_pyxis.so {words}  # trailing\n")

    pyxis = read_pyxis(str(conf))

    assert pyxis.found and pyxis.options == options
    assert pyxis.squashfuse == (options.get("use_squashfuse") in ("1", "true", "yes", "y"))
    assert plugstack_lines(conf) == [[kind, "/opt/slurm/lib/spank_pyxis.so", *words.split()]]


@given(
    run=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,30}", fullmatch=True),
    launches=st.lists(st.text(min_size=1, max_size=20), min_size=2, max_size=2, unique=True),
)
def test_a_launch_container_name_is_the_launchs_own(tmp_path_factory, run: str, launches: list[str]):
    image = squash_file(tmp_path_factory.mktemp("image") / "i.sqsh")
    name = launch_container_name(run, image, launches[0])

    assert name == launch_container_name(run, image, launches[0])
    assert name != launch_container_name(run, image, launches[1])
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", name) and name.startswith(f"srunsh-{run}-")
    os.utime(image, ns=(0, image.stat().st_mtime_ns + 1))  # the image rewritten, to the same size
    assert name != launch_container_name(run, image, launches[0])


def test_a_squashfuse_site_notes_no_unpack():
    note = start_note(Pyxis(file="/etc/slurm/plugstack.conf", found=True, options={"use_squashfuse": "y"}),
                      Path("/dev/null"), 2, "", "")  # fmt: skip

    assert note == "container start: from the squash file, no unpack (use_squashfuse=1 in /etc/slurm/plugstack.conf)"
