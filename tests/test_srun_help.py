"""srun.sh --help documents every option and knob, and starts nothing."""

import re

from tests.srun_world import REPO, SrunWorld

pytest_plugins = ["tests.srun_world"]


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
