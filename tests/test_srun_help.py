"""srun.sh --help documents every option and knob, and starts nothing; each knob's default is the one --help states,
as the dry runs show it (the expected values come from the help text, never from srun.sh's own assignments)."""

import re
import shlex
import subprocess

from tests.srun_world import REPO, SQUASHFS_MAGIC, SRUN_SH, SrunWorld

pytest_plugins = ["tests.srun_world"]

# A knob line of --help: `  NAME=${NAME:-DEFAULT}`, DEFAULT one shell word (possibly quoted, possibly empty).
KNOB_LINE = re.compile(r"^\s+([A-Z][A-Z0-9_]*)=\$\{\1:-(.*)\}$", flags=re.MULTILINE)
# What differs between two dry runs a moment apart: the run id's time (and pid with --local), the port derived from it.
RUN_TIME = re.compile(r"\d{8}-\d{6}(-\d+)?")
PORT = re.compile(r"(MASTER_PORT=|--master-port=)\d+")
# The dry runs of each kind of launch, outside an allocation.
DRY_RUNS = (
    ("--dry-run", "--local", "recipe.py"),
    ("--dry-run", "--no-container", "recipe.py"),
    ("--dry-run", "recipe.py"),
    ("--dry-run", "--nsys", "recipe.py"),  # the ranks get SRUNSH_NSYS under --nsys only
    ("--dry-run", "--health", "--local"),
    ("--sbatch", "--nodes=2", "--", "--dry-run", "recipe.py"),
)


def test_help_lists_every_option_and_knob_and_starts_nothing(srun_world: SrunWorld):
    result = srun_world.srun_sh("--help")

    assert result.returncode == 0
    assert result.stderr == ""
    assert srun_world.calls() == []
    script = (REPO / "srun.sh").read_text()
    knobs = re.findall(r"^([A-Z_]+)=\$\{\1:-", script, flags=re.MULTILINE)
    assert len(knobs) >= 9
    for name in [*knobs, "--nsys", "--dry-run", "--no-container", "--local", "--health", "--help"]:
        assert re.search(rf"^\s+(-h, )?{name}\b", result.stdout, flags=re.MULTILINE), name


KNOBS_FROM_ENVIRONMENT = re.compile(r"# (srun\.sh: )?knobs from the environment: ")


def documented_defaults(help_text: str) -> dict[str, str]:
    """Every knob of --help and its stated default, with $REPO_DIR (srun.sh's folder) filled in."""
    defaults = {}
    for name, word in KNOB_LINE.findall(help_text):
        value = shlex.split(word)[0] if word else ""
        defaults[name] = value.replace("$REPO_DIR", str(REPO))
    return defaults


def another_value(default: str) -> str:
    return str(int(default) + 1) if default.isdigit() else default + "-other"


def dry_runs(world: SrunWorld, env: dict[str, str]) -> list[str]:
    """What each dry run prints (stdout and stderr), less what differs from one second to the next and the line that
    lists the knobs the environment set (it names a knob set to its default, by design)."""
    outputs = []
    for args in DRY_RUNS:
        result = subprocess.run(
            [str(SRUN_SH), *args], cwd=world.dir, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        text = f"exit {result.returncode}\n{result.stdout}{result.stderr}"
        text = "".join(line for line in text.splitlines(keepends=True) if not KNOBS_FROM_ENVIRONMENT.match(line))
        outputs.append(PORT.sub(r"\1<port>", RUN_TIME.sub("<time>", text)))
    return outputs


def test_every_knob_left_unset_behaves_as_set_to_the_default_its_help_line_states(srun_world: SrunWorld):
    """Per knob with a stated default: the dry runs are the same with it unset and with it set to that default, and
    a dry run shows the value of all but a few knobs (another value changes what it prints), so the comparison can
    fail. Knobs are found by their help lines, whatever their names."""
    stated = documented_defaults(srun_world.srun_sh("--help").stdout)
    defaults = {name: value for name, value in stated.items() if value}
    assert len(defaults) >= 6, defaults
    # A dry run in the container stops at a missing image, then at a missing mount source (/fsx here): with both
    # set to what exists here, it gets to the knobs after them.
    (image,) = [name for name, value in defaults.items() if value.endswith(".sqsh")]
    (mounts,) = [name for name, value in defaults.items() if re.fullmatch(r"[^:,]+:[^:,]+(,[^:,]+:[^:,]+)*", value)]
    world = srun_world.dir
    (world / "image.sqsh").write_bytes(SQUASHFS_MAGIC + bytes(92))
    prepared = {image: str(world / "image.sqsh"), mounts: f"{REPO}:/workspace/megatron,{world}:{world}"}
    unset_env = {name: value for name, value in srun_world.env.items() if name not in defaults}
    shown = []
    for name, default in defaults.items():
        base = {**unset_env, **{knob: value for knob, value in prepared.items() if knob != name}}
        unset = dry_runs(srun_world, base)
        assert dry_runs(srun_world, {**base, name: default}) == unset, f"{name}={default} is not the default"
        if dry_runs(srun_world, {**base, name: prepared.get(name) or another_value(default)}) != unset:
            shown.append(name)
    unseen = sorted(set(defaults) - set(shown))
    assert len(unseen) <= 2, f"no dry run shows {unseen}"
