"""--nsys: srun.sh turns Megatron Bridge's nsys switch on and tells the ranks; each rank that profiling.profile_ranks
names runs itself again under nsys once its config is resolved (launcher/rank/nsys.py), with one report per run, host
and rank in RUN_DIR/nsys/."""

import json
import os
import re
import shlex
import socket
import sys
from pathlib import Path

import pytest

from launcher.rank import nsys
from tests.conftest import REPO
from tests.srun_world import FIXTURES, SrunWorld

pytest_plugins = ["tests.srun_world"]

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")
# Not in README's table: a resumed run (same RUN_ID) writes its report over the one the run wrote before.
UNDOCUMENTED = ["--force-overwrite=true"]


def documented_nsys_args() -> list[str]:
    """The arguments README's options table says `--nsys` runs nsys with: the code span `nsys profile ...` in the
    table row of `--nsys`, without the leading `nsys`."""
    (row,) = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `--nsys` |")]
    (command,) = [span for span in re.findall(r"`([^`]+)`", row) if span.startswith("nsys profile ")]
    return shlex.split(command)[1:]


def test_readme_documents_the_capture_range_that_limits_the_report_to_the_profiling_window():
    """The table row is where the expected flags come from, so it must hold the ones the profiling window needs."""
    assert "--capture-range=cudaProfilerApi" in documented_nsys_args()
    assert "--capture-range-end=stop" in documented_nsys_args()


def test_nsys_option_tells_the_ranks_and_appends_the_switch_once_never_over_a_user_value(srun_world: SrunWorld):
    appended = srun_world.srun_sh(
        "--nsys", "--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_NSYS": "true"}
    )
    assert appended.returncode == 0, appended.stderr
    record = srun_world.records()[0]
    assert record["argv"][1:] == [b"recipe.py", b"profiling.use_nsys_profiler=true"]
    assert record["env"]["SRUNSH_NSYS"] == "true"  # the nsys the profiled ranks run

    user_set = srun_world.srun_sh(
        "--nsys",
        "--local",
        "recipe.py",
        "profiling.use_nsys_profiler=false",
        env={"SRUNSH_GPUS_PER_NODE": "1", "SRUNSH_NSYS": "true"},
    )
    assert user_set.returncode == 0, user_set.stderr
    assert srun_world.records()[0]["argv"][1:] == [b"recipe.py", b"profiling.use_nsys_profiler=false"]


def test_without_nsys_option_the_ranks_are_not_told_to_profile(srun_world: SrunWorld):
    result = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "2"})

    assert result.returncode == 0, result.stderr
    for record in srun_world.records().values():
        assert "SRUNSH_NSYS" not in record["env"]
        assert b"profiling.use_nsys_profiler=true" not in record["argv"]


@pytest.fixture
def tiny_config(output_root: Path):
    import entrypoint

    cfg, _ = entrypoint.resolve(
        entrypoint.parse_args([TINY, "profiling.use_nsys_profiler=true", "profiling.profile_ranks=[1,3]"])
    )
    return cfg


@pytest.mark.parametrize("rank", range(4))
def test_exactly_the_profile_ranks_run_under_nsys(tiny_config, rank: int, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RUN_DIR", "/runs/r1")
    monkeypatch.setenv("SRUNSH_NSYS", "/opt/nsys/bin/nsys")
    monkeypatch.delenv(nsys.UNDER_NSYS, raising=False)

    command = nsys.profile_command(tiny_config, ["entrypoint.py", "recipe.py", "a=1"])

    if rank not in (1, 3):
        assert command is None
        return
    host = socket.gethostname().split(".")[0]
    assert command == [
        "/opt/nsys/bin/nsys",
        *documented_nsys_args(),
        *UNDOCUMENTED,
        "-o",
        f"/runs/r1/nsys/profile-{host}-rank{rank}",
        sys.executable,
        "entrypoint.py",
        "recipe.py",
        "a=1",
    ]
    monkeypatch.setenv(nsys.UNDER_NSYS, "1")
    assert nsys.profile_command(tiny_config, ["entrypoint.py"]) is None
    monkeypatch.delenv(nsys.UNDER_NSYS)
    monkeypatch.delenv("RUN_DIR")  # a host's SRUNSH_NSYS, set for srun.sh, makes no process outside a launch profile
    assert nsys.profile_command(tiny_config, ["entrypoint.py"]) is None
    monkeypatch.setenv("RUN_DIR", "/runs/r1")
    monkeypatch.delenv("SRUNSH_NSYS")
    assert nsys.profile_command(tiny_config, ["entrypoint.py"]) is None


def test_real_entrypoint_ranks_start_nsys_on_themselves_through_srun_sh(srun_world: SrunWorld):
    env = {
        "SRUNSH_PYTHON": sys.executable,
        "SRUNSH_NSYS": str(FIXTURES / "fake_nsys"),
        "SRUNSH_GPUS_PER_NODE": "2",
        "HF_HUB_OFFLINE": "1",
    }
    result = srun_world.srun_sh(
        "--nsys", "--local", TINY, "profiling.profile_ranks=[]", "train.train_iters=20", env=env, timeout=300
    )

    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (srun_world.dir / "outputs" / "tiny_gpt_pretrain").iterdir()
    host = socket.gethostname().split(".")[0]
    for rank in (0, 1):
        record = json.loads((srun_world.records_dir / f"nsys-rank{rank}.json").read_text())
        argv = [bytes.fromhex(a).decode() for a in record["argv_hex"]]
        assert argv == [
            *documented_nsys_args(),
            *UNDOCUMENTED,
            "-o",
            f"{run_dir}/nsys/profile-{host}-rank{rank}",
            sys.executable,
            str(REPO / "entrypoint.py"),
            TINY,
            "profiling.profile_ranks=[]",
            "train.train_iters=20",
            "profiling.use_nsys_profiler=true",
        ]
    assert (run_dir / "nsys").is_dir()
    assert os.stat(run_dir).st_mode & 0o777 == 0o700
    assert os.stat(run_dir / "nsys").st_mode & 0o777 == 0o700
