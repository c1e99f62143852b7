"""bench/container_start.py's table: the image's size and file count, pyxis's start path, and each arm's figures."""

import shutil
import subprocess
from pathlib import Path

import pytest

from bench import container_start

FIGURES = {
    "unnamed": {"step": [40.0, 42.5, 41.0], "launch": [60.0, 61.0, 59.5]},
    "named, first": {"step": [41.0], "launch": [62.0]},
    "named, later": {"step": [0.4], "launch": [19.0]},
}


def test_table_has_one_row_an_arm_with_median_and_every_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    image = tmp_path / "image.sqsh"
    image.write_bytes(b"hsqs" + bytes(2_000_000))

    text = container_start.table(image, "unnamed: unpacked", FIGURES)

    lines = text.splitlines()
    assert lines[0] == f"Image {image} (0.00 GB squashed, n/a files); 2 node(s); pyxis: unnamed: unpacked."
    assert lines[4] == "| unnamed | 41.0 (40.0, 42.5, 41.0) | 60.0 (60.0, 61.0, 59.5) |"
    assert lines[6] == "| named, later | 0.4 (0.4) | 19.0 (19.0) |"


@pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="squashfs-tools is not installed")
def test_file_count_is_read_from_a_real_squash_file(tmp_path: Path):
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    for index in range(5):
        (tree / "a" / f"f{index}").write_text(str(index))
    image = tmp_path / "image.sqsh"
    subprocess.run(["mksquashfs", str(tree), str(image), "-quiet", "-noappend"], check=True, capture_output=True)

    assert container_start.image_files(image) == "8"  # the root, a, a/b and five files
