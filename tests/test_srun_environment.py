"""srun.sh under a host's environment (issue 35): variables that other tools, CI systems and shells set
(CONTAINER_NAME, PYTHON, NAME, IMAGE, ...) change nothing of a launch, an old knob name is said to be unread, and the
knobs the environment did set are named, with their values, on the launch's first line."""

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.srun_world import REPO, SQUASHFS_MAGIC, SrunWorld

pytest_plugins = ["tests.srun_world"]

# Names other tools set for themselves; among them the names srun.sh's knobs had before they took the SRUNSH_ prefix,
# and srun.sh's own exports to the ranks.
COMMON = (
    *("CONTAINER_NAME", "PYTHON", "NAME", "IMAGE", "MOUNT", "HEALTH", "NSYS", "SQSH", "DEBUG", "TAG", "IMAGE_NAME"),
    *("GPUS_PER_NODE", "OUTPUT_ROOT", "RUN_ID", "MAX_RETRIES", "SAVE_LEAD_S", "HANG_TIMEOUT_S", "HEALTH_TIMEOUT_S"),
    *("SRUN_EXTRA_ARGS", "WORKDIR", "JOB_NAME", "VERBOSE", "SRUN_SH_IMAGE", "SRUN_SH_MOUNT", "SRUN_SH_JOB_NAME"),
    "SRUN_SH_IMPORT_ALL",
)
NOT_READ = "srun.sh: not read, since srun.sh's knobs have the SRUNSH_ prefix: "
# Any text an environment variable can hold (no NUL).
VALUES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)


def container_launch(world: Path) -> dict[str, str]:
    (world / "img.sqsh").write_bytes(SQUASHFS_MAGIC)
    return {
        "SRUNSH_SQSH": "img.sqsh",
        "SRUNSH_MOUNT": f"{REPO}:/workspace/megatron,{world}:/work",
        "SRUNSH_GPUS_PER_NODE": "2",
        "SRUNSH_RUN_ID": "env-test",
    }


def test_an_inherited_container_name_names_no_container(srun_world: SrunWorld):
    """A host whose CONTAINER_NAME is its own: before issue 35 every launch became that named pyxis container."""
    env = {**container_launch(srun_world.dir), "CONTAINER_NAME": "foo"}
    result = srun_world.srun_sh("--dry-run", "recipe.py", "a=1", env=env)

    assert result.returncode == 0, result.stderr
    assert "--container-name" not in result.stdout
    assert f"{NOT_READ}CONTAINER_NAME (now SRUNSH_CONTAINER_NAME)" in result.stderr.splitlines()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(unrelated=st.dictionaries(st.sampled_from(COMMON), VALUES))
def test_unrelated_variables_change_nothing_of_a_dry_run(srun_world: SrunWorld, unrelated: dict[str, str]):
    env = container_launch(srun_world.dir)
    plain = srun_world.srun_sh("--dry-run", "recipe.py", "a=1", env=env)
    crowded = srun_world.srun_sh("--dry-run", "recipe.py", "a=1", env={**env, **unrelated})

    assert (crowded.returncode, crowded.stdout) == (plain.returncode, plain.stdout)
    said = [line for line in crowded.stderr.splitlines() if not line.startswith(NOT_READ)]
    assert said == plain.stderr.splitlines()


def test_unrelated_variables_change_nothing_of_a_local_launch(srun_world: SrunWorld):
    """What each rank gets from srun.sh: its argv and every variable but the unrelated ones, which it inherits as it
    inherits any variable of the host."""
    env = {"SRUNSH_GPUS_PER_NODE": "2"}
    plain = srun_world.srun_sh("--local", "recipe.py", "a=1", env={**env, "SRUNSH_RUN_ID": "plain"})
    assert plain.returncode == 0, plain.stderr
    before = srun_world.records()
    unrelated = {name: f"{name.lower()} of another tool" for name in COMMON}
    crowded = srun_world.srun_sh("--local", "recipe.py", "a=1", env={**env, "SRUNSH_RUN_ID": "crowded", **unrelated})
    assert crowded.returncode == 0, crowded.stderr
    after = srun_world.records()

    volatile = {*COMMON, "RUN_ID", "RUN_DIR", "MASTER_PORT", "SRUNSH_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
    for rank in (0, 1):
        assert after[rank]["argv"] == before[rank]["argv"]
        same = {name: value for name, value in after[rank]["env"].items() if name not in volatile}
        assert same == {name: value for name, value in before[rank]["env"].items() if name not in volatile}
        assert after[rank]["env"]["RUN_DIR"] == str(srun_world.dir / "outputs" / "recipe" / "crowded")
    expected = " ".join(f"{name} (now SRUNSH_{name})" for name in sorted(OLD_NAMES))
    assert [line for line in crowded.stderr.splitlines() if line.startswith(NOT_READ)] == [NOT_READ + expected]


# The knobs' names before the prefix.
OLD_NAMES = (
    *("CONTAINER_NAME", "PYTHON", "MOUNT", "HEALTH", "NSYS", "SQSH", "GPUS_PER_NODE", "OUTPUT_ROOT", "RUN_ID"),
    *("MAX_RETRIES", "SAVE_LEAD_S", "HANG_TIMEOUT_S", "HEALTH_TIMEOUT_S", "SRUN_EXTRA_ARGS"),
)


def test_the_first_line_of_a_launch_names_the_knobs_from_the_environment(srun_world: SrunWorld):
    env = {"SRUNSH_GPUS_PER_NODE": "1", "MASTER_PORT": "31337", "SRUNSH_SRUN_EXTRA_ARGS": "--exclusive --time=1"}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)

    assert result.returncode == 0, result.stderr
    python = srun_world.env["SRUNSH_PYTHON"]
    assert result.stderr.splitlines()[0] == (
        f"# srun.sh: knobs from the environment: MASTER_PORT=31337 SRUNSH_GPUS_PER_NODE=1 SRUNSH_PYTHON={python}"
        " SRUNSH_SRUN_EXTRA_ARGS='--exclusive --time=1'"
    )
