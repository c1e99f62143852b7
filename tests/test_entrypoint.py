"""entrypoint.py against the real megatron-bridge, omegaconf and hydra, on CPU: routing, overrides, checks, outputs."""

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from megatron.bridge.training.mixed_precision import MixedPrecisionConfig, get_mixed_precision_config

import entrypoint
from launcher.config.run_env import set_cuda_device_max_connections
from launcher.errors import UsageError
from tests.conftest import REPO, error_lines

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")


def resolve(*argv: str):
    cfg, _ = entrypoint.resolve(entrypoint.parse_args(list(argv)))
    return cfg


def write_recipe(directory: Path, body: str) -> str:
    path = directory / "user_recipe.py"
    path.write_text(body)
    return str(path)


PROBE_RECIPE = """
import json
from pathlib import Path

from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config

def configure(layers: int = 2, note: str = "", flag: bool = False, ranks: list[int] | None = None, missing=None):
    seen = dict(layers=layers, note=note, flag=flag, ranks=ranks, missing=missing)
    Path(__file__).with_suffix(".seen.json").write_text(json.dumps(seen))
    cfg = vanilla_gpt_pretrain_config()
    cfg.model.num_layers = layers
    return cfg
"""


def test_configure_parameters_get_typed_values_and_the_rest_override_the_config(tmp_path: Path, output_root: Path):
    recipe = write_recipe(tmp_path, PROBE_RECIPE)
    cfg = resolve(
        recipe,
        "layers=6",
        "note='a b $x'",
        "flag=true",
        "ranks=[0,3]",
        "missing=null",
        "train.train_iters=7",
        "model.hidden_size=256",
        "profiling.profile_ranks=[1,2]",
        "checkpoint.save=null",
    )
    seen = json.loads((tmp_path / "user_recipe.seen.json").read_text())
    assert seen == {"layers": 6, "note": "a b $x", "flag": True, "ranks": [0, 3], "missing": None}
    assert cfg.model.num_layers == 6
    assert cfg.train.train_iters == 7
    assert cfg.model.hidden_size == 256
    assert cfg.profiling.profile_ranks == [1, 2]
    assert cfg.checkpoint.save is None


def test_float_and_dtype_overrides_keep_their_types(output_root: Path):
    cfg = resolve(TINY, "optimizer.lr=1e-4", "optimizer.main_grads_dtype=bf16", "model.num_layers=2")
    assert cfg.optimizer.lr == pytest.approx(1e-4)
    assert str(cfg.optimizer.main_grads_dtype) == "torch.bfloat16"
    assert cfg.model.num_layers == 2


def test_a_list_fits_a_field_that_takes_a_name_an_enum_or_a_list_of_either(output_root: Path):
    """TransformerConfig.cuda_graph_modules: Union[str, CudaGraphModule, List[str], List[CudaGraphModule]]. The check
    of the enum branch hashed the list and raised TypeError with a traceback."""
    cfg = resolve(
        TINY,
        "--world-size",
        "1",
        "model.cuda_graph_impl=transformer_engine",
        "model.cuda_graph_modules=[attn,mlp]",
        "model.use_te_rng_tracker=true",
    )
    assert cfg.model.cuda_graph_modules == ["attn", "mlp"]


def test_cuda_graphs_without_the_te_rng_tracker_are_refused_before_any_rank_builds_a_model(output_root: Path):
    with pytest.raises(UsageError, match=r"model.cuda_graph_impl=transformer_engine needs Transformer Engine's RNG"):
        resolve(TINY, "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[attn,mlp]")


def test_env_vars_dict_accepts_added_keys(output_root: Path):
    cfg = resolve(TINY, "+env_vars.NCCL_DEBUG=INFO")
    assert cfg.env_vars["NCCL_DEBUG"] == "INFO"


@pytest.mark.parametrize(
    "arguments",
    [
        ["mixed_precision=bf16_with_fp8_current_scaling_mixed", "mixed_precision.first_last_layers_bf16=false"],
        ["mixed_precision.first_last_layers_bf16=false", "mixed_precision=bf16-with-fp8-current-scaling-mixed"],
    ],
)
def test_mixed_precision_preset_is_chosen_before_its_fields_are_set(output_root: Path, arguments: list[str]):
    cfg = resolve(TINY, *arguments)
    assert isinstance(cfg.mixed_precision, MixedPrecisionConfig)
    assert (cfg.mixed_precision.fp8, cfg.mixed_precision.fp8_recipe) == ("hybrid", "tensorwise")
    assert cfg.mixed_precision.first_last_layers_bf16 is False


def test_recipe_preset_name_is_resolved_so_its_fields_can_be_set(output_root: Path):
    assert resolve(TINY).mixed_precision == get_mixed_precision_config("bf16_mixed")
    assert resolve(TINY, "mixed_precision.grad_reduce_in_fp32=false").mixed_precision.grad_reduce_in_fp32 is False
    assert resolve(TINY, "mixed_precision=null").mixed_precision is None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["model.tensor_model_paralel_size=2"],
            "unknown config key 'model.tensor_model_paralel_size' ('model' has no key 'tensor_model_paralel_size'); "
            "did you mean 'model.tensor_model_parallel_size'?",
        ),
        (
            ["trian.train_iters=5"],
            "unknown config key 'trian.train_iters' (the config has no section 'trian'); did you",
        ),
        (
            ["mixed_precision=bf16_with_fp8_current_scaling_mixd"],
            "unknown mixed_precision preset 'bf16_with_fp8_current_scaling_mixd': "
            "did you mean 'bf16_with_fp8_current_scaling_mixed'? presets: bf16_mixed, ",
        ),
        (["mixed_precision.first_last_layer_bf16=false"], "did you mean 'mixed_precision.first_last_layers_bf16'?"),
        (["model.tensor_model_parallel_size=abc"], "model.tensor_model_parallel_size=abc has the wrong type: "),
        (["train.train_iters=1.5"], "train.train_iters=1.5 has the wrong type: TrainingConfig.train_iters takes"),
        (["model.sequence_parallel=3"], "has the wrong type"),
        (["+model.not_a_field=1"], "'+model.not_a_field' adds a key the config does not have"),
        (["~model.num_layers"], "'~model.num_layers' would delete a config field"),
        (["train.train_iters=5", "train.train_iters=6"], "'train.train_iters' is given twice"),
        (["profiling.profile_ranks=0,1"], "is a Hydra sweep"),
        (["justaword"], "malformed argument 'justaword': expected NAME=VALUE"),
        (["train.train_iters=[1"], "malformed argument 'train.train_iters=[1'"),
        (["use_megatron_fsdp=maybe"], "use_megatron_fsdp=maybe has the wrong type: configure() takes bool"),
        (["train.train_iters.deeper=1"], "cannot set 'train.train_iters.deeper': 'train.train_iters' is a value"),
        (["comm_overlap.tp_comm_overlap=true"], "cannot set 'comm_overlap.tp_comm_overlap': 'comm_overlap' is null"),
        (
            [
                "profiling.use_viztracer=true",
                "profiling.profile_step_start=90",
                "profiling.profile_step_end=120",
            ],
            "profiling window profile_step_start=90..profile_step_end=120 is outside train.train_iters=100",
        ),
        (
            ["profiling.use_nsys_profiler=true", "profiling.profile_step_start=5", "profiling.profile_step_end=5"],
            "profiling window profile_step_start=5..profile_step_end=5 is outside",
        ),
        (
            ["profiling.use_viztracer=true", "profiling.use_nsys_profiler=true"],
            "profiling.use_nsys_profiler and profiling.use_viztracer are all on: enable one profiler per run",
        ),
        (["model.params_dtype=bf17"], "model.params_dtype=bf17 has the wrong type: "),
        (["optimizer.exp_avg_dtype=bf17"], "takes a dtype: 16, 16-mixed, 32, 32-true, bf16, bf16-mixed, bfloat16, "),
        (
            ["use_megatron_fsdp=true", "checkpoint.ckpt_format=torch_dist"],
            "refuses this config for 2 ranks: Megatron-FSDP requires the fsdp_dtensor checkpointing format!",
        ),
        (["use_megatron_fsdp=true", "dist.use_torch_fsdp2=true"], "use_megatron_fsdp and use_torch_fsdp2 are mutually"),
        (["use_megatron_fsdp=true", "dist.use_tp_pp_dp_mapping=true"], "use_tp_pp_dp_mapping is not supported with"),
        (
            ["model.cpu_offloading=true", "model.pipeline_model_parallel_size=2"],
            "no support for Pipeline parallelism with CPU offloading",
        ),
        (
            ["model.cpu_offloading=true", "model.recompute_granularity=full"],
            "CPU offloading does not work when activation recomputation is enabled",
        ),
    ],
)
def test_bad_override_is_refused_with_the_fix(output_root: Path, arguments: list[str], message: str):
    with pytest.raises(UsageError) as raised:
        resolve(TINY, "--world-size", "2", *arguments)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("world_size", "arguments", "message"),
    [
        (6, ["model.tensor_model_parallel_size=4"], "refuses this config for 6 ranks: world size (6) is not divisible"),
        (4, ["train.global_batch_size=30"], "refuses this config for 4 ranks: eval_global_batch_size (30) must be"),
        (
            2,
            ["profiling.use_nsys_profiler=true", "profiling.profile_ranks=[0,5]"],
            "profiling.profile_ranks=[0, 5] names ranks outside 0..1",
        ),
    ],
)
def test_rank_arithmetic_is_checked_before_launch(output_root: Path, world_size: int, arguments, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        resolve(TINY, "--world-size", str(world_size), *arguments)


def test_moe_expert_parallel_must_divide_the_ranks(output_root: Path, hf_dir: Callable[[str], Path]):
    recipe = str(REPO / "recipes" / "deepseek_v2_lite_pretrain.py")
    with pytest.raises(UsageError, match=r"refuses this config for 12 ranks: world size \(12\) is not divisible"):
        resolve(recipe, f"hf_path={hf_dir('deepseek_v2')}", "--world-size", "12")
    with pytest.raises(UsageError, match=r"8 ranks do not divide into EP\*ETP\*PP = 3\*1\*1"):
        resolve(recipe, f"hf_path={hf_dir('deepseek_v2')}", "model.expert_model_parallel_size=3", "--world-size", "8")
    with pytest.raises(UsageError, match=r"8 ranks do not divide into EP\*ETP\*PP = 2\*8\*1"):
        resolve(recipe, f"hf_path={hf_dir('deepseek_v2')}", "model.expert_tensor_parallel_size=8", "--world-size", "8")


def test_deepep_on_two_ranks_is_checked_by_megatron_before_any_gpu(output_root: Path, hf_dir: Callable[[str], Path]):
    """Megatron Bridge's validate() asks the GPU's architecture for DeepEP only as its last check (which a host without
    a GPU skips); Megatron's own checks before it run here: the GPU suite's EP=2 DeepEP shape is accepted, a DeepEP
    combination Megatron cannot run is refused before launch."""
    recipe = str(REPO / "recipes" / "deepseek_v2_lite_pretrain.py")
    two_gpus = (
        f"hf_path={hf_dir('deepseek_v2')}",
        "model.tensor_model_parallel_size=1",
        "model.sequence_parallel=false",
        "moe_token_dispatcher_type=deepep",
        "--world-size",
        "2",
    )
    cfg = resolve(recipe, *two_gpus)
    assert (cfg.model.moe_token_dispatcher_type, cfg.model.moe_flex_dispatcher_backend) == ("flex", "deepep")
    padded = ("model.moe_pad_expert_input_to_capacity=true", "model.moe_expert_capacity_factor=1.0")
    with pytest.raises(UsageError, match="deepep backend does not support moe_pad_expert_input_to_capacity"):
        resolve(recipe, *two_gpus, *padded)


def test_expert_tensor_parallel_is_1_when_unset_with_expert_parallel_as_in_megatron_bridge(
    output_root: Path, hf_dir: Callable[[str], Path]
):
    """Megatron Bridge 0.6.2 sets ETP=1 whenever EP > 1: TP8 EP2 fits 8 ranks, as its own validate() says."""
    recipe = str(REPO / "recipes" / "deepseek_v2_lite_pretrain.py")
    cfg = resolve(recipe, f"hf_path={hf_dir('deepseek_v2')}", "--world-size", "8")
    assert (cfg.model.tensor_model_parallel_size, cfg.model.expert_model_parallel_size) == (8, 2)


def test_megatron_fsdp_switch_of_dist_alone_is_what_megatron_bridge_accepts(output_root: Path):
    """Upstream turns on ddp.use_megatron_fsdp itself; it only needs the fsdp_dtensor checkpoint format."""
    cfg = resolve(TINY, "--world-size", "2", "dist.use_megatron_fsdp=true", "checkpoint.ckpt_format=fsdp_dtensor")
    assert cfg.dist.use_megatron_fsdp is True


def test_a_python_without_the_stack_names_the_image_and_the_fix(tmp_path: Path):
    """The image's python (here: one without Megatron Bridge) fails with one line naming the image."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    result = subprocess.run(
        [str(bare / "bin" / "python"), str(REPO / "entrypoint.py"), TINY],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "RUN_DIR": str(tmp_path / "run"), "SRUNSH_SQSH": "/fsx/images/old.sqsh"},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        f"entrypoint.py: error: {bare}/bin/python cannot import the training stack (ModuleNotFoundError: No module"
        " named 'megatron'): the image /fsx/images/old.sqsh lacks it: rebuild it with 'make build', or point"
        " SRUNSH_SQSH at an image that has it\n"
    )


@pytest.mark.parametrize(
    ("recipe_body", "message"),
    [
        ("x = 1\n", "has no configure() function: define configure(**kwargs)"),
        ("def configure(:\n", "failed to import: SyntaxError"),
        ("import no_such_module_xyz\n", "failed to import: ModuleNotFoundError"),
        ("def configure():\n    raise ValueError('bad hf')\n", "configure() failed: ValueError: bad hf"),
        ("def configure():\n    return 42\n", "configure() returned int, not a ConfigContainer"),
    ],
)
def test_broken_recipe_is_refused_in_one_line(tmp_path: Path, entrypoint_main, recipe_body: str, message: str):
    recipe = write_recipe(tmp_path, recipe_body)
    result = entrypoint_main(recipe, "--check")
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1
    assert message in lines[0]
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["no/such/recipe.py"], "recipe 'no/such/recipe.py' not found: pass a recipe file"),
        ([TINY, "--bogus"], "unrecognized arguments: --bogus"),
        ([TINY, "-x=1"], "unrecognized arguments: -x=1"),
        ([], "the following arguments are required: recipe"),
    ],
)
def test_command_line_errors_are_one_line_and_exit_2(entrypoint_main, arguments: list[str], message: str):
    result = entrypoint_main(*arguments)
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1
    assert message in lines[0]


@pytest.mark.parametrize(
    ("recipe_body", "arguments"),
    [
        ("def configure():\n    return 42\n", ["--check"]),  # the imports' chatter held back
        (None, ["--bogus"]),  # the imports' chatter on stderr
    ],
)
def test_entrypoint_run_as_a_program_says_what_its_main_says(
    tmp_path: Path, run_entrypoint, entrypoint_main, recipe_body: str | None, arguments: list[str]
):
    """The tests above call main() in this process; the program, whose imports run in its own process and whose
    exit status is main()'s, says the same."""
    recipe = write_recipe(tmp_path, recipe_body) if recipe_body else TINY
    program, main = run_entrypoint(recipe, *arguments), entrypoint_main(recipe, *arguments)
    assert program.returncode == main.returncode == 2
    assert program.stdout == main.stdout
    assert error_lines(program.stderr) == error_lines(main.stderr) != []


def test_print_config_prints_the_resolved_config_as_yaml(run_entrypoint):
    result = run_entrypoint(TINY, "train.train_iters=42", "model.num_layers=3", "--print-config")
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["train"]["train_iters"] == 42
    assert config["model"]["num_layers"] == 3
    assert config["profiling"]["use_viztracer"] is False


def test_check_prints_the_profiled_ranks_for_the_launcher(run_entrypoint, entrypoint_main):
    result = run_entrypoint(TINY, "profiling.profile_ranks=[0,3]", "--check", "--world-size", "4")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "profile_ranks=0,3"
    (said,) = error_lines(result.stderr)  # once: the run trains on mock data
    assert said.startswith("entrypoint.py: data: mock (tokens Megatron generates, not a corpus): pass data_paths=")
    every = entrypoint_main(TINY, "profiling.profile_ranks=[]", "--check", "--world-size", "4")
    assert every.stdout.splitlines()[-1] == "profile_ranks=0,1,2,3"


def test_outputs_go_to_a_directory_of_this_run(output_root: Path, hf_dir: Callable[[str], Path]):
    recipe = str(REPO / "recipes" / "deepseek_v2_lite_pretrain.py")
    cfg = resolve(recipe, f"hf_path={hf_dir('deepseek_v2')}")
    run_dir = output_root / "deepseek_v2_lite_pretrain" / "test-run"
    assert cfg.checkpoint.save == str(run_dir / "checkpoints")
    assert cfg.checkpoint.load == str(run_dir / "checkpoints")  # upstream loads from its shared default
    assert cfg.logger.tensorboard_dir == str(run_dir / "tb_logs")
    assert os.environ["VIZTRACER_OUTPUT_DIR"] == str(run_dir / "viztracer")


def test_two_jobs_get_different_checkpoint_directories(output_root: Path, monkeypatch: pytest.MonkeyPatch):
    first = resolve(TINY).checkpoint.save
    monkeypatch.setenv("RUN_ID", "another-job")
    second = resolve(TINY).checkpoint.save
    assert first != second
    assert second.endswith("another-job/checkpoints")


def test_explicit_checkpoint_path_is_kept(output_root: Path, tmp_path: Path):
    cfg = resolve(TINY, f"checkpoint.save={tmp_path}/ckpt")
    assert cfg.checkpoint.save == f"{tmp_path}/ckpt"
    assert cfg.checkpoint.load == f"{tmp_path}/ckpt"


def test_a_run_loads_its_own_checkpoints_when_the_recipe_saves_without_loading(output_root: Path):
    """The vanilla GPT recipe leaves checkpoint.load unset: a requeued or resumed run would start over (issue 18)."""
    cfg = resolve(TINY)
    assert (
        cfg.checkpoint.load
        == cfg.checkpoint.save
        == str(output_root / "tiny_gpt_pretrain" / "test-run" / "checkpoints")
    )


def test_rank_0_saves_config_and_launch_environment(output_root: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("HF_TOKEN", "secret-value")
    cfg = resolve(TINY, "train.train_iters=9")
    run_dir = output_root / "tiny_gpt_pretrain" / "test-run"
    entrypoint.outputs.save_run_record(cfg, run_dir)
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["train_iters"] == 9
    record = json.loads((run_dir / "launch.json").read_text())
    assert record["environment"]["NCCL_DEBUG"] == "WARN"
    assert "HF_TOKEN" not in record["environment"]
    assert record["versions"]["megatron-bridge"] == "0.6.2"


def test_launch_record_keeps_only_known_variables_and_no_credentials(
    output_root: Path, monkeypatch: pytest.MonkeyPatch
):
    credentials = {"HF_PASSWD": "hunter2", "HF_CREDENTIALS": "alice:hunter2", "HF_AUTH": "Bearer hunter2"}
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_ENDPOINT", "https://alice:s3cr3t@hub.example.com/mirror?token=t0k3n")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["entrypoint.py", TINY, "checkpoint.load=s3://bob:pa55@bucket/ckpt"])
    run_dir = output_root / "tiny_gpt_pretrain" / "test-run"
    entrypoint.outputs.save_run_record(resolve(TINY), run_dir)
    text = (run_dir / "launch.json").read_text()
    environment = json.loads(text)["environment"]
    assert not credentials.keys() & environment.keys()
    assert environment["HF_ENDPOINT"] == "https://REDACTED@hub.example.com/mirror?REDACTED"
    assert environment["NCCL_DEBUG"] == "INFO"
    assert environment["HF_HUB_OFFLINE"] == "1"
    for secret in ("hunter2", "s3cr3t", "t0k3n", "pa55"):
        assert secret not in text


def test_launch_record_names_the_allocations_job_not_srun_sh_step(output_root: Path, monkeypatch: pytest.MonkeyPatch):
    """Inside srun.sh's step SLURM_JOB_NAME is the step's --job-name; srun.sh passes the job's own name on."""
    monkeypatch.setenv("SLURM_JOB_NAME", "srunsh-4242-20261201-101500")
    monkeypatch.setenv("SRUNSH_JOB_NAME", "llama-pretraining")
    run_dir = output_root / "tiny_gpt_pretrain" / "test-run"
    entrypoint.outputs.save_run_record(resolve(TINY), run_dir)
    environment = json.loads((run_dir / "launch.json").read_text())["environment"]
    assert environment["SLURM_JOB_NAME"] == "llama-pretraining"


def test_run_record_is_readable_by_its_owner_only(output_root: Path):
    """Run directories often sit on a file system every user of the cluster mounts."""
    run_dir = output_root / "tiny_gpt_pretrain" / "test-run"
    previous = os.umask(0o022)
    try:
        entrypoint.outputs.save_run_record(resolve(TINY), run_dir)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for name in ("config.yaml", "launch.json"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name


def test_megatron_fsdp_job_is_checked_with_the_connections_its_ranks_get(output_root: Path, monkeypatch):
    """CUDA_DEVICE_MAX_CONNECTIONS=1 from the user's shell: train() gives FSDP ranks 8, so the check must not refuse."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    cfg = resolve(TINY, "--world-size", "2", "use_megatron_fsdp=true")
    assert cfg.dist.use_megatron_fsdp is True
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the check's environment is its own


@pytest.mark.parametrize(
    ("arguments", "before", "after"),
    [
        (["use_megatron_fsdp=true"], "1", "8"),
        (["use_megatron_fsdp=true"], None, None),
        (["model.tensor_model_parallel_size=2"], None, "1"),
        (["model.tensor_model_parallel_size=2"], "4", "4"),
        ([], None, None),
    ],
)
def test_cuda_device_max_connections_suits_the_job(output_root: Path, monkeypatch, arguments, before, after):
    if before is None:
        monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", before)
    set_cuda_device_max_connections(resolve(TINY, *arguments))
    assert os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS") == after


def test_a_field_that_takes_only_a_string_takes_a_comma_separated_value_as_typed(output_root: Path):
    """Hydra's grammar reads 90,5,5 as a sweep of three choices; a launch runs no sweep, and a field of type str (here
    megatron-core's dataset.split, `str | None`) can only mean the text typed, as the data check's advice prints it."""
    assert resolve(TINY, "dataset.split=98,1,1").dataset.split == "98,1,1"
    assert resolve(TINY, "dataset.split=99.5, 0.5, 0").dataset.split == "99.5, 0.5, 0"
    assert resolve(TINY, "dataset.split='90,5,5'").dataset.split == "90,5,5"  # quoted, as before


@pytest.mark.parametrize(
    ("argument", "advice"),
    [
        ("profiling.profile_ranks=0,1", "write a list as NAME=[a,b]"),  # list[int]
        ("data_paths=/a,/b", "write a list as NAME=[a,b]"),  # configure()'s list[str | float] | str | None
        ("train.train_iters=5,6", "give one value"),  # int | None
        ("mixed_precision=bf16_mixed,fp16_mixed", "give one value"),  # MixedPrecisionConfig | str | None
        ("dataset.split=range(1,3)", "give one value, or write a list as NAME=[a,b]"),  # no choice: a range
        ("dataset.split=choice(9,1)", "give one value, or write a list as NAME=[a,b]"),  # a sweep by name
        ("dataset.split=9,'1'", "give one value, or write a list as NAME=[a,b]"),  # quotes: not the text as typed
        ("+dataset.split=9,1", "give one value, or write a list as NAME=[a,b]"),
    ],
)
def test_sweeps_stay_refused_where_a_string_is_not_all_the_field_takes(argument: str, advice: str, output_root: Path):
    with pytest.raises(UsageError) as refused:
        resolve(TINY, argument)
    assert str(refused.value) == f"{argument!r} is a Hydra sweep, which a launch cannot run: {advice}"
