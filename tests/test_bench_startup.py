"""bench/bench_startup.py: the markers are lines that the pinned Megatron Bridge and both entry points really print, a
timed console of each launch reads as seconds to each marker and to each phase, and A/B is the time to the first step
of each round."""

import compileall
import importlib.util
import inspect
import json
import shutil
import sys
from pathlib import Path

import pytest
from megatron.bridge.training import initialize, setup
from megatron.bridge.training.utils.log_utils import barrier_and_log

import entrypoint
from bench import bench_startup, launches, upstream_pretrain
from tests.conftest import REPO
from tests.srun_world import SrunWorld

pytest_plugins = ["tests.srun_world"]

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")

# A tiny-recipe launch on one GPU as the console shows it, each line with its arrival time: srun.sh labels the rank's
# lines "0: "; torchrun passes them as they are. The Megatron lines are in the format of megatron-bridge 0.6.2.
A_CONSOLE = """\
0.21 # srun.sh: 1 node(s) x 1 rank(s), new run bench-2-A in /tmp/b/2-A/outputs/tiny_gpt_pretrain/bench-2-A, master 127.0.0.1:24513; each rank runs:
0.21 python3 /work/main/entrypoint.py /work/main/recipes/tiny_gpt_pretrain.py train.train_iters=3
19.87 0: entrypoint.py: train.train_iters = 3
19.87 0: entrypoint.py: outputs in /tmp/b/2-A/outputs/tiny_gpt_pretrain/bench-2-A
21.40 0: > initializing torch distributed ...
23.02 0: > setting random seeds to 1234 ...
26.51 0: time to initialize megatron (seconds): 5.102
26.52 0: [after megatron is initialized] datetime: 2026-12-01 10:00:26
26.60 0: [after tokenizer is built] datetime: 2026-12-01 10:00:26
31.75 0: [after model, optimizer, and learning rate scheduler are built] datetime: 2026-12-01 10:00:31
33.10 0: [after dataloaders are built] datetime: 2026-12-01 10:00:33
42.83 0:  [2026-12-01 10:00:42] iteration        1/       3 | consumed samples:           32 | elapsed time per iteration (ms): 9630.2 | learning rate: 1.500000E-05 | global batch size:    32 | lm loss: 1.089236E+01 | loss scale: 1.0 |
43.01 0:  [2026-12-01 10:00:43] iteration        2/       3 | consumed samples:           64 | elapsed time per iteration (ms): 151.3 | learning rate: 3.000000E-05 | global batch size:    32 | lm loss: 1.083911E+01 | loss scale: 1.0 |
"""  # noqa: E501
B_CONSOLE = """\
14.02 upstream_pretrain.py: imported
18.55 upstream_pretrain.py: config built
20.05 > initializing torch distributed ...
25.40 [after megatron is initialized] datetime: 2026-12-01 10:02:25
30.61 [after model, optimizer, and learning rate scheduler are built] datetime: 2026-12-01 10:02:30
31.90 [after dataloaders are built] datetime: 2026-12-01 10:02:31
41.50  [2026-12-01 10:02:41] iteration        1/       3 | consumed samples:           32 | elapsed time per iteration (ms): 9580.7 | learning rate: 1.500000E-05 | global batch size:    32 | lm loss: 1.089236E+01 | loss scale: 1.0 |
"""  # noqa: E501


def console(text: str) -> list[tuple[float, str]]:
    return [(float(at), line + "\n") for at, line in (row.split(" ", 1) for row in text.splitlines())]


def test_each_marker_is_the_first_line_that_says_it():
    assert bench_startup.marks(console(A_CONSOLE)) == {
        "first line": 0.21,
        "imported": None,
        "config built": 19.87,
        "distributed init": 21.40,
        "megatron initialized": 26.52,
        "model built": 31.75,
        "data built": 33.10,
        "first step": 42.83,
    }
    assert bench_startup.marks(console(B_CONSOLE))["imported"] == 14.02
    assert bench_startup.marks([(0.5, "Traceback (most recent call last):\n")])["first step"] is None


def test_phases_are_the_seconds_between_markers():
    a = bench_startup.phase_seconds(bench_startup.marks(console(A_CONSOLE)))
    assert list(a.values()) == [19.87, None, 1.53, 5.12, 5.23, 1.35, 9.73, 42.83]
    b = bench_startup.phase_seconds(bench_startup.marks(console(B_CONSOLE)))
    assert list(b.values()) == [18.55, 14.02, 1.5, 5.35, 5.21, 1.29, 9.6, 41.5]


def run_row(round_index, launch: str, text: str) -> dict:
    mark = bench_startup.marks(console(text))
    return {"round": round_index, "launch": launch, "returncode": 0, "wall_s": 50.0, "marks": mark, "left_behind": [],
            "phases": bench_startup.phase_seconds(mark), "first_step_s": mark["first step"]}  # fmt: skip


def test_warm_ups_are_shown_but_not_counted():
    runs = [run_row(None, "A", A_CONSOLE.replace("42.83 0: ", "90.00 0: "))]
    runs += [run_row(0, "A", A_CONSOLE), run_row(0, "B", B_CONSOLE), run_row(1, "B", B_CONSOLE)]
    runs += [run_row(1, "A", A_CONSOLE)]
    assert launches.per_round(runs, "first_step_s") == [round(42.83 / 41.5, 4)] * 2
    medians = bench_startup.breakdown(runs)
    assert medians["launch to first step"] == {"A": 42.83, "B": 41.5}
    assert medians["  of which imports (B only)"] == {"A": None, "B": 14.02}
    result = {
        "case": "tiny",
        "date": "2026-12-01 10:05 UTC",
        "hardware": "1 x NVIDIA H200, 580.159.04",
        "gpus": 1,
        "versions": "torch 2.11.0",
        "goal": bench_startup.GOAL,
        "cold_caches": False,
        "bytecode": {"torch": [2141, 2141], "megatron": [1400, 1484]},
        "commands": {"A": ["srun.sh"], "B": ["torchrun"]},
        "runs": runs,
        "first_step_a_over_b": launches.per_round(runs, "first_step_s"),
        "breakdown": medians,
    }
    table = bench_startup.markdown(result)
    assert "| warm-up | A | 0 | 50.0 | 0.21 | - | 19.87 | 21.4 | 26.52 | 31.75 | 33.1 | 90.0 |" in table
    assert "| 1 | B | 0 | 50.0 | 14.02 | 14.02 | 18.55 | 20.05 | 25.4 | 30.61 | 31.9 | 41.5 |" in table
    assert "A/B time to first step per round: 1.032, 1.032; median 1.032, range 1.032-1.032 over 2" in table
    assert "(goal: median at most 0.8, every round below 0.9)." in table
    assert "| launch to first step | 42.83 | 41.5 | 1.33 |" in table
    assert "| tokenizer, model, optimizer | 5.23 | 5.21 | 0.02 |" in table
    assert "Triton and TorchInductor caches: each launcher's own, kept between its launches." in table
    bytecode = "Bytecode cached for 3,541 of 3,625 .py files of the stack (torch 2,141/2,141, megatron 1,400/1,484)"
    assert bytecode in table
    assert "Left running after a launch, and killed before the next: nothing." in table
    runs[2]["left_behind"] = ["pt_main_thread", "python3"]
    said = "Left running after a launch, and killed before the next: 0 B: pt_main_thread, python3."
    assert said in bench_startup.markdown(result)
    assert "Triton and TorchInductor caches: empty at every launch." in bench_startup.markdown(
        result | {"cold_caches": True}
    )


def test_the_bytecode_census_counts_each_module_whose_pyc_this_interpreter_would_load(tmp_path: Path, monkeypatch):
    """The standard library's json package, copied without its bytecode: none cached, then all once compileall has
    run, then all but the one whose .pyc is removed; and this environment's stack, which pip compiled as it
    installed it."""
    copy = tmp_path / "json_copy"
    shutil.copytree(Path(json.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.syspath_prepend(str(tmp_path))
    files = len(list(copy.rglob("*.py")))

    assert bench_startup.bytecode_cached(("json_copy",)) == {"json_copy": [0, files]}
    compileall.compile_dir(copy, quiet=1)
    assert bench_startup.bytecode_cached(("json_copy",)) == {"json_copy": [files, files]}
    Path(importlib.util.cache_from_source(str(copy / "decoder.py"))).unlink()
    assert bench_startup.bytecode_cached(("json_copy", "no_such_package")) == {"json_copy": [files - 1, files]}
    stack = bench_startup.bytecode_cached()
    assert set(stack) == set(bench_startup.STACK) and all(cached == total > 100 for cached, total in stack.values())


def test_a_cold_launch_hands_its_rank_empty_caches_of_its_own(srun_world: SrunWorld, tmp_path: Path):
    caches = bench_startup.cold_caches(tmp_path / "0-A")
    result = srun_world.srun_sh("--local", "recipe.py", env={"SRUNSH_GPUS_PER_NODE": "1", **caches})
    assert result.returncode == 0, result.stderr
    rank_env = srun_world.records()[0]["env"]
    assert {name: rank_env[name] for name in caches} == caches
    assert not any(Path(path).exists() for path in caches.values())  # empty: not even made before the rank runs
    assert set(caches.values()).isdisjoint(bench_startup.cold_caches(tmp_path / "1-B").values())


@pytest.mark.parametrize(
    ("marker", "said"),
    [
        ("megatron initialized", "after megatron is initialized"),
        ("model built", "after model, optimizer, and learning rate scheduler are built"),
        ("data built", "after dataloaders are built"),
    ],
)
def test_megatron_bridge_prints_each_progress_marker_in_setup(marker: str, said: str, capsys: pytest.CaptureFixture):
    assert f'barrier_and_log("{said}")' in inspect.getsource(setup.setup)
    barrier_and_log(said)
    assert bench_startup.MARKERS[marker].search(capsys.readouterr().out)


def test_megatron_bridge_announces_distributed_init_before_it_starts_it():
    source = inspect.getsource(initialize._initialize_distributed)
    announced = source.index('print("> initializing torch distributed ...", flush=True)')
    assert announced < source.index("torch.distributed.init_process_group(")
    assert bench_startup.MARKERS["distributed init"].search("> initializing torch distributed ...")


class PretrainCalledError(Exception):
    """Stands for the training run: the markers before it are what the test is about."""


def raise_pretrain(*args, **kwargs):
    raise PretrainCalledError


def test_upstream_launch_says_when_it_has_imported_and_built_its_config(monkeypatch, capsys, tmp_path: Path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(upstream_pretrain, "pretrain", raise_pretrain)
    monkeypatch.setattr(sys, "argv", ["upstream_pretrain.py", TINY, "train.train_iters=3"])
    with pytest.raises(PretrainCalledError):
        upstream_pretrain.main()
    lines = [(float(at), line) for at, line in enumerate(capsys.readouterr().out.splitlines())]
    mark = bench_startup.marks(lines)
    assert mark["imported"] is not None and mark["config built"] is not None
    assert mark["imported"] < mark["config built"]


def test_our_launch_says_when_its_config_is_built(monkeypatch, capsys, output_root: Path):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")  # train() sets it per job; restored after the test
    monkeypatch.setattr(entrypoint, "pretrain", raise_pretrain)
    monkeypatch.setattr(entrypoint.viztracer_plugin, "install", lambda: None)
    monkeypatch.setattr(entrypoint.hang_dumps, "install", lambda *_: None)  # blocks SIGUSR2 for good
    monkeypatch.setattr(entrypoint.exit_after_failure, "install", lambda: None)  # would end pytest after a later error
    args = entrypoint.parse_args([TINY, "train.train_iters=3"])
    cfg, applied = entrypoint.resolve(args)
    with pytest.raises(PretrainCalledError):
        entrypoint.train(cfg, args.recipe, applied, [TINY, "train.train_iters=3"])
    printed = capsys.readouterr().out.splitlines()
    assert bench_startup.marks([(1.0, line) for line in printed])["config built"] == 1.0


def test_the_llama_shape_keeps_4_layers_on_one_gpu_and_all_of_them_on_two():
    recipe, on_one = bench_startup.case_command("llama8b-shape", gpus=1, layers=None)
    assert recipe.endswith("llama3_8b_h200_fp8cs_pretrain.py")
    assert "model.num_layers=4" in on_one and "train.train_iters=3" in on_one
    _, on_two = bench_startup.case_command("llama8b-shape", gpus=2, layers=None)
    assert not [o for o in on_two if o.startswith("model.num_layers=")]
    _, tiny = bench_startup.case_command("tiny", gpus=2, layers=None)
    assert set(launches.MEASURED) <= set(tiny)
