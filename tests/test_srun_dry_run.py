"""srun.sh --dry-run: prints copy-pasteable commands, starts nothing, and works outside an allocation.

"Copy-pasteable" is checked literally: the printed lines are run by bash, and bash's words are compared."""

import subprocess
from pathlib import Path

from tests.slurm_cluster import HOSTILE_ARGS, REPO, SrunWorld

pytest_plugins = ["tests.slurm_cluster"]

EXPECTED_ARGS = [arg.encode() for arg in HOSTILE_ARGS]


def bash_words(line: str) -> list[bytes]:
    """The words bash makes of one printed command line."""
    script = 'words() { printf "%s\\0" "$@"; }\nwords ' + line + "\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout
    return out.split(b"\0")[:-1]


def lines_starting(output: str, prefix: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(prefix)]


def test_dry_run_local_prints_rank_commands_that_run_unchanged_when_pasted(srun_world: SrunWorld):
    result = srun_world.srun_sh("--dry-run", "--local", "recipe.py", *HOSTILE_ARGS, env={"GPUS_PER_NODE": "2"})

    assert result.returncode == 0, result.stderr
    assert srun_world.records() == {}
    assert all(call["check"] for call in srun_world.calls())  # the pre-flight ran, no rank did
    exports = lines_starting(result.stdout, "export ")
    rank_lines = lines_starting(result.stdout, "env RANK=")
    assert len(rank_lines) == 2
    assert all(line.startswith("#") or line in exports + rank_lines for line in result.stdout.splitlines())

    # Paste the environment and both rank commands into a fresh bash: the ranks must see exactly the arguments.
    pasted = "\n".join([*exports, *(line + " &" for line in rank_lines), "wait"])
    subprocess.run(["bash", "-c", pasted], cwd=srun_world.dir, env=srun_world.env, check=True, timeout=30)
    records = srun_world.records()
    assert sorted(records) == [0, 1]
    for rank, record in records.items():
        assert record["argv"] == [str(REPO / "entrypoint.py").encode(), b"recipe.py", *EXPECTED_ARGS]
        assert (record["env"]["RANK"], record["env"]["MASTER_ADDR"]) == (str(rank), "127.0.0.1")
        assert record["env"]["NCCL_DEBUG"] == "WARN"


def test_dry_run_with_container_outside_an_allocation_prints_the_pyxis_srun_line(srun_world: SrunWorld, tmp_path: Path):
    image = tmp_path / "image.sqsh"
    image.write_bytes(b"")
    env = {
        "SQSH": str(image),
        "MOUNT": f"{srun_world.dir}:/workspace/megatron",
        "GPUS_PER_NODE": "8",
        "PYTHON": "python3",
    }
    result = srun_world.srun_sh("--dry-run", "recipe.py", *HOSTILE_ARGS, env=env)

    assert result.returncode == 0, result.stderr
    assert srun_world.calls() == []  # the pre-flight needs the image: not run on this host
    (srun_line,) = lines_starting(result.stdout, "srun ")
    words = bash_words(srun_line)
    assert words[: words.index(b"--rank-exec")] == [
        b"srun",
        b"--nodes=1",
        b"--ntasks-per-node=8",
        b"--mpi=pmix",
        b"--kill-on-bad-exit=1",
        b"--label",
        b"--quit-on-interrupt",
        b"--container-image=" + bytes(image),
        b"--container-mounts=" + env["MOUNT"].encode(),
        b"--container-workdir=/workspace/megatron",
        b"--container-name=megatron-JOBID",
        b"/workspace/megatron/srun.sh",
    ]
    command = [b"python3", b"/workspace/megatron/entrypoint.py", b"/workspace/megatron/recipe.py", *EXPECTED_ARGS]
    assert words[words.index(b"--rank-exec") + 1 :] == command
    (rank_line,) = lines_starting(result.stdout, "env RANK=")
    assert bash_words(rank_line)[-len(command) :] == command


def test_dry_run_srun_extra_args_are_split_on_whitespace_and_added(srun_world: SrunWorld):
    env = {"SRUN_EXTRA_ARGS": "  --exclusive\t--time=2:00:00 ", "GPUS_PER_NODE": "2"}
    result = srun_world.srun_sh("--dry-run", "--no-container", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    (srun_line,) = lines_starting(result.stdout, "srun ")
    words = bash_words(srun_line)
    assert words[words.index(b"--quit-on-interrupt") + 1 : words.index(bytes(REPO / "srun.sh"))] == [
        b"--exclusive",
        b"--time=2:00:00",
    ]
