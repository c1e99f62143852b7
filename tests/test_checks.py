"""launcher/config/checks.py on the real Megatron Bridge ConfigContainer of the tiny recipe: each check's boundary (the
last value it accepts and the first it refuses), its whole one-line message, and what it must leave alone."""

import copy
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import entrypoint
from launcher.config import checks
from launcher.config.outputs import config_yaml
from launcher.errors import UsageError
from tests.conftest import REPO

TINY = REPO / "recipes" / "tiny_gpt_pretrain.py"


@pytest.fixture(scope="module")
def tiny_recipe():
    return entrypoint.load_recipe(TINY).configure()


@pytest.fixture
def cfg(tiny_recipe):
    """A fresh copy of the tiny recipe's config (train.train_iters=100 as shipped), profilers off."""
    fresh = copy.deepcopy(tiny_recipe)
    assert fresh.train.train_iters == 100
    return fresh


def refusal(check: Callable[[], None]) -> str:
    with pytest.raises(UsageError) as raised:
        check()
    return str(raised.value)


def window(cfg, start: int, end: int, profiler: str = "use_viztracer"):
    setattr(cfg.profiling, profiler, True)
    cfg.profiling.profile_step_start, cfg.profiling.profile_step_end = start, end
    return cfg


@pytest.mark.parametrize(("start", "end"), [(0, 1), (0, 100), (99, 100), (10, 15)])
def test_a_profiling_window_inside_the_run_is_accepted(cfg, start: int, end: int):
    checks.check_profiling(window(cfg, start, end), None)


@pytest.mark.parametrize(("start", "end"), [(-1, 5), (5, 5), (6, 5), (0, 101), (100, 101)])
def test_a_profiling_window_outside_the_run_is_refused_with_the_rule(cfg, start: int, end: int):
    assert refusal(lambda: checks.check_profiling(window(cfg, start, end), None)) == (
        f"profiling window profile_step_start={start}..profile_step_end={end} is outside train.train_iters=100:"
        " pick 0 <= profile_step_start < profile_step_end <= train.train_iters"
    )


def test_a_run_counted_in_samples_has_no_iteration_bound_on_the_window(cfg):
    cfg.train.train_iters = None
    checks.check_profiling(window(cfg, 10, 100_000), None)
    assert "train.train_iters=None" in refusal(lambda: checks.check_profiling(window(cfg, 10, 10), None))


def test_the_window_is_not_checked_while_no_profiler_is_on(cfg):
    cfg.profiling.profile_step_start, cfg.profiling.profile_step_end = 500, 400
    checks.check_profiling(cfg, None)


def test_two_or_three_profilers_are_refused_naming_each(cfg):
    cfg.profiling.use_viztracer = cfg.profiling.use_nsys_profiler = True
    two = "profiling.use_nsys_profiler and profiling.use_viztracer are all on: enable one profiler per run"
    assert refusal(lambda: checks.check_profiling(cfg, None)) == two
    cfg.profiling.use_pytorch_profiler = True
    assert refusal(lambda: checks.check_profiling(cfg, None)) == (
        "profiling.use_nsys_profiler and profiling.use_pytorch_profiler and profiling.use_viztracer are all on:"
        " enable one profiler per run"
    )


def test_cuda_graphs_need_te_rng_tracker_from_the_model_or_from_rng(cfg):
    checks.check_cuda_graph_rng(cfg)  # the recipe's "none"
    cfg.model.cuda_graph_impl = "local"
    cfg.model.use_te_rng_tracker, cfg.rng.te_rng_tracker = False, False
    assert refusal(lambda: checks.check_cuda_graph_rng(cfg)) == (
        "model.cuda_graph_impl=local needs Transformer Engine's RNG tracker: add model.use_te_rng_tracker=true"
    )
    cfg.model.use_te_rng_tracker = True
    checks.check_cuda_graph_rng(cfg)
    cfg.model.use_te_rng_tracker, cfg.rng.te_rng_tracker = False, True
    checks.check_cuda_graph_rng(cfg)


@pytest.mark.parametrize("world_size", [1, 4])
def test_profiled_ranks_empty_means_every_rank_of_the_job(cfg, world_size: int):
    cfg.profiling.profile_ranks = []
    assert checks.profiled_ranks(cfg, world_size) == list(range(world_size))
    cfg.profiling.profile_ranks = [3, 1]
    assert checks.profiled_ranks(cfg, world_size) == [3, 1]
    cfg.profiling = None
    assert checks.profiled_ranks(cfg, world_size) == [0]


def test_profiled_ranks_must_be_ranks_of_the_job_while_a_profiler_is_on(cfg):
    cfg.profiling.profile_ranks = [0, 3]
    checks.check_profiling(cfg, 4)  # off: not checked
    cfg.profiling.use_nsys_profiler = True
    checks.check_profiling(cfg, 4)  # rank 3 is the job's last
    assert refusal(lambda: checks.check_profiling(cfg, 3)) == (
        "profiling.profile_ranks=[0, 3] names ranks outside 0..2: list ranks of this job"
    )
    cfg.profiling.profile_ranks = []  # every rank of the job: never outside it
    checks.check_profiling(cfg, 4)


def expert_layout(cfg, ep: int | None, etp: int | None, pp: int = 1):
    cfg.model.expert_model_parallel_size, cfg.model.expert_tensor_parallel_size = ep, etp
    cfg.model.pipeline_model_parallel_size = pp
    return cfg


@pytest.mark.parametrize(
    ("ep", "etp", "pp", "world_size"),
    [(None, None, 1, 3), (1, None, 1, 3), (1, 4, 1, 3), (2, None, 1, 4), (2, 2, 1, 8), (2, 1, 2, 4), (3, 1, 1, 6)],
)
def test_expert_parallel_layouts_that_divide_the_ranks_pass(cfg, ep, etp, pp, world_size: int):
    checks.check_expert_parallelism(expert_layout(cfg, ep, etp, pp), world_size)


@pytest.mark.parametrize(
    ("layout", "world_size", "product"),
    [((2, None, 1), 3, "2*1*1"), ((2, 2, 1), 6, "2*2*1"), ((2, 1, 2), 6, "2*1*2"), ((4, 1, 1), 2, "4*1*1")],
)
def test_expert_parallel_layouts_that_do_not_divide_the_ranks_are_refused(cfg, layout, world_size: int, product: str):
    assert refusal(lambda: checks.check_expert_parallelism(expert_layout(cfg, *layout), world_size)) == (
        f"{world_size} ranks do not divide into EP*ETP*PP = {product}: change the node count,"
        " model.expert_model_parallel_size or model.expert_tensor_parallel_size"
    )


def test_the_job_environment_holds_during_the_check_only(cfg, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    cfg.model.tensor_model_parallel_size = 2  # tensor parallelism: Megatron wants CUDA_DEVICE_MAX_CONNECTIONS=1
    before = dict(os.environ)
    with pytest.raises(KeyError), checks.job_environment(cfg, 16):
        assert os.environ["WORLD_SIZE"] == "16"
        assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        os.environ["LEFT_BY_THE_CHECK"] = "1"
        raise KeyError("a refusal inside the check")
    assert dict(os.environ) == before


def test_upstream_validation_works_on_a_copy_and_fills_in_what_it_derives(cfg):
    """runtime_config_update() applies the mixed-precision recipe to the model config and validate() derives sizes:
    on the copy only, so the config a rank later hands to pretrain() is the one the user resolved."""
    cfg.model.tensor_model_parallel_size = 2
    before = config_yaml(cfg)
    validated = checks.upstream_validated(cfg, 8)
    assert validated is not cfg and validated.data_parallel_size == 4
    assert config_yaml(cfg) == before
    assert config_yaml(validated) != before


def test_upstream_refusal_names_the_world_size_and_upstreams_first_line(cfg):
    cfg.model.tensor_model_parallel_size = 4
    message = refusal(lambda: checks.upstream_validated(cfg, 6))
    assert message.startswith("Megatron Bridge refuses this config for 6 ranks: world size (6) is not divisible")
    assert message.endswith(" (ConfigContainer.validate(); change the override it names)")
    assert "\n" not in message


def test_a_validation_that_needs_the_gpu_is_left_to_the_ranks_only_without_one(
    cfg, monkeypatch: pytest.MonkeyPatch, hf_dir: Callable[[str], Path]
):
    """validate() asks the GPU's architecture for the DeepEP dispatcher: a RuntimeError on a host without a GPU, which
    means 'not checkable here' (None), but a real error where a GPU is present."""
    deepep = entrypoint.load_recipe(REPO / "recipes" / "deepseek_v2_lite_pretrain.py").configure(
        hf_path=str(hf_dir("deepseek_v2"))
    )
    deepep.model.tensor_model_parallel_size, deepep.model.sequence_parallel = 1, False
    deepep.model.moe_token_dispatcher_type, deepep.model.moe_flex_dispatcher_backend = "flex", "deepep"
    assert not torch.cuda.is_available()
    assert checks.upstream_validated(deepep, 2) is None
    # Not validated here, the expert layout is still checked, on the config as given.
    deepep.model.expert_model_parallel_size = 3
    assert refusal(lambda: checks.check_config(deepep, 8)).startswith("8 ranks do not divide into EP*ETP*PP = 3*1*1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError):
        checks.upstream_validated(deepep, 2)


def test_without_a_world_size_only_the_checks_of_the_config_alone_run(cfg):
    cfg.model.tensor_model_parallel_size = 4  # upstream refuses this for 6 ranks, not for an unknown job
    cfg.profiling.profile_ranks = [5]
    cfg.profiling.use_nsys_profiler = True
    checks.check_config(cfg, None)
    assert "refuses this config for 6 ranks" in refusal(lambda: checks.check_config(cfg, 6))
    cfg.model.tensor_model_parallel_size = 1
    assert refusal(lambda: checks.check_config(cfg, 4)).startswith("profiling.profile_ranks=[5] names ranks outside")
    cfg.profiling.profile_step_start, cfg.profiling.profile_step_end = 5, 5
    assert refusal(lambda: checks.check_config(cfg, None)).startswith("profiling window")
