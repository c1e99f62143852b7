"""launcher/config/overrides.py in-process and fast: NAME=VALUE arguments in
Hydra's override grammar (https://hydra.cc/docs/advanced/override_grammar/basic/: `a=1,2` is a sweep, `+a` adds a
key, `~a` deletes one, `[..]` is a list, `null` is None) applied to Megatron Bridge's vanilla GPT ConfigContainer,
with what Hydra and omegaconf would accept silently refused in one line. tests/test_entrypoint.py runs the same
through entrypoint.py."""

import dataclasses
import enum
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config

from launcher.config import grammar, overrides
from launcher.errors import UsageError


@pytest.fixture
def cfg():
    return vanilla_gpt_pretrain_config()


def apply(cfg, *arguments: str) -> dict[str, Any]:
    return overrides.apply(cfg, grammar.parse(list(arguments)))


def refusal(call, *args) -> str:
    with pytest.raises(UsageError) as refused:
        call(*args)
    return str(refused.value)


# ---- the grammar ---------------------------------------------------------------------------------------------------


def test_each_argument_is_parsed_by_hydras_grammar():
    parsed = grammar.parse(["train.train_iters=1000", "+extra.key=1", "~model.seq_length", "a=[1,2]", "b=null"])
    assert [o.key_or_group for o in parsed] == ["train.train_iters", "extra.key", "model.seq_length", "a", "b"]
    assert [o.value() for o in parsed if not o.is_delete()] == [1000, 1, [1, 2], None]
    assert grammar.parse([]) == []


def test_a_malformed_argument_is_refused_with_the_grammar_and_hydras_reason():
    line = refusal(grammar.parse, ["train.train_iters=[1"])
    assert line.startswith(
        "malformed argument 'train.train_iters=[1': expected NAME=VALUE in Hydra syntax, e.g. train.train_iters=1000 ("
    )
    assert line.endswith("(no viable alternative at input '[1')")  # Hydra's reason


def test_a_key_given_twice_is_refused_whatever_its_prefix():
    assert refusal(grammar.parse, ["a=1", "b=2", "a=3"]) == "'a' is given twice: keep one NAME=VALUE per key"
    assert refusal(grammar.parse, ["+a=1", "a=2"]) == "'a' is given twice: keep one NAME=VALUE per key"


@pytest.mark.parametrize(
    "argument", ["a=range(1,3)", "a=choice(1,2)", "+a=1,2", "++a=1,2", "a='x',y", 'a="x",y', "a=x,${y}", "a=[1],2"]
)
def test_a_sweep_that_cannot_be_the_text_typed_is_refused_at_once(argument: str):
    assert refusal(grammar.parse, [argument]) == (
        f"{argument!r} is a Hydra sweep, which a launch cannot run: give one value, or write a list as NAME=[a,b]"
    )


def test_a_plain_sweep_waits_for_the_field_it_sets():
    (override,) = grammar.parse(["dataset.split=90,5,5"])
    assert override.is_sweep_override()
    assert grammar.may_be_text(override)
    assert overrides.typed_value(override) == "90,5,5"
    (spaced,) = grammar.parse(["dataset.split= 90,5,5 "])
    assert overrides.typed_value(spaced) == "90,5,5"


@pytest.mark.parametrize(
    ("annotation", "text_only"),
    [
        (str, True),
        (str | None, True),
        (typing.Optional[str], True),  # noqa: UP045 (the older spelling, as dataclasses upstream write it)
        (typing.Union[str, None], True),  # noqa: UP007
        (int, False),
        (str | int, False),
        (str | int | None, False),
        (list[str], False),
        (None, False),
        (typing.Literal["a"], False),
    ],
)
def test_fields_that_take_only_a_string(annotation, text_only: bool):
    (sweep,) = grammar.parse(["dataset.split=90,5,5"])
    if text_only:
        assert overrides.as_text(sweep, annotation).value() == "90,5,5"
    else:
        with pytest.raises(UsageError, match="is a Hydra sweep"):
            overrides.as_text(sweep, annotation)


def test_a_sweep_for_a_string_field_is_the_string_typed_and_any_other_is_refused():
    (sweep,) = grammar.parse(["dataset.split=90,5,5"])
    text = overrides.as_text(sweep, str)
    assert (text.value(), text.is_sweep_override()) == ("90,5,5", False)
    (plain,) = grammar.parse(["dataset.split=x"])
    assert overrides.as_text(plain, int) is plain
    assert refusal(overrides.as_text, sweep, int) == (
        "'dataset.split=90,5,5' is a Hydra sweep, which a launch cannot run: give one value"
    )
    assert refusal(overrides.as_text, sweep, list[int] | None) == (
        "'dataset.split=90,5,5' is a Hydra sweep, which a launch cannot run: write a list as NAME=[a,b]"
    )
    assert refusal(overrides.as_text, sweep, None).endswith("give one value, or write a list as NAME=[a,b]")


# ---- configure()'s parameters --------------------------------------------------------------------------------------


def configure(use_megatron_fsdp: bool = False, data_paths: list[str | float] | str | None = None, seed=1):
    raise AssertionError("only its signature is read")


def test_parameters_of_configure_become_its_keyword_arguments_and_the_rest_edit_the_config():
    given_arguments = ["use_megatron_fsdp=true", "train.train_iters=5", "data_paths=[0.3,a,0.7,b]", "seed=x"]
    kwargs, rest = overrides.split_for_configure(configure, grammar.parse(given_arguments))
    assert kwargs == {"use_megatron_fsdp": True, "data_paths": [0.3, "a", 0.7, "b"], "seed": "x"}
    assert [o.key_or_group for o in rest] == ["train.train_iters"]


def test_a_parameter_with_a_prefix_edits_the_config_instead():
    kwargs, rest = overrides.split_for_configure(configure, grammar.parse(["+use_megatron_fsdp=true", "~seed"]))
    assert kwargs == {}
    assert [o.key_or_group for o in rest] == ["use_megatron_fsdp", "seed"]


def test_a_parameter_of_the_wrong_type_is_refused_with_the_type_it_takes():
    line = refusal(overrides.split_for_configure, configure, grammar.parse(["use_megatron_fsdp=maybe"]))
    assert line == "use_megatron_fsdp=maybe has the wrong type: configure() takes bool"
    line = refusal(overrides.split_for_configure, configure, grammar.parse(["data_paths=a,b"]))
    assert line == "'data_paths=a,b' is a Hydra sweep, which a launch cannot run: write a list as NAME=[a,b]"
    line = refusal(overrides.split_for_configure, configure, grammar.parse(["seed=a,b"]))  # no annotation
    assert (
        line == "'seed=a,b' is a Hydra sweep, which a launch cannot run: give one value, or write a list as NAME=[a,b]"
    )


# ---- the config ----------------------------------------------------------------------------------------------------


def test_overrides_edit_the_config_in_place_and_say_what_each_key_now_is(cfg):
    said = apply(
        cfg, "train.train_iters=7", "dataset.split=90,5,5", "model.params_dtype=bf16", "train.train_samples=null"
    )
    assert (cfg.train.train_iters, cfg.dataset.split, cfg.model.params_dtype) == (7, "90,5,5", torch.bfloat16)
    assert said == {
        "train.train_iters": 7,
        "dataset.split": "90,5,5",
        "model.params_dtype": "bf16",
        "train.train_samples": None,
    }
    assert overrides.apply(cfg, []) == {}


def test_a_list_value_is_said_as_a_list(cfg):
    said = apply(cfg, "profiling.profile_ranks=[0,1]")
    assert said == {"profiling.profile_ranks": [0, 1]}
    assert isinstance(said["profiling.profile_ranks"], list)


def test_an_unknown_key_is_refused_with_the_closest_name(cfg):
    assert refusal(apply, cfg, "train.train_itres=5") == (
        "unknown config key 'train.train_itres' ('train' has no key 'train_itres'); did you mean 'train.train_iters'?"
    )
    assert refusal(apply, cfg, "trian.train_iters=5") == (
        "unknown config key 'trian.train_iters' (the config has no section 'trian'); did you mean 'train'?"
    )
    assert refusal(apply, cfg, "train.zzzzzz=5") == "unknown config key 'train.zzzzzz' ('train' has no key 'zzzzzz')"


def test_a_key_of_a_dict_field_may_be_added_and_deleted_and_an_unknown_one_is_named_in_its_dict(cfg):
    """tokenizer.hf_tokenizer_kwargs is a dict (Megatron Bridge passes it to the tokenizer): its keys are the user's."""
    said = apply(cfg, "+tokenizer.hf_tokenizer_kwargs.use_fast=false")
    assert said == {"tokenizer.hf_tokenizer_kwargs.use_fast": False}
    assert cfg.tokenizer.hf_tokenizer_kwargs == {"use_fast": False}
    assert refusal(apply, cfg, "tokenizer.hf_tokenizer_kwargs.legacy=true") == (
        "unknown config key 'tokenizer.hf_tokenizer_kwargs.legacy' ('tokenizer.hf_tokenizer_kwargs' has no key"
        " 'legacy')"
    )
    assert apply(cfg, "~tokenizer.hf_tokenizer_kwargs.use_fast") == {}
    assert cfg.tokenizer.hf_tokenizer_kwargs == {}


def test_what_hydra_refuses_as_it_applies_an_override_is_refused_in_its_words(cfg):
    cfg.tokenizer.hf_tokenizer_kwargs = {"use_fast": True}
    assert refusal(apply, cfg, "~tokenizer.hf_tokenizer_kwargs.use_fast=false") == (
        "Could not delete from config. The value of 'tokenizer.hf_tokenizer_kwargs.use_fast' is True and not False."
    )


def test_a_key_below_a_null_dict_names_the_dict(cfg):
    cfg.tokenizer.hf_tokenizer_kwargs = None
    assert refusal(apply, cfg, "tokenizer.hf_tokenizer_kwargs.use_fast=true") == (
        "cannot set 'tokenizer.hf_tokenizer_kwargs.use_fast': 'tokenizer.hf_tokenizer_kwargs' is null in this recipe;"
        " set it in the recipe first"
    )


def test_adding_a_field_to_a_dataclass_is_refused(cfg):
    assert refusal(apply, cfg, "+train.new_knob=1") == (
        "'+train.new_knob' adds a key the config does not have, and Megatron Bridge would drop it silently: use an"
        " existing key, without '+'"
    )
    assert refusal(apply, cfg, "++train.new_knob=1").startswith("'+train.new_knob' adds a key the config does not")


def test_deleting_a_field_is_refused_with_null_as_the_fix(cfg):
    assert refusal(apply, cfg, "~train.train_iters") == (
        "'~train.train_iters' would delete a config field, which Megatron Bridge ignores: set train.train_iters=null"
        " instead"
    )


def test_a_key_below_a_value_or_below_null_is_refused(cfg):
    assert refusal(apply, cfg, "train.train_iters.deeper=1") == (
        "cannot set 'train.train_iters.deeper': 'train.train_iters' is a value, not a section"
    )
    cfg.comm_overlap = None
    assert refusal(apply, cfg, "comm_overlap.tp_comm_overlap=true") == (
        "cannot set 'comm_overlap.tp_comm_overlap': 'comm_overlap' is null in this recipe; set it in the recipe first"
    )


def test_a_value_of_the_wrong_type_is_refused_with_the_fields_type(cfg):
    assert refusal(apply, cfg, "train.train_iters=abc") == (
        "train.train_iters=abc has the wrong type: TrainingConfig.train_iters takes int | None"
    )
    assert refusal(apply, cfg, "train.train_iters=1.5").startswith("train.train_iters=1.5 has the wrong type: ")
    line = refusal(apply, cfg, "model.params_dtype=bf17")
    assert line.startswith("model.params_dtype=bf17 has the wrong type: GPTModelProvider.params_dtype takes a dtype: ")
    assert "bf16" in line and "torch.bfloat16" not in line
    assert refusal(apply, cfg, "model.params_dtype=[1]").startswith("model.params_dtype=[1] has the wrong type: ")


def test_what_omegaconf_cannot_resolve_is_refused_in_its_words(cfg):
    assert refusal(apply, cfg, "train.train_iters=${nowhere.at_all}") == (
        "'train.train_iters=${nowhere.at_all}' cannot be resolved (Interpolation key 'nowhere.at_all' not found):"
        " give a value, or ${KEY} of a key the config has"
    )
    assert apply(cfg, "train.train_iters=${train.global_batch_size}") == {
        "train.train_iters": cfg.train.global_batch_size
    }
    assert cfg.train.train_iters == cfg.train.global_batch_size  # resolved, not the text ${...}
    said = apply(cfg, "profiling.profile_ranks=[0,${train.micro_batch_size}]")
    assert said == {"profiling.profile_ranks": [0, cfg.train.micro_batch_size]}
    assert cfg.profiling.profile_ranks == [0, cfg.train.micro_batch_size]


def test_a_sweep_of_a_string_field_is_the_string_and_of_an_int_field_is_refused(cfg):
    assert apply(cfg, "dataset.split=80,10,10") == {"dataset.split": "80,10,10"}
    assert refusal(apply, cfg, "train.train_iters=1,2") == (
        "'train.train_iters=1,2' is a Hydra sweep, which a launch cannot run: give one value"
    )


# ---- the fields' annotations ---------------------------------------------------------------------------------------


def test_the_annotation_of_a_key_is_its_dataclass_fields(cfg):
    assert overrides.field_annotation(cfg, "train.train_iters") == typing.Optional[int]  # noqa: UP045
    assert overrides.field_annotation(cfg, "train") is not None
    assert overrides.is_dataclass_at(cfg, ["train"]) and not overrides.is_dataclass_at(cfg, ["train", "train_iters"])
    assert overrides.object_at(cfg, ["train", "train_iters"]) == cfg.train.train_iters
    assert overrides.object_at({"a": {"b": 3}}, ["a", "b"]) == 3


def test_a_dataclass_whose_annotations_cannot_be_resolved_is_left_unchecked():
    @dataclasses.dataclass
    class Unresolved:
        x: "NoSuchType"  # noqa: F821

    assert overrides.field_types(Unresolved) == {}


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


@dataclasses.dataclass
class Section:
    n: int = 0


T = typing.TypeVar("T")


@pytest.mark.parametrize(
    ("value", "annotation", "fits"),
    [
        (1, int, True),
        (True, int, False),
        (1.5, int, False),
        (1, float, True),
        (1.5, float, True),
        (False, float, False),
        (True, bool, True),
        (1, bool, False),
        ("x", str, True),
        (1, str, False),
        ("/a", Path, True),
        (1, Path, False),
        ("bf16", torch.dtype, True),
        ("bf17", torch.dtype, False),
        (None, int | None, True),
        (None, int, False),
        (None, type(None), True),
        (0, type(None), False),
        ("a", Literal["a", "b"], True),
        ("c", Literal["a", "b"], False),
        ([1, 2], list[int], True),
        ([1, "x"], list[int], False),
        ((1, 2), tuple[int, ...], True),
        ([1, "x"], tuple[int, ...], True),
        (["x"], list, True),
        ("x", list[str], False),
        ({"a": 1}, dict[str, int], True),
        ({"a": 1}, dict, True),
        ([1], dict, False),
        ("RED", Color, True),
        ("red", Color, True),
        (2, Color, True),
        ("GREEN", Color, False),
        (["RED"], Color, False),
        ({"n": 1}, Section, True),
        (None, Section, True),
        (3, Section, False),
        (object(), Any, True),
        (object(), T, True),
        (object(), complex, True),  # a type it does not know: lenient
    ],
)
def test_which_values_fit_which_fields(value, annotation, fits: bool):
    assert overrides.matches_type(value, annotation) is fits


@given(st.integers())
def test_every_integer_fits_int_and_float_fields_and_no_string_or_bool_field(number: int):
    assert overrides.matches_type(number, int) and overrides.matches_type(number, float)
    assert not overrides.matches_type(number, str) and not overrides.matches_type(number, bool)
    assert overrides.matches_type(number, int | None) and not overrides.matches_type(number, list[int])


@given(st.text())
def test_every_string_fits_a_string_field_and_no_number_field(text: str):
    assert overrides.matches_type(text, str) and overrides.matches_type(text, str | None)
    assert not overrides.matches_type(text, int) and not overrides.matches_type(text, float)


def test_type_names_are_those_a_user_types():
    assert overrides.type_name(int) == "int"
    assert overrides.type_name(typing.Optional[int]) == "Optional[int]"  # noqa: UP045
    assert overrides.type_name(list[str]) == "list[str]"
    assert overrides.type_name(Literal["a", "b"]) == "Literal['a', 'b']"  # the choices, not just "Literal"
    dtypes = overrides.type_name(torch.dtype)
    assert dtypes.startswith("a dtype: ") and "bf16" in dtypes and "torch." not in dtypes
    assert dtypes.split(": ")[1].split(", ") == sorted(dtypes.split(": ")[1].split(", "))
    assert overrides.type_name(torch.dtype | None) == dtypes


def test_the_selected_value_of_a_section_is_plain_data(cfg):
    tree, _ = overrides.omegaconf_utils.create_omegaconf_dict_config(cfg)
    assert isinstance(overrides.selected(tree, "train"), dict)
    assert overrides.selected(tree, "train.train_iters") == cfg.train.train_iters
