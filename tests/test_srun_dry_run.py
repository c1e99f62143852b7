"""srun.sh --dry-run: prints copy-pasteable commands, starts nothing, and works outside an allocation.

"Copy-pasteable" is checked literally: the printed lines are run by bash, and bash's words are compared."""

import subprocess
from pathlib import Path

import pytest

from tests.srun_world import HOSTILE_ARGS, REPO, SQUASHFS_MAGIC, SrunWorld

pytest_plugins = ["tests.srun_world"]

EXPECTED_ARGS = [arg.encode() for arg in HOSTILE_ARGS]


def bash_words(line: str) -> list[bytes]:
    """The words bash makes of one printed command line."""
    script = 'words() { printf "%s\\0" "$@"; }\nwords ' + line + "\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    return out.split(b"\0")[:-1]


def lines_starting(output: str, prefix: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(prefix)]


def test_dry_run_local_prints_a_torchrun_command_that_runs_unchanged_when_pasted(srun_world: SrunWorld):
    result = srun_world.srun_sh("--dry-run", "--local", "recipe.py", *HOSTILE_ARGS, env={"SRUNSH_GPUS_PER_NODE": "2"})

    assert result.returncode == 0, result.stderr
    assert srun_world.calls() == []
    assert srun_world.run_dirs() == []
    exports = [line for line in result.stdout.splitlines() if line.startswith(("export ", "unset "))]
    (launch_line,) = [line for line in result.stdout.splitlines() if not line.startswith(("#", "export ", "unset "))]
    words = bash_words(launch_line)
    assert words[1:3] == [b"-m", b"torch.distributed.run"]
    assert b"--nproc-per-node=2" in words

    # Paste the environment and the launch command into a fresh bash: the ranks must see exactly the arguments.
    pasted = "\n".join([*exports, launch_line])
    subprocess.run(["bash", "-c", pasted], cwd=srun_world.dir, env=srun_world.env, check=True, timeout=60)
    records = srun_world.records()
    assert sorted(records) == [0, 1]
    for rank, record in records.items():
        assert record["argv"] == [str(REPO / "entrypoint.py").encode(), b"recipe.py", *EXPECTED_ARGS]
        assert (record["env"]["RANK"], record["env"]["MASTER_ADDR"]) == (str(rank), "127.0.0.1")
        assert record["env"]["NCCL_DEBUG"] == "WARN"


def test_dry_run_with_container_runs_the_checkouts_code_through_mount_in_an_unnamed_container(
    srun_world: SrunWorld, tmp_path: Path
):
    """A checkout on a shared file system mounted at the same path: the ranks run its code, not the image's copy."""
    image = tmp_path / "image.sqsh"
    image.write_bytes(SQUASHFS_MAGIC)
    shared = REPO.parent  # stands in for /fsx
    env = {
        "SRUNSH_SQSH": str(image),
        "SRUNSH_MOUNT": f"{shared}:/fsx,{srun_world.dir}:/work",
        "SRUNSH_GPUS_PER_NODE": "8",
        "SRUNSH_PYTHON": "python3",
    }
    result = srun_world.srun_sh("--dry-run", "recipe.py", *HOSTILE_ARGS, env=env)

    assert result.returncode == 0, result.stderr
    assert srun_world.calls() == []
    assert "nsys" not in result.stdout.replace("unset SRUNSH_NSYS", "")
    (srun_line,) = lines_starting(result.stdout, "srun ")
    words = bash_words(srun_line)
    code = f"/fsx/{REPO.name}".encode()
    assert words[: words.index(b"--rank-exec")] == [
        b"srun",
        b"--nodes=1",
        b"--ntasks=8",
        b"--ntasks-per-node=8",
        b"--distribution=block",
        b"--mpi=none",
        b"--kill-on-bad-exit=1",
        words[7],
        b"--container-image=" + bytes(image),
        b"--container-mounts=" + env["SRUNSH_MOUNT"].encode() + b",/var/tmp:/var/tmp",  # SRUNSH_COMPILE_CACHE's
        b"--container-workdir=/work",
        code + b"/srun.sh",
    ]
    assert words[7].startswith(b"--job-name=srunsh-JOBID-")
    assert not any(word.startswith(b"--container-name") for word in words)
    command = [b"python3", code + b"/entrypoint.py", b"/work/recipe.py", *EXPECTED_ARGS]
    assert words[words.index(b"--rank-exec") + 1 :] == command
    assert "export RUN_DIR=/work/outputs/recipe/JOBID-" in result.stdout


def test_dry_run_srun_extra_args_are_split_on_whitespace_and_added(srun_world: SrunWorld):
    env = {"SRUNSH_SRUN_EXTRA_ARGS": "  --exclusive\t--time=2:00:00 ", "SRUNSH_GPUS_PER_NODE": "2"}
    result = srun_world.srun_sh("--dry-run", "--no-container", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    (srun_line,) = lines_starting(result.stdout, "srun ")
    words = bash_words(srun_line)
    assert words[words.index(b"--kill-on-bad-exit=1") + 2 : words.index(bytes(REPO / "srun.sh"))] == [
        b"--exclusive",
        b"--time=2:00:00",
    ]


def test_dry_run_gives_pyxis_absolute_paths_for_a_relative_image_and_mount_source(srun_world: SrunWorld):
    """pyxis reads an image name that starts with neither / nor ./ as a registry image to pull, and refuses a mount
    source that is neither a path so written, tmpfs nor umount: srun.sh hands it both as absolute paths."""
    (srun_world.dir / "img.sqsh").write_bytes(SQUASHFS_MAGIC)
    (srun_world.dir / "data").mkdir()
    env = {
        "SRUNSH_SQSH": "img.sqsh",
        "SRUNSH_MOUNT": f"{REPO}:/workspace/megatron,.:/work,data:/data:ro,tmpfs:/scratch",
        "SRUNSH_GPUS_PER_NODE": "1",
    }
    result = srun_world.srun_sh("--dry-run", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    words = bash_words(lines_starting(result.stdout, "srun ")[0])
    assert b"--container-image=" + bytes(srun_world.dir / "img.sqsh") in words
    mounts = f"{REPO}:/workspace/megatron,{srun_world.dir}:/work,{srun_world.dir}/data:/data:ro,tmpfs:/scratch"
    mounts += ",/var/tmp:/var/tmp"  # SRUNSH_COMPILE_CACHE's default
    assert b"--container-mounts=" + mounts.encode() in words


def test_dry_run_names_the_container_when_container_name_is_set(srun_world: SrunWorld):
    (srun_world.dir / "img.sqsh").write_bytes(SQUASHFS_MAGIC)
    env = {
        "SRUNSH_SQSH": "img.sqsh",
        "SRUNSH_MOUNT": f"{REPO}:/workspace/megatron,.:/work",
        "SRUNSH_CONTAINER_NAME": "megatron",
    }
    result = srun_world.srun_sh("--dry-run", "recipe.py", env={**env, "SRUNSH_GPUS_PER_NODE": "1"})

    assert result.returncode == 0, result.stderr
    words = bash_words(lines_starting(result.stdout, "srun ")[0])
    assert words[words.index(b"--container-workdir=/work") + 1] == b"--container-name=megatron"


@pytest.mark.parametrize(
    ("cache", "added", "shown"),
    [("off", "", "off"), ("/var/tmp", ",/var/tmp:/var/tmp", "/var/tmp"), ("/nvme/c/", ",/nvme/c:/nvme/c", "/nvme/c")],
)
def test_dry_run_mounts_the_compile_cache_at_its_own_path_unless_off(
    srun_world: SrunWorld, cache: str, added: str, shown: str
):
    (srun_world.dir / "img.sqsh").write_bytes(SQUASHFS_MAGIC)
    mounts = f"{REPO}:/workspace/megatron,{srun_world.dir}:/work"
    env = {"SRUNSH_SQSH": "img.sqsh", "SRUNSH_MOUNT": mounts, "SRUNSH_COMPILE_CACHE": cache}
    result = srun_world.srun_sh("--dry-run", "recipe.py", env={**env, "SRUNSH_GPUS_PER_NODE": "1"})

    assert result.returncode == 0, result.stderr
    assert b"--container-mounts=" + (mounts + added).encode() in bash_words(lines_starting(result.stdout, "srun ")[0])
    assert f"export SRUNSH_COMPILE_CACHE={shown}" in lines_starting(result.stdout, "export ")


def test_dry_run_does_not_mount_a_compile_cache_the_user_mounts_already(srun_world: SrunWorld):
    (srun_world.dir / "img.sqsh").write_bytes(SQUASHFS_MAGIC)
    mounts = f"{REPO}:/workspace/megatron,/var/tmp:/var/tmp,{srun_world.dir}:/work"
    env = {"SRUNSH_SQSH": "img.sqsh", "SRUNSH_MOUNT": mounts, "SRUNSH_GPUS_PER_NODE": "1"}
    result = srun_world.srun_sh("--dry-run", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    assert b"--container-mounts=" + mounts.encode() in bash_words(lines_starting(result.stdout, "srun ")[0])


def test_dry_run_mounts_the_local_checkpoint_directory_where_the_command_line_turns_local_checkpoints_on(
    srun_world: SrunWorld,
):
    """An interactive launch's local checkpoints are read back by a launch of the same run id on the same nodes: they
    must be on the node's disk, not in the container's own /var/tmp, which goes with the container."""
    (srun_world.dir / "img.sqsh").write_bytes(SQUASHFS_MAGIC)
    nvme = srun_world.dir / "nvme"
    mounts = f"{REPO}:/workspace/megatron,{srun_world.dir}:/work"
    env = {"SRUNSH_SQSH": "img.sqsh", "SRUNSH_MOUNT": mounts, "SRUNSH_GPUS_PER_NODE": "1"}
    env["SRUNSH_LOCAL_CKPT_DIR"] = str(nvme)
    for overrides, mounted in (((), False), (("checkpoint.non_persistent_ckpt_type=local",), True)):
        result = srun_world.srun_sh("--dry-run", "recipe.py", *overrides, env=env)
        assert result.returncode == 0, result.stderr
        words = bash_words(lines_starting(result.stdout, "srun ")[0])
        (mounts,) = [word for word in words if word.startswith(b"--container-mounts=")]
        assert (f"{nvme}:{nvme}".encode() in mounts.split(b"=", 1)[1].split(b",")) is mounted, mounts
