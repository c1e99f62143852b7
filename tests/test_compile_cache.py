"""SRUNSH_COMPILE_CACHE: every rank keeps its Triton and TorchInductor caches in a folder of its own on its node's disk,
from one launch to the next; refused on the launching host where the nodes would share it, refused by a rank where
another user could write in it. Container launches on the two-node test SLURM: tests/test_srun_container.py.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from launcher.host.mounts import SHARED_TYPES, file_system_type, mount_table, shared_file_system
from tests.srun_world import FIXTURES, SrunWorld

pytest_plugins = ["tests.srun_world"]

MOUNTS = Path("/proc/self/mounts").read_text()


def own_folder(root: Path) -> Path:
    return root / f"srunsh-compile-cache-uid{os.getuid()}"


def last_json_line(log: Path) -> dict:
    return json.loads(log.read_text().splitlines()[-1])


def test_local_ranks_compile_once_and_find_their_kernels_at_the_next_launch(srun_world: SrunWorld):
    """Real torch.compile in the rank, twice: the second launch's rank hits TorchInductor's FX graph cache in its own
    folder of SRUNSH_COMPILE_CACHE, though the host's TMPDIR and XDG_CACHE_HOME point elsewhere."""
    disk = srun_world.dir / "node-disk"
    env = {
        "SRUNSH_GPUS_PER_NODE": "1",
        "SRUNSH_PYTHON": str(FIXTURES / "compiling_python"),
        "SRUNSH_COMPILE_CACHE": str(disk),
        "TMPDIR": str(srun_world.dir),
        "XDG_CACHE_HOME": str(srun_world.dir / "xdg"),
    }
    seen = []
    for _ in range(2):
        result = srun_world.srun_sh("--local", "recipe.py", env=env, timeout=240)
        assert result.returncode == 0, result.stderr
        seen.append(last_json_line(srun_world.run_dirs()[-1] / "logs" / "rank-0.log"))

    assert [report["fx_graph_cache"] for report in seen] == [{"miss": 1}, {"hit": 1}]
    folder = own_folder(disk) / "local-rank-0"
    assert seen[1]["TORCHINDUCTOR_CACHE_DIR"] == str(folder / "inductor")
    assert seen[1]["TRITON_CACHE_DIR"] == str(folder / "triton")
    assert (folder / "inductor" / "fxgraph").is_dir()
    assert stat.S_IMODE(own_folder(disk).stat().st_mode) == 0o700


def test_every_local_rank_gets_a_folder_of_its_own_and_a_users_own_cache_variables_win(srun_world: SrunWorld):
    disk = srun_world.dir / "node-disk"
    env = {"SRUNSH_GPUS_PER_NODE": "3", "SRUNSH_COMPILE_CACHE": f"{disk}/", "TRITON_CACHE_DIR": "/scratch/triton"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    for rank, record in srun_world.records().items():
        assert record["env"]["TORCHINDUCTOR_CACHE_DIR"] == f"{own_folder(disk)}/local-rank-{rank}/inductor"
        assert record["env"]["TRITON_CACHE_DIR"] == "/scratch/triton"
    assert sorted(p.name for p in own_folder(disk).iterdir()) == ["local-rank-0", "local-rank-1", "local-rank-2"]


def test_off_keeps_each_ranks_triton_cache_in_tmp_and_sets_no_inductor_cache(srun_world: SrunWorld):
    result = srun_world.srun_sh(
        "--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "2", "SRUNSH_COMPILE_CACHE": "off"}
    )

    assert result.returncode == 0, result.stderr
    for rank, record in srun_world.records().items():
        assert record["env"]["TRITON_CACHE_DIR"] == f"/tmp/triton_cache_{rank}"
        assert "TORCHINDUCTOR_CACHE_DIR" not in record["env"]


@pytest.mark.parametrize("planted", ["writable by all", "writable by its group", "a link to another folder"])
def test_a_rank_refuses_a_cache_folder_that_is_not_the_users_alone_and_nothing_runs(
    srun_world: SrunWorld, planted: str
):
    """The cache holds shared libraries the rank loads (Triton's launchers, Inductor's kernels), in a directory every
    user of the node may write in: a folder someone else could have planted is refused, in one line."""
    disk = srun_world.dir / "node-disk"
    folder = own_folder(disk)
    if planted == "a link to another folder":
        (srun_world.dir / "elsewhere").mkdir(mode=0o700)
        disk.mkdir()
        folder.symlink_to(srun_world.dir / "elsewhere")
    else:
        folder.mkdir(parents=True)
        folder.chmod(0o777 if planted == "writable by all" else 0o770)
    env = {"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_COMPILE_CACHE": str(disk)}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)

    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "compile cache" in line]
    assert f"compile cache {folder} on " in line and "is not this user's alone" in line
    assert "remove it, or set SRUNSH_COMPILE_CACHE to another directory, or off" in line
    assert srun_world.calls() == []


def test_a_rank_that_cannot_create_its_cache_folder_says_why_in_one_line(srun_world: SrunWorld):
    (srun_world.dir / "a-file").write_text("")
    env = {"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_COMPILE_CACHE": str(srun_world.dir / "a-file")}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)

    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if "cannot create its compile cache" in line]
    assert "(Not a directory)" in line and "SRUNSH_COMPILE_CACHE must be a writable directory on every node" in line
    assert srun_world.calls() == []


def host_directories() -> list[str]:
    """This host's mount points and the folders right below them: paths the launcher did not choose."""
    found = set()
    for point, _ in mount_table(MOUNTS):
        if os.path.isdir(point) and os.access(point, os.R_OK | os.X_OK):
            found.add(point)
            try:
                found.update(entry.path for entry in os.scandir(point) if entry.is_dir(follow_symlinks=False))
            except OSError:
                continue  # a mount point this process may not list
    return sorted(found)


def findmnt(path: str, column: str) -> str:
    """util-linux's answer: COLUMN (FSTYPE, TARGET) of the mount that holds PATH (of mounts stacked there, the last,
    on top); "" where it sees none."""
    done = subprocess.run(["findmnt", "-n", "-o", column, "-T", path], capture_output=True, text=True, check=False)
    return (done.stdout.split() or [""])[-1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(host_directories()))
def test_the_file_system_of_a_directory_of_this_host_is_the_one_findmnt_names(path: str):
    expected = findmnt(path, "FSTYPE")
    if expected:  # findmnt names none for a path under a mount point it cannot see (another namespace's)
        assert file_system_type(os.path.realpath(path), mount_table(MOUNTS)) == expected


@given(st.sampled_from(host_directories()), st.sampled_from(sorted(SHARED_TYPES)), st.text("abc/", max_size=12))
def test_a_directory_on_a_shared_file_system_or_below_one_is_named_with_that_type(path: str, shared: str, below: str):
    """This host's own mount table, with the mount that holds PATH given a shared type instead: PATH and any
    folder below it, existing or not, are on it; / stays local when PATH is not on the root's mount."""
    path = os.path.realpath(path)
    table = mount_table(MOUNTS)
    holder = findmnt(path, "TARGET")
    assume(holder in {point for point, _ in table})  # findmnt sees it, under a name without escapes
    lines = MOUNTS.splitlines()
    index = max(i for i, (point, _) in enumerate(table) if point == holder)
    fields = lines[index].split(" ")
    lines[index] = " ".join([*fields[:2], shared, *fields[3:]])
    changed = "\n".join(lines) + "\n"

    assert shared_file_system(f"{path}/{below}".rstrip("/"), changed) == shared
    if holder != "/":
        assert shared_file_system("/", changed) == ""


def test_paths_with_spaces_in_the_mount_table_are_read_as_the_kernel_wrote_them(tmp_path: Path):
    """The kernel escapes a space in a mount point as \\040: a real tmpfs mounted at such a path, in a mount namespace
    of its own, is found by its name."""
    point = tmp_path / "with space"
    point.mkdir()
    script = f"mount -t tmpfs tmpfs {shlex.quote(str(point))} && cat /proc/self/mounts"
    command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    done = subprocess.run(command, capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"no mount namespace here: {done.stderr.decode().strip()}")
    table = mount_table(done.stdout.decode())
    assert (str(point), "tmpfs") in table
    assert file_system_type(f"{point}/below", table) == "tmpfs"
