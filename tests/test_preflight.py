"""launcher/host/preflight.py reads values as srun.sh's bash did before the checks moved there: its messages quote a
value so that bash reads it back, on one line, and SRUNSH_MOUNT and CUDA_VISIBLE_DEVICES split as bash's read splits
them. Each is compared with bash itself, on text the code did not choose."""

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.host.preflight import fields, q, split_mount, time_limit_seconds, visible_gpus

REPO = Path(__file__).resolve().parent.parent

# Any text an environment variable or an argument can hold (no NUL).
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
MOUNT_TEXT = st.text(st.sampled_from("a/:,.~ -"), max_size=14)


def bash(script: str, *args: str) -> str:
    return subprocess.run(["bash", "-c", script, "bash", *args], capture_output=True, text=True, check=True).stdout


@settings(max_examples=100, deadline=None)
@given(value=TEXT | st.binary(max_size=20).filter(lambda data: b"\0" not in data).map(os.fsdecode))
def test_a_quoted_value_is_one_line_that_bash_reads_back_as_the_value(value: str):
    """Messages and printed commands quote values with q: any text, or any bytes a file name or argument can hold."""
    quoted = q(value)
    assert "\n" not in quoted
    said = subprocess.run(["bash", "-c", f"printf %s {quoted}"], capture_output=True, check=True).stdout
    assert said == os.fsencode(value)


@settings(max_examples=100, deadline=None)
@given(spec=MOUNT_TEXT)
def test_mount_entries_split_as_bash_read_splits_them(spec: str):
    """srun.sh split SRUNSH_MOUNT with IFS=, read -ra, and each entry with IFS=: read -r src dst flags rest."""
    split = 'IFS=, read -ra e <<<"$1"; for x in "${e[@]}"; do IFS=: read -r a b c d <<<"$x"; echo "$a|$b|$c|$d"; done'
    expected = [line.split("|", 3) for line in bash(split, spec).splitlines()]
    entries = [split_mount(entry) for entry in fields(spec, ",")]
    assert [[src, dst, flags] for src, dst, flags, _ in entries] == [fields[:3] for fields in expected]
    assert [more for *_, more in entries] == [bool(fields[3]) for fields in expected]


@settings(max_examples=50, deadline=None)
@given(devices=st.text(st.sampled_from("0,1 \n"), max_size=8))
def test_the_launching_host_counts_the_ids_cuda_visible_devices_lists(devices: str):
    """--local's check on the launching host counts GPUs with the counter every rank runs (launcher/rank/rank.sh): the
    ids of CUDA_VISIBLE_DEVICES's first line, as bash's read splits it, the empty ones left out."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CUDA_VISIBLE_DEVICES", devices)
        assert visible_gpus() == len([device for device in devices.split("\n", 1)[0].split(",") if device])


def test_time_limits_in_every_form_sbatch_takes():
    assert [time_limit_seconds(limit) for limit in ("4", "4:30", "1:00:00", "2-3", "0-0:5", "1-0:0:1")] == [
        240,
        270,
        3600,
        (2 * 24 + 3) * 3600,
        300,
        86401,
    ]
    assert time_limit_seconds("UNLIMITED") is None
