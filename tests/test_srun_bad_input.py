"""Nothing starts wrong: every bad input to srun.sh gives one line on stderr that names the problem and the fix, a
non-zero exit, and starts nothing (no rank, and inside an allocation of the test SLURM no job step either)."""

import dataclasses
from pathlib import Path

import pytest

from tests.srun_world import ALLOCATION, REPO, SQUASHFS_MAGIC, SrunWorld

pytest_plugins = ["tests.srun_world"]

NOT_IN_ALLOCATION = "srun.sh: not inside a SLURM allocation: run under salloc/sbatch, or use --local / --dry-run\n"


@dataclasses.dataclass
class Case:
    args: list[str]
    says: list[str]  # fragments of the one stderr line: the problem and the fix
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    in_allocation: bool = False  # run under salloc on the test SLURM, and check that no job step ran
    salloc: tuple[str, ...] = ()  # run under salloc with these options (implies in_allocation)
    status: int = 2


def image_env(world: Path, **extra: str) -> dict[str, str]:
    """A container-mode setup that is valid apart from what `extra` breaks."""
    return {"SRUNSH_SQSH": "image.sqsh", "SRUNSH_MOUNT": f"{REPO}:/workspace/megatron,{world}:{world}", **extra}


def cases(world: Path) -> dict[str, Case]:
    local = ["--local", "recipe.py"]
    return {
        "unknown option": Case(
            ["--bogus", "recipe.py"], ["unknown option --bogus", "the options are --nsys"], in_allocation=True
        ),
        "unknown short option": Case(["-x", "recipe.py"], ["unknown option -x", "--help"]),
        "option after recipe": Case(
            ["recipe.py", "a=1", "--nsys"],
            ["option --nsys comes after the recipe", "./srun.sh --nsys recipe.py"],
            in_allocation=True,
        ),
        "help after recipe": Case([*local, "--help"], ["option --help comes after the recipe", "put it first"]),
        "missing recipe": Case([], ["no recipe given", "usage is ./srun.sh [options] RECIPE.py"]),
        "only options": Case(["--local", "--nsys"], ["no recipe given"]),
        "recipe not found": Case(
            ["--no-container", "missing.py"],
            ["recipe missing.py is not a readable file", "check the path"],
            in_allocation=True,
        ),
        "recipe is a directory": Case(["--local", "records"], ["recipe records is not a readable file"]),
        "recipe is a dangling link": Case(["--local", "dangling.py"], ["recipe dangling.py is not a readable file"]),
        "image missing": Case(
            ["recipe.py"],
            ["image SRUNSH_SQSH=/nonexistent/megatron.sqsh does not exist", "make build"],
            env=image_env(world, SRUNSH_SQSH="/nonexistent/megatron.sqsh"),
            in_allocation=True,
        ),
        "image not a squashfs file": Case(
            ["--dry-run", "recipe.py"],
            ["image SRUNSH_SQSH=", "plain.txt is not a squashfs file", "make build"],
            env=image_env(world, SRUNSH_SQSH="plain.txt"),
        ),
        "output root in a read-only mount": Case(
            ["--dry-run", "recipe.py"],
            [
                f"SRUNSH_OUTPUT_ROOT {world}/outputs/recipe is in SRUNSH_MOUNT entry {world}:/w:ro",
                "read-only",
                "drop :ro",
            ],
            env=image_env(world, SRUNSH_MOUNT=f"{REPO}:/workspace/megatron,{world}:/w:ro"),
        ),
        "output root in a read-only mount, flags joined": Case(
            ["--dry-run", "recipe.py"],
            ["read-only"],
            env=image_env(world, SRUNSH_MOUNT=f"{REPO}:/workspace/megatron,{world}:/w:rprivate+ro"),
        ),
        "output root cannot be created": Case(
            local,
            [f"cannot create the run folder {world}/recipe.py/out/recipe", "Not a directory", "set SRUNSH_OUTPUT_ROOT"],
            env={"SRUNSH_OUTPUT_ROOT": "recipe.py/out"},
        ),
        "relative mount source missing": Case(
            ["--dry-run", "recipe.py"],
            ["SRUNSH_MOUNT source data does not exist on this host"],
            env=image_env(world, SRUNSH_MOUNT=f"data:/data,{world}:/w"),
        ),
        "not in an allocation": Case(["--no-container", "recipe.py"], [NOT_IN_ALLOCATION.strip()]),
        "not in an allocation, container": Case(["recipe.py"], [NOT_IN_ALLOCATION.strip()], env=image_env(world)),
        "gpus per node not a number": Case(
            ["--no-container", "recipe.py"],
            ["SRUNSH_GPUS_PER_NODE=abc is not a positive integer", "SRUNSH_GPUS_PER_NODE=8"],
            env={"SRUNSH_GPUS_PER_NODE": "abc"},
            in_allocation=True,
        ),
        "gpus per node zero": Case(
            local, ["SRUNSH_GPUS_PER_NODE=0 is not a positive integer"], env={"SRUNSH_GPUS_PER_NODE": "0"}
        ),
        "gpus per node negative": Case(
            local, ["SRUNSH_GPUS_PER_NODE=-1 is not a positive"], env={"SRUNSH_GPUS_PER_NODE": "-1"}
        ),
        "removed knob import all": Case(
            local,
            ["SRUNSH_IMPORT_ALL, set in the environment, is no knob of srun.sh: unset it or fix its name"],
            env={"SRUNSH_IMPORT_ALL": "1"},
        ),
        "compile cache relative": Case(
            local,
            ["SRUNSH_COMPILE_CACHE=var/tmp is not off or an absolute path", "SRUNSH_COMPILE_CACHE=/var/tmp"],
            env={"SRUNSH_COMPILE_CACHE": "var/tmp"},
        ),
        "compile cache in pyxis's mount syntax": Case(
            ["--dry-run", "recipe.py"],
            ["SRUNSH_COMPILE_CACHE=/nvme/a:/b is not off or an absolute path without spaces, ',' or ':'"],
            env=image_env(world, SRUNSH_COMPILE_CACHE="/nvme/a:/b"),
        ),
        "gpus per node with space": Case(
            local, ["SRUNSH_GPUS_PER_NODE='2 ' is not a positive"], env={"SRUNSH_GPUS_PER_NODE": "2 "}
        ),
        "more gpus than visible": Case(
            local,
            ["SRUNSH_GPUS_PER_NODE=8 but this host shows 2 GPU(s)", "lower SRUNSH_GPUS_PER_NODE"],
            env={"SRUNSH_GPUS_PER_NODE": "8", "CUDA_VISIBLE_DEVICES": "0,1"},
        ),
        "no gpu visible": Case(
            local, ["--local found no GPU", "set CUDA_VISIBLE_DEVICES"], env={"CUDA_VISIBLE_DEVICES": ""}
        ),
        "mount without colon": Case(
            ["--dry-run", "recipe.py"],
            ["SRUNSH_MOUNT entry nocolon is not SRC:DST", "fix SRUNSH_MOUNT"],
            env=image_env(world, SRUNSH_MOUNT="nocolon"),
        ),
        "mount with relative target": Case(
            ["--dry-run", "recipe.py"],
            ["is not SRC:DST[:FLAGS] with an absolute DST"],
            env=image_env(world, SRUNSH_MOUNT=f"{world}:workspace"),
        ),
        "mount with too many fields": Case(
            ["--dry-run", "recipe.py"],
            ["is not SRC:DST[:FLAGS]"],
            env=image_env(world, SRUNSH_MOUNT=f"{world}:/w:ro:x"),
        ),
        "mount only commas": Case(
            ["--dry-run", "recipe.py"],
            ["SRUNSH_MOUNT entry '' is not SRC:DST", "fix SRUNSH_MOUNT"],
            env=image_env(world, SRUNSH_MOUNT=","),
        ),
        "mount source missing": Case(
            ["recipe.py"],
            [
                "SRUNSH_MOUNT source /nonexistent/data does not exist on this host",
                "create it or drop it from SRUNSH_MOUNT",
            ],
            env=image_env(world, SRUNSH_MOUNT=f"/nonexistent/data:/data,{world}:/w"),
            in_allocation=True,
        ),
        "recipe outside every mount": Case(
            ["--dry-run", "recipe.py"],
            [
                "recipe",
                "recipe.py is outside every SRUNSH_MOUNT source, so the ranks cannot see it",
                "add its directory",
            ],
            env=image_env(world, SRUNSH_MOUNT=f"{REPO}:/workspace/megatron"),
        ),
        "nsys not installed": Case(
            ["--nsys", "--no-container", "recipe.py"],
            ["--nsys needs nsys, but SRUNSH_NSYS=/nonexistent/nsys is not found", "set SRUNSH_NSYS="],
            env={"SRUNSH_NSYS": "/nonexistent/nsys"},
            in_allocation=True,
        ),
        "nsys not on PATH": Case(
            ["--nsys", *local],
            ["SRUNSH_NSYS=no-such-nsys-binary is not found", "install Nsight"],
            env={"SRUNSH_NSYS": "no-such-nsys-binary"},
        ),
        "python missing": Case(
            ["--no-container", "recipe.py"],
            ["SRUNSH_PYTHON=/nonexistent/python is not found"],
            env={"SRUNSH_PYTHON": "/nonexistent/python"},
            in_allocation=True,
        ),
        "master port out of range": Case(
            local, ["MASTER_PORT=70000 is not a port number", "1-65535"], env={"MASTER_PORT": "70000"}
        ),
        "dry run still validates knobs": Case(
            ["--dry-run", "--no-container", "recipe.py"],
            ["SRUNSH_GPUS_PER_NODE=x is not a positive integer"],
            env={"SRUNSH_GPUS_PER_NODE": "x"},
        ),
        "run id with a slash": Case(
            local, ["SRUNSH_RUN_ID=../x is not a run name", "use letters, digits"], env={"SRUNSH_RUN_ID": "../x"}
        ),
        "container name with a colon": Case(
            ["--dry-run", "recipe.py"],
            ["SRUNSH_CONTAINER_NAME=megatron:exec is not a container name", "leave it unset"],
            env=image_env(world, SRUNSH_CONTAINER_NAME="megatron:exec"),
        ),
        "checkout outside every mount": Case(
            ["--dry-run", "recipe.py"],
            [f"this checkout {REPO} is outside every SRUNSH_MOUNT source", "add its directory to SRUNSH_MOUNT"],
            env=image_env(world, SRUNSH_MOUNT=f"{world}:/w"),
        ),
        "output root outside every mount": Case(
            ["--dry-run", "recipe.py"],
            ["SRUNSH_OUTPUT_ROOT /elsewhere/recipe is outside every SRUNSH_MOUNT source"],
            env=image_env(world, SRUNSH_OUTPUT_ROOT="/elsewhere"),
        ),
        "heterogeneous job": Case(
            ["--no-container", "recipe.py"],
            ["is heterogeneous (2 components)", "allocate one set of identical nodes"],
            salloc=("--nodes=1", "--gpus-per-node=4", ":", "--nodes=1", "--gpus-per-node=4"),
        ),
        "one cpu for four ranks": Case(
            ["--no-container", "recipe.py"],
            ["has 1 CPU(s) on a node for 4 ranks a node", "salloc --exclusive", "--ntasks-per-node=4"],
            salloc=("--nodes=1", "--partition=shared", "--gpus-per-node=4"),
        ),
        "more ranks than allocated gpus": Case(
            ["--no-container", "recipe.py"],
            ["SRUNSH_GPUS_PER_NODE=4 but job", "has 2 GPU(s) a node", "set SRUNSH_GPUS_PER_NODE=2"],
            env={"SRUNSH_GPUS_PER_NODE": "4"},
            salloc=("--nodes=2", "--gpus-per-node=2"),
        ),
        "health with a recipe": Case(
            ["--health", "recipe.py"],
            [
                "--health runs the health check alone, so recipe.py has no place here",
                "SRUNSH_HEALTH=1 ./srun.sh RECIPE.py",
            ],
        ),
        "health with nsys": Case(["--health", "--nsys"], ["--nsys profiles training, and --health trains nothing"]),
        "health option with a value": Case(["--health=full"], ["unknown option --health=full", "--health"]),
        "health after the recipe": Case([*local, "--health"], ["option --health comes after the recipe"]),
        "health knob not 0 or 1": Case(
            local,
            ["SRUNSH_HEALTH=yes is not 0 or 1", "SRUNSH_HEALTH=1 runs the health check"],
            env={"SRUNSH_HEALTH": "yes"},
        ),
        "health timeout zero": Case(
            ["--local", "--health"],
            ["SRUNSH_HEALTH_TIMEOUT_S=0 is not a positive number of seconds", "SRUNSH_HEALTH_TIMEOUT_S=60"],
            env={"SRUNSH_HEALTH_TIMEOUT_S": "0"},
        ),
        "hang timeout zero": Case(
            ["--no-container", "recipe.py"],
            ["SRUNSH_HANG_TIMEOUT_S=0 is not a positive number of seconds", "SRUNSH_HANG_TIMEOUT_S=900, off, or unset"],
            env={"SRUNSH_HANG_TIMEOUT_S": "0"},
            in_allocation=True,
        ),
        "hang timeout not a number": Case(
            local, ["SRUNSH_HANG_TIMEOUT_S=5m is not a positive number of seconds"], env={"SRUNSH_HANG_TIMEOUT_S": "5m"}
        ),
        "console ranks not a rank list": Case(
            local,
            ["SRUNSH_CONSOLE_RANKS='0;7' is not a rank list", "SRUNSH_CONSOLE_RANKS=0,7 or 0-3, or all"],
            env={"SRUNSH_CONSOLE_RANKS": "0;7"},
        ),
        "console ranks of no rank of the job": Case(
            ["--no-container", "recipe.py"],
            ["SRUNSH_CONSOLE_RANKS=8-15 names no rank of this job (ranks 0-7): name some of them, or all"],
            env={"SRUNSH_CONSOLE_RANKS": "8-15"},
            in_allocation=True,
        ),
        "console ranks of no rank of the local job": Case(
            local, ["SRUNSH_CONSOLE_RANKS=4 names no rank of this job (ranks 0-3)"], env={"SRUNSH_CONSOLE_RANKS": "4"}
        ),
        "override without a value": Case(
            [*local, "train.train_iters"],
            ["argument train.train_iters is not NAME=VALUE", "write it as NAME=VALUE, e.g. train.train_iters=1000"],
        ),
        "override without a name": Case([*local, "a=1", "=5"], ["argument =5 is not NAME=VALUE"]),
        "override that is empty": Case([*local, ""], ["argument '' is not NAME=VALUE"]),
        "knob name with a typo": Case(
            local,
            ["SRUNSH_GPU_PER_NODE, set in the environment, is no knob", "./srun.sh --help"],
            env={"SRUNSH_GPU_PER_NODE": "2"},
        ),
        "internal mode outside a task": Case(
            ["--rank-exec", "python3"],
            ["--rank-exec is srun.sh's own mode for one rank", "run ./srun.sh RECIPE.py instead"],
        ),
    }


CASE_IDS = list(cases(Path("/")))


@pytest.mark.parametrize("name", CASE_IDS)
def test_bad_input_gives_one_line_error_and_starts_nothing(name: str, request: pytest.FixtureRequest):
    case = cases(Path("/"))[name]
    in_allocation = case.in_allocation or bool(case.salloc)
    world: SrunWorld = request.getfixturevalue("slurm_world" if in_allocation else "srun_world")
    case = cases(world.dir)[name]
    (world.dir / "image.sqsh").write_bytes(SQUASHFS_MAGIC + bytes(92))
    (world.dir / "plain.txt").write_text("not an image\n")
    (world.dir / "dangling.py").symlink_to(world.dir / "gone.py")

    if in_allocation:
        result, steps = world.in_allocation(*case.args, env=case.env, salloc=case.salloc or ALLOCATION)
        assert steps == 0, "srun.sh started a job step"
    else:
        result = world.srun_sh(*case.args, env=case.env)

    assert result.returncode == case.status
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), result.stderr
    for fragment in case.says:
        assert fragment in result.stderr
    assert result.stdout == ""
    assert world.records() == {}
    assert world.calls() == []
