"""launcher/config/splits.py's arithmetic and lines, in-process and fast: the
documents megatron-core's builder gives each split, each part's sample target (Megatron-LM's formula for the split
targets, megatron-core's ceil(target x weight x (1 + surplus)) for a weighted blend), the sample count of one epoch,
and the refusal's words. The values are worked out by hand from those formulas; tests/test_data_splits.py runs
megatron-core's own builder on what the check passes and refuses."""

import math

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st
from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config
from megatron.bridge.training.config import GPTDatasetConfig
from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from megatron.core.datasets.utils import Split

from launcher.config import data, splits
from launcher.errors import UsageError


def dataset_config(**fields) -> GPTDatasetConfig:
    given_fields = {"random_seed": 1, "seq_length": 8, "blend": (["a"], None), "split": "90,5,5", **fields}
    return GPTDatasetConfig(reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, **given_fields)


def run_data(config: GPTDatasetConfig, lengths: dict[str, list[int]], targets=(80, 40, 8)) -> splits.RunData:
    blend, per_split = data.run_blends(config)
    arrays = {prefix: numpy.array(values, dtype=numpy.int32) for prefix, values in lengths.items()}
    return splits.RunData(config, blend, per_split, list(targets), arrays)


@pytest.fixture
def cfg():
    """Megatron Bridge's vanilla GPT config with a short schedule: targets 80 train, (20 // 5 + 1) x 2 x 4 = 40 valid,
    2 x 4 = 8 test samples (Megatron-LM's split targets)."""
    cfg = vanilla_gpt_pretrain_config()
    cfg.train.train_iters, cfg.train.global_batch_size = 20, 4
    cfg.validation.eval_interval, cfg.validation.eval_iters = 5, 2
    cfg.dataset.seq_length = 8
    return cfg


# ---- sample targets ------------------------------------------------------------------------------------------------


def test_sample_targets_follow_megatron_lms_formula(cfg):
    assert splits.sample_targets(cfg) == [80, 40, 8]


def test_train_samples_become_iterations_on_a_copy_and_the_users_config_is_unchanged(cfg):
    cfg.train.train_iters, cfg.train.train_samples = None, 40  # 40 / 4 = 10 iterations: (10 // 5 + 1) x 8 valid
    assert splits.sample_targets(cfg) == [40, 24, 8]
    assert cfg.train.train_iters is None


def test_a_training_length_known_only_from_the_data_gives_no_targets(cfg):
    cfg.train.train_iters, cfg.train.train_samples = None, None
    assert splits.sample_targets(cfg) is None


def test_a_training_length_megatron_bridge_refuses_gives_no_targets_and_no_check(cfg):
    cfg.train.train_samples = 40  # both train_iters and train_samples: Bridge's finalize asserts
    assert splits.sample_targets(cfg) is None
    splits.check_splits(cfg, data.run_blends(cfg.dataset), {"a": numpy.array([], dtype=numpy.int32)})  # nothing judged


# ---- which blend is read -------------------------------------------------------------------------------------------


def test_data_path_is_the_blend_when_no_blend_is_given():
    config = dataset_config(blend=None)
    config.data_path = "0.3 a 0.7 b"
    assert data.run_blends(config) == ((["a", "b"], [0.3, 0.7]), None)
    config.data_path = ["a", "b"]
    assert data.run_blends(config) == ((["a", "b"], None), None)


def test_a_blend_per_split_wins_over_data_path_and_an_empty_one_does_not():
    per_split = [(["a"], None), None, (["b"], None)]
    config = dataset_config(blend=None, blend_per_split=per_split, split=None)
    config.data_path = "c"
    assert data.run_blends(config) == (None, per_split)
    config = dataset_config(blend=(["d"], None), blend_per_split=[None, None, None])
    config.data_path = "c"
    assert data.run_blends(config) == ((["d"], None), None)


# ---- the documents of each split -----------------------------------------------------------------------------------


def test_90_5_5_of_20_documents_gives_18_1_1_with_their_tokens():
    lengths = list(range(1, 21))  # document i has i tokens
    parts = splits.split_parts(run_data(dataset_config(), {"a": lengths}), "90,5,5")
    assert parts == [
        splits.Part("a", Split.train, 18, sum(range(1, 19)), 80),
        splits.Part("a", Split.valid, 1, 19, 40),
        splits.Part("a", Split.test, 1, 20, 8),
    ]


def test_a_split_of_weight_0_is_not_built():
    parts = splits.split_parts(run_data(dataset_config(), {"a": [3] * 10}), "100,0,0")
    assert parts == [splits.Part("a", Split.train, 10, 30, 80)]


@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=60),
    weights=st.tuples(st.integers(0, 100), st.integers(0, 100), st.integers(0, 100)).filter(lambda w: sum(w) > 0),
)
def test_the_splits_cut_every_document_once_in_order(lengths: list[int], weights: tuple[int, int, int]):
    split = ",".join(map(str, weights))
    parts = splits.split_parts(run_data(dataset_config(split=split), {"a": lengths}), split)
    assert sum(part.documents for part in parts) == len(lengths)
    assert sum(part.tokens for part in parts) == sum(lengths)
    assert [part.split for part in parts] == [s for s, w in zip(Split, weights, strict=True) if w]
    begin = 0
    for part in parts:  # megatron-core's cut: round(bound x documents) at both ends
        assert part.tokens == sum(lengths[begin : begin + part.documents])
        begin += part.documents


def test_a_weighted_blend_gives_each_dataset_ceil_of_its_share_with_megatron_cores_surplus():
    config = dataset_config(blend=(["a", "b"], [1.0, 3.0]))  # weights 0.25 and 0.75; surplus 0.005
    parts = splits.split_parts(run_data(config, {"a": [5] * 20, "b": [5] * 20}), "90,5,5")
    samples = {(part.prefix, part.split): part.samples for part in parts}
    assert samples == {
        ("a", Split.train): math.ceil(80 * 0.25 * 1.005),  # 21
        ("b", Split.train): math.ceil(80 * 0.75 * 1.005),  # 61
        ("a", Split.valid): math.ceil(40 * 0.25 * 1.005),  # 11
        ("b", Split.valid): math.ceil(40 * 0.75 * 1.005),  # 31
        ("a", Split.test): math.ceil(8 * 0.25 * 1.005),  # 3
        ("b", Split.test): math.ceil(8 * 0.75 * 1.005),  # 7
    }


def test_an_unweighted_blend_reads_each_dataset_once_and_object_storage_is_left_out():
    config = dataset_config(blend=(["a", "s3://bucket/b"], None))
    parts = splits.split_parts(run_data(config, {"a": [5] * 20}), "90,5,5")
    assert [(part.prefix, part.samples) for part in parts] == [("a", None)] * 3


def test_each_split_of_a_blend_per_split_reads_its_datasets_whole_with_its_own_target():
    per_split = [(["a"], None), (["b", "c"], None), None]
    config = dataset_config(blend=None, blend_per_split=per_split, split=None)
    data = run_data(config, {"a": [4] * 6, "b": [4] * 3, "c": [4] * 2})
    parts = splits.split_parts(data, None)
    assert parts == [
        splits.Part("a", Split.train, 6, 24, 80),
        splits.Part("b", Split.valid, 3, 12, None),  # an unweighted blend of two: one epoch each
        splits.Part("c", Split.valid, 2, 8, None),
    ]
    config.multiple_validation_sets = True  # each validation dataset its own, of the whole validation target
    parts = splits.split_parts(run_data(config, {"a": [4] * 6, "b": [4] * 3, "c": [4] * 2}), None)
    assert [part.samples for part in parts] == [80, 40, 40]


def test_several_validation_sets_of_one_blend_still_share_the_target():
    config = dataset_config(blend=(["a", "b"], None), multiple_validation_sets=True)
    parts = splits.split_parts(run_data(config, {"a": [5] * 20, "b": [5] * 20}), "90,5,5")
    assert {part.samples for part in parts} == {None}


# ---- one epoch's samples and what cannot be built -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("split", "tokens", "extra", "drop_last", "expected"),
    [
        (Split.train, 17, True, True, 2),  # (17 - 1) // 8: the extra token of each sample's labels
        (Split.train, 16, True, True, 1),  # 15 // 8
        (Split.train, 16, False, True, 2),  # 16 // 8 without the extra token
        (Split.train, 16, True, False, 1),  # the partial-sequence switch is for validation only
        (Split.valid, 16, True, True, 1),
        (Split.valid, 16, True, False, 2),  # ceil(15 / 8): the partial validation sequence is kept
        (Split.test, 12, True, False, 1),
    ],
)
def test_one_epoch_samples_as_gpt_dataset_counts_them(split, tokens, extra, drop_last, expected):
    config = dataset_config(add_extra_token_to_sequence=extra, drop_last_partial_validation_sequence=drop_last)
    assert splits.one_epoch_samples(splits.Part("a", split, 3, tokens, None), config) == expected


def test_sequence_length_is_bridges_field_or_megatron_cores():
    config = dataset_config(seq_length=8)
    assert splits.sequence_length(config) == 8
    config.seq_length = None
    config.sequence_length = 12
    assert splits.sequence_length(config) == 12


@pytest.mark.parametrize(
    ("samples", "tokens", "expected"),
    [
        (5, 0, splits.NO_TOKENS),  # a target and no tokens: GPTDataset's endless epochs
        (5, 1, None),  # one token repeats until the target is met
        (None, 9, None),  # one epoch of (9 - 1) // 8 = 1 sample
        (None, 8, splits.NO_SAMPLE),  # (8 - 1) // 8 = 0 samples: BlendedDataset's assert
        (None, 0, splits.NO_SAMPLE),
    ],
)
def test_what_megatron_core_cannot_build(samples, tokens, expected):
    assert splits.unbuildable(splits.Part("a", Split.train, 2, tokens, samples), dataset_config()) == expected


# ---- the refusal ---------------------------------------------------------------------------------------------------


def test_one_and_several_parts_without_tokens_are_named_with_their_targets():
    one = [splits.Part("a", Split.valid, 0, 0, 1200)]
    assert splits.problems(one, dataset_config()) == (
        "the valid split of a (1,200 samples) gets no document: megatron-core's GPTDataset would loop forever"
        " looking for the tokens of their samples, and the job would hang before its first step"
    )
    two = [splits.Part("a", Split.valid, 2, 0, 40), splits.Part("a", Split.test, 0, 0, 8)]
    assert splits.problems(two, dataset_config()).startswith(
        "the valid split of a (40 samples, 2 documents of 0 tokens) and the test split of a (8 samples) get no"
        " document: "
    )


def test_parts_of_less_than_one_sample_are_named_with_the_sample_size():
    config = dataset_config(seq_length=2048)
    one = [splits.Part("b", Split.train, 1, 1000, None), splits.Part("a", Split.train, 9, 5000, None)]
    assert splits.problems(one, config) == (
        "the train split of b (1 documents, 1,000 tokens) holds less than one sample (dataset.seq_length+1=2,049"
        " tokens): megatron-core's BlendedDataset refuses a dataset of 0 samples in a blend without weights"
    )
    two = [splits.Part("b", Split.train, 1, 1000, None), splits.Part("b", Split.test, 0, 0, None)]
    assert " and the test split of b (0 documents, 0 tokens) hold less than one sample" in splits.problems(two, config)


def test_both_reasons_are_given_in_one_line_and_a_buildable_run_has_none():
    config = dataset_config()
    parts = [splits.Part("a", Split.valid, 0, 0, 40), splits.Part("b", Split.train, 1, 3, None)]
    said = splits.problems(parts, config)
    assert said.index("gets no document") < said.index("; the train split of b") < said.index("holds less than")
    assert splits.problems([splits.Part("a", Split.train, 9, 90, 80)], config) == ""


def test_the_issue_corpus_is_refused_with_the_split_that_works(cfg):
    """167 documents: 9999,8,2 gives valid and test none; 90,5,5 gives 150, 9 and 8 (round(0.9 x 167) = 150)."""
    cfg.dataset.blend, cfg.dataset.split = (["web"], None), "9999,8,2"
    with pytest.raises(UsageError) as refused:
        splits.check_splits(cfg, data.run_blends(cfg.dataset), {"web": numpy.full(167, 100, dtype=numpy.int32)})
    assert str(refused.value) == (
        "the valid split of web (40 samples) and the test split of web (8 samples) get no document: megatron-core's"
        " GPTDataset would loop forever looking for the tokens of their samples, and the job would hang before its"
        " first step (dataset.split=9999,8,2: web (167 documents) gets 167 train, 0 valid, 0 test): pass"
        " dataset.split=90,5,5: web gets 150 train, 9 valid, 8 test"
    )


def test_a_run_that_fits_its_data_passes(cfg):
    cfg.dataset.blend, cfg.dataset.split = (["web"], None), "90,5,5"
    splits.check_splits(cfg, data.run_blends(cfg.dataset), {"web": numpy.full(167, 100, dtype=numpy.int32)})


def test_mock_data_is_not_judged(cfg):
    cfg.dataset = object()  # no BlendedMegatronDatasetConfig: nothing of megatron-core's builder to judge
    splits.check_splits(cfg, (None, None), {})


def test_the_offered_split_is_the_first_that_builds_and_the_last_trains_on_everything():
    data = run_data(dataset_config(split="9999,8,2"), {"a": [5] * 12})  # 90,5,5: 11, 0, 1; 80,10,10: 10, 1, 1
    assert splits.fix(data) == "pass dataset.split=80,10,10: a gets 10 train, 1 valid, 1 test"
    data = run_data(dataset_config(split="9999,8,2"), {"a": [5] * 2})  # 2 documents: 2, 0, 0 or 1, 1, 0
    assert splits.fix(data) == "pass dataset.split=100,0,0 (no validation or test): a gets 2 train, 0 valid, 0 test"


def test_no_offered_split_builds_an_unweighted_blend_of_a_too_small_dataset():
    config = dataset_config(blend=(["a", "b"], None), seq_length=64)
    data = run_data(config, {"a": [100] * 20, "b": [5] * 3})
    assert splits.fix(data) == (
        "give the blend weights (data_paths=[WEIGHT,PREFIX,...]), or prepare more text for each dataset"
    )
    single = run_data(dataset_config(seq_length=64), {"a": [5] * 3}, targets=(80, 0, 0))
    assert splits.fix(run_data(dataset_config(), {"a": []})) == "prepare more text for each dataset"
    assert splits.fix(single) == "pass dataset.split=100,0,0 (no validation or test): a gets 3 train, 0 valid, 0 test"


def test_a_blend_per_split_is_refused_with_each_splits_documents(cfg):
    cfg.dataset.blend, cfg.dataset.split = None, None
    cfg.dataset.blend_per_split = [(["a"], None), (["b"], None), None]
    with pytest.raises(UsageError) as refused:
        splits.check_splits(
            cfg,
            data.run_blends(cfg.dataset),
            {"a": numpy.full(5, 10, dtype=numpy.int32), "b": numpy.zeros(2, dtype=numpy.int32)},
        )
    assert str(refused.value) == (
        "the valid split of b (40 samples, 2 documents of 0 tokens) gets no document: megatron-core's GPTDataset would"
        " loop forever looking for the tokens of their samples, and the job would hang before its first step"
        " (blend_per_split: a gets 5 train, 0 valid, 0 test documents; b gets 0 train, 2 valid, 0 test documents):"
        " give each split a dataset with more text"
    )


def test_a_refused_blend_names_each_datasets_documents_once():
    config = dataset_config(blend=(["a", "b"], [1.0, 1.0]), split="9999,8,2")
    data = run_data(config, {"a": [5] * 12, "b": [5] * 30})
    parts = splits.split_parts(data, config.split)
    said = splits.problems(parts, config)
    assert splits.refusal(said, parts, data) == (
        f"{said} (dataset.split=9999,8,2: a (12 documents) gets 12 train, 0 valid, 0 test; b (30 documents) gets 30"
        " train, 0 valid, 0 test): pass dataset.split=80,10,10: a gets 10 train, 1 valid, 1 test; b gets 24 train,"
        " 3 valid, 3 test"
    )


def test_a_dataset_config_without_gpts_fields_is_counted_with_gpt_datasets_defaults():
    """megatron-core's own BlendedMegatronDatasetConfig has neither data_path (Bridge's) nor the GPT fields: its
    blend is read, and a part's samples are counted as GPTDatasetConfig's defaults count them (an extra token per
    sample, the partial last validation sequence dropped)."""
    config = BlendedMegatronDatasetConfig(random_seed=1, sequence_length=8, blend=(["a"], None), split="90,5,5")
    assert data.run_blends(config) == ((["a"], None), None)
    assert splits.one_epoch_samples(splits.Part("a", Split.train, 2, 16, None), config) == 1  # 15 // 8
    assert splits.one_epoch_samples(splits.Part("a", Split.valid, 2, 16, None), config) == 1  # not ceil(15 / 8)


def test_the_sequence_length_the_user_set_counts_before_bridge_copies_it_at_finalize(cfg):
    """dataset.seq_length=8 on the recipe's config leaves megatron-core's sequence_length at the recipe's 1024 until
    Megatron Bridge finalizes the config: 9 tokens make one sample of 8 + 1."""
    assert cfg.dataset.sequence_length != 8
    cfg.dataset.blend, cfg.dataset.split = (["a", "b"], None), "100,0,0"
    splits.check_splits(cfg, data.run_blends(cfg.dataset), {"a": numpy.array([9]), "b": numpy.array([9])})


def test_an_unweighted_blend_with_a_dataset_of_less_than_one_sample_is_refused(cfg):
    cfg.dataset.blend, cfg.dataset.split = (["a", "b"], None), "100,0,0"
    with pytest.raises(UsageError) as refused:
        splits.check_splits(cfg, data.run_blends(cfg.dataset), {"a": numpy.full(20, 100), "b": numpy.array([4, 4])})
    assert str(refused.value).startswith(
        "the train split of b (2 documents, 8 tokens) holds less than one sample (dataset.seq_length+1=9 tokens)"
    )
