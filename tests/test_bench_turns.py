"""bench/bench_turns.py: its options, and the report written from a recorded call and its event files."""

import json
from pathlib import Path

import pytest

from bench import bench_turns
from tests.test_per_step import write_events

ARMS = {
    "ours": {"command": ["srun.sh", "--local"], "env": {"SRUNSH_GPUS_PER_NODE": "1"}, "note": "the shipped recipe"},
    "upstream": {"command": ["torchrun"], "env": {"SRUNSH_GPUS_PER_NODE": "1"}, "note": "launched by torchrun"},
    "seed": {"command": ["srun.sh", "--local"], "env": {"SRUNSH_GPUS_PER_NODE": "1"}, "note": "another seed"},
    "late": {"command": ["srun.sh", "--local"], "env": {"SRUNSH_GPUS_PER_NODE": "1"}, "note": "a later block"},
}


def recorded_call(runs: Path) -> dict:
    """ours against upstream over 3 rounds (upstream 2% faster); seed failed in the next block, which was cut."""
    record = {"settle": 1, "turn_steps": 2, "arms": {}, "turns": []}
    for name, arm in ARMS.items():
        record["arms"][name] = arm | {"tokens_per_step": 65536, "gpus": 1, "noise_of": None, "returncode": 0}
    record["arms"]["seed"] |= {"returncode": 1, "failure": {"why": "ended during its turn", "last_lines": ["OOM"]}}
    del record["arms"]["late"]["returncode"]  # never started
    record["blocks"] = [
        {"index": 0, "arms": ["ours", "upstream"], "rounds": 3},
        {"index": 1, "arms": ["ours", "seed"], "rounds": 3, "cut": "after 0 rounds: an arm failed"},
        {"index": 2, "arms": ["ours", "late"], "rounds": 3, "skipped": "no time left"},
    ]
    seconds, wall = {"ours": 1.0, "upstream": 0.98}, 1000.0
    steps: dict[str, dict] = {"ours": {}, "upstream": {}}
    for round_index in range(3):
        for arm in ("ours", "upstream") if round_index % 2 == 0 else ("upstream", "ours"):
            began = wall
            for index in range(4):
                wall += seconds[arm]
                steps[arm][len(steps[arm]) + 1] = (wall, 20.0 if index == 0 else seconds[arm])
            record["turns"].append({"block": 0, "round": round_index, "arm": arm, "began": began, "ended": wall})
    for arm, logged in steps.items():
        write_events(runs / arm, logged, {8: 10.0, 16: 9.5}, tflops=550.0)
    return record


def test_the_report_is_written_from_the_recorded_call_and_the_arms_event_files(tmp_path: Path):
    runs, prefix = tmp_path / "runs", tmp_path / "turns-llama8b-ab"
    header = {"date": "2026-12-01 10:00 UTC", "hardware": "1 x NVIDIA H200", "gpus": 1, "versions": "torch 2.11.0"}
    result = {**header, "plan": "llama8b-ab", "layers": 4, "record": recorded_call(runs)}
    printed = bench_turns.write(prefix, result, runs)
    table = prefix.with_suffix(".md").read_text()
    assert table == printed
    ratio = round(1 / 0.98, 4)
    assert (
        f"| 0 | upstream | ours | 3 | {ratio} | {ratio}-{ratio} | {ratio}-{ratio} | faster, outside the spread |"
        in table
    )
    assert "| 1 | | | cut after 0 rounds: an arm failed |" in table
    assert "| 2 | late | ours | skipped: no time left |" in table
    assert "| ours | the shipped recipe | 1000.0 | 65536 | 6 | 0 |" in table  # 65536 tokens a 1 s step
    assert "| seed | another seed | - | - | 0 | 1, ended during its turn: OOM |" in table
    assert json.loads(prefix.with_suffix(".json").read_text())["analysis"]["blocks"][0]["ratios"] == {
        "upstream": [ratio] * 3
    }


@pytest.mark.parametrize(
    "bad",
    [
        ["--rounds", "0"],
        ["--gpus", "0"],
        ["--plan", "llama70b"],
        ["--turn-steps", "0"],
        ["--layers", "8"],
        ["--budget-s", "0"],
    ],
)
def test_bad_options_are_refused_with_usage_status(bad: list[str], capsys):
    with pytest.raises(SystemExit) as refused:
        bench_turns.parse_args(["--out", "out", *bad])
    assert refused.value.code == 2
    assert "python3 -m bench.bench_turns: error:" in capsys.readouterr().err


def test_a_plan_has_no_time_limit_unless_given_and_its_files_go_into_the_out_folder():
    args = bench_turns.parse_args(["--out", "results", "--plan", "llama8b-ab"])
    assert args.budget_s is None
    assert (args.prefix, args.runs_dir) == (Path("results/turns-llama8b-ab"), Path("results/turns-llama8b-ab-runs"))
    assert bench_turns.parse_args(["--out", "results", "--budget-s", "300"]).budget_s == 300


def test_a_llama_plan_takes_another_layer_count():
    _, arms, _ = bench_turns.plan_of(bench_turns.parse_args(["--out", "out", "--plan", "llama8b-ab", "--layers", "6"]))
    assert all("model.num_layers=6" in arm.overrides for arm in arms.values())
