"""launcher/run_files.py's helpers for the reports at scale: removing many files at once, and reading many records
without the cyclic garbage collector."""

import contextlib
import gc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher import run_files

NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,30}", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(names=st.sets(NAMES, max_size=80), removed=st.data())
def test_remove_all_removes_the_files_named_and_no_other_and_passes_over_a_missing_one(
    tmp_path_factory: pytest.TempPathFactory, names: set[str], removed: st.DataObject
):
    folder = tmp_path_factory.mktemp("run")
    for name in names:
        (folder / name).write_text("x")
    gone = removed.draw(st.sets(st.sampled_from(sorted(names)))) if names else set()
    missing = {f"{name}.missing" for name in list(names)[:3]}

    run_files.remove_all(folder / name for name in gone | missing)

    assert {path.name for path in folder.iterdir()} == names - gone


@given(enabled=st.booleans(), fails=st.booleans())
def test_many_records_reads_with_the_cycle_collector_off_and_leaves_it_as_it_found_it(enabled: bool, fails: bool):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    seen = []
    try:
        with pytest.raises(KeyError) if fails else contextlib.nullcontext(), run_files.many_records():
            seen.append(gc.isenabled())
            if fails:
                raise KeyError("a record")
        assert seen == [False] and gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_remove_rank_statuses_removes_only_the_status_records(tmp_path: Path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("rank-0.status", "rank-12.status", "rank-0.log", "launcher.log", "requeues.log"):
        (logs / name).write_text("x")

    run_files.remove_rank_statuses(str(tmp_path))

    assert sorted(path.name for path in logs.iterdir()) == ["launcher.log", "rank-0.log", "requeues.log"]


@settings(max_examples=30, deadline=None)
@given(files=st.sets(st.lists(NAMES, min_size=1, max_size=3).map("/".join), max_size=40))
def test_remove_tree_removes_every_file_and_folder_below_and_nothing_a_link_points_to(
    tmp_path_factory: pytest.TempPathFactory, files: set[str]
):
    root, outside = tmp_path_factory.mktemp("hang"), tmp_path_factory.mktemp("outside")
    (outside / "kept").write_text("x")
    for name in files:
        path = root / name
        with contextlib.suppress(OSError):  # a name drawn both as a file and as a folder: the first one stays
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")
    (root / ".link").symlink_to(outside, target_is_directory=True)

    run_files.remove_tree(root)
    run_files.remove_tree(root)  # gone already: nothing to do

    assert not root.exists() and (outside / "kept").read_text() == "x"
