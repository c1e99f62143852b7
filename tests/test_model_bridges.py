"""launcher/imports/model_bridges.py against the installed Megatron Bridge: each architecture it names a module for is,
after a plain import of every model bridge, an exact key of the bridge registry whose bridge that module defines; a
config.json of any content names modules only for architectures it can vouch for; a rank whose hf_path it cannot
vouch for registers every model bridge, as a plain import does; and one with the Llama bridge alone loads hf_path's
weights as a plain import does."""

import json
import socket
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher.imports import model_bridges
from tests import hf_models

REPO = Path(__file__).resolve().parent.parent
LLAMA_CONFIG = REPO / "recipes" / "hf_configs" / "llama3_8b"

WHOLE = r"""
import json
import megatron.bridge  # its __init__ imports every model bridge
import transformers
from megatron.bridge.models.conversion import model_bridge
from launcher.imports import model_bridges
registry = model_bridge.get_model_bridge._exact_types
alike, other = {}, []
for name, module in model_bridges.registrations().items():
    key = getattr(transformers, name, name)  # as AutoBridge looks an architecture up
    if module is not None and model_bridges.looked_up_alike(key, name, registry):
        alike[name] = [module, type(model_bridge.get_model_bridge(key)).__module__]
    elif module is not None:
        other.append(name)
print(json.dumps({"alike": alike, "other": other}))
"""


def test_each_architecture_named_and_looked_up_alike_gets_that_modules_bridge_after_a_plain_import():
    """The others make register_bridges() import every bridge: their lookup could find another one's."""
    done = subprocess.run(
        [sys.executable, "-c", WHOLE], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    alike = found["alike"]
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM"} < set(alike)
    assert len(alike) > 40, found["other"]  # of the 58 architectures one module registers, in megatron-bridge 0.6.2
    assert {name: pair for name, pair in alike.items() if pair[0] != pair[1]} == {}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
NAMES = st.sampled_from(sorted(model_bridges.registrations())) | st.text(max_size=12)
CONFIGS = (
    st.fixed_dictionaries({}, optional={"architectures": st.lists(NAMES, max_size=3) | JSON, "auto_map": JSON}) | JSON
)


def modules_for(folder: Path) -> list[str] | None:
    """The modules register_bridges() imports for a model folder, or None where it imports every bridge's."""
    return model_bridges.registering_modules(model_bridges.plain_architectures(str(folder)))


def vouched_for(config: object) -> list[str] | None:
    """The modules for CONFIG's architectures where each has one and no custom code comes with them."""
    if not isinstance(config, dict) or "auto_map" in config:
        return None
    names = config.get("architectures")
    if not isinstance(names, list) or not names or not all(isinstance(name, str) for name in names):
        return None
    modules = [model_bridges.registrations().get(name) for name in names]
    return None if None in modules or "Qwen2_5OmniModel" in names else sorted(set(modules))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=CONFIGS)
def test_a_config_names_modules_only_for_architectures_with_one_registering_module(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert modules_for(tmp_path) == vouched_for(config)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.binary(max_size=64))
def test_a_config_file_of_any_bytes_is_refused_or_read(tmp_path, text):
    (tmp_path / "config.json").write_bytes(text)
    modules = modules_for(tmp_path)
    assert modules is None or modules == vouched_for(json.loads(text))


def test_no_folder_or_a_missing_config_names_nothing(tmp_path):
    assert model_bridges.registering_modules(model_bridges.plain_architectures(None)) is None
    assert modules_for(tmp_path) is None
    assert modules_for(tmp_path / "missing") is None


# A rank's recipe imports AutoBridge while the inits wait, and register_bridges then gets each hf_path in turn, as a
# configure() would; or ("plain") the recipe's import of AutoBridge as a plain import has it. Says which unneeded
# modules are imported before the first and after each.
RANK = r"""
import json, sys
from launcher.imports import deferred_inits
if sys.argv[1] != "plain":
    deferred_inits.install(bridges_wait=True)
from megatron.bridge import AutoBridge
from tests.test_deferred_inits import unneeded
imported = [unneeded(set(sys.modules))]
for hf_path in sys.argv[1:]:
    if hf_path != "plain":
        deferred_inits.register_bridges(hf_path)
    imported.append(unneeded(set(sys.modules)))
print(json.dumps(imported))
"""


def registered(*hf_paths: str) -> list[list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", RANK, *hf_paths], cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def plain(once) -> list[str]:
    """The unneeded modules that a plain import of AutoBridge imports, found once a session."""
    return once("autobridge-plain-import", lambda: registered("plain"))[-1]


def test_an_architecture_no_module_alone_registers_or_not_looked_up_alike_gets_every_model_bridge(tmp_path, once):
    # Megatron Bridge registers Mistral 3 from inside an `if` of its module, and Flux by diffusers' class, which
    # AutoBridge looks up by its name (transformers has no such class). Both folders in one process: the first
    # registers every bridge already.
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Mistral3ForConditionalGeneration"]}))
    before, after = registered(str(tmp_path))
    assert before == ["megatron.bridge.models.conversion.auto_bridge"]
    assert after == plain(once)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FluxTransformer2DModel"]}))
    assert modules_for(tmp_path) == ["megatron.bridge.diffusion.conversion.flux.flux_bridge"]
    assert registered(str(tmp_path)) == [before, plain(once)]


def test_an_architecture_one_module_registers_gets_that_bridge_alone_and_a_second_configure_another(tmp_path, once):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Mistral3ForConditionalGeneration"]}))
    before, llama, both = registered(str(LLAMA_CONFIG), str(tmp_path))
    assert before == ["megatron.bridge.models.conversion.auto_bridge"]
    assert llama == ["megatron.bridge.models.conversion.auto_bridge", "megatron.bridge.models.llama"]
    assert both == plain(once)


# A rank's model built on the CPU from the Llama recipe with hf_path holding weights: the pre-wrap hook the recipe
# registers loads them. With the inits waiting and the names a pretrain never calls postponed ("deferred": the Llama
# bridge alone) or a plain import ("plain").
# Prints a digest of each tensor of the built model and of the Hugging Face embedding.
LOAD = r"""
import hashlib, json, os, sys
mode, hf_path, port = sys.argv[1:]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
from launcher.imports import deferred_inits, deferred_names
if mode == "deferred":
    deferred_inits.install(bridges_wait=True)
    deferred_names.install()
import torch
from megatron.bridge.recipes.llama.llama3 import llama3_8b_pretrain_config
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from safetensors.torch import load_file
from recipes import shared
torch.distributed.init_process_group("gloo")
parallel_state.initialize_model_parallel()
deferred_inits.register_bridges(hf_path)  # as overrides.build_config does before configure()
model = shared.from_hf(llama3_8b_pretrain_config, "meta-llama/Meta-Llama-3-8B", hf_path).model
# Megatron's own CPU layers (Transformer Engine needs CUDA), in float32, none of the CUDA-only fusions
model.transformer_impl, model.transformer_layer_spec = "local", get_gpt_layer_local_spec()
model.bf16, model.params_dtype, model.gradient_accumulation_fusion = False, torch.float32, False
model.tensor_model_parallel_size = model.pipeline_model_parallel_size = model.context_parallel_size = 1
model.sequence_parallel = False
for fusion in ("persist_layer_norm", "bias_dropout_fusion", "apply_rope_fusion", "masked_softmax_fusion",
               "bias_activation_fusion", "cross_entropy_loss_fusion"):
    setattr(model, fusion, False)
model.finalize()
(built,) = model.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)
digest = lambda tensor: hashlib.sha256(tensor.float().contiguous().numpy().tobytes()).hexdigest()
tensors = {name: digest(value) for name, value in built.state_dict().items() if isinstance(value, torch.Tensor)}
hf_embedding = digest(load_file(os.path.join(hf_path, "model.safetensors"))["model.embed_tokens.weight"])
print(json.dumps({"tensors": tensors, "hf_embedding": hf_embedding}))
"""


def loaded(mode: str, hf_path: Path) -> dict:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    command = [sys.executable, "-c", LOAD, mode, str(hf_path), port]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_rank_with_the_llama_bridge_alone_loads_the_weights_a_plain_import_loads(tmp_path):
    hf_path = hf_models.write("llama", tmp_path / "llama", weights="random")
    deferred, plain = loaded("deferred", hf_path), loaded("plain", hf_path)
    assert deferred["tensors"]["embedding.word_embeddings.weight"] == deferred["hf_embedding"]
    assert len(deferred["tensors"]) > 10
    assert deferred == plain
