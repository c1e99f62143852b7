"""Which documents each split of the run's data gets, and whether megatron-core 0.19 can build it (docs/data.md)."""

import copy
import dataclasses
import math

import numpy
from megatron.bridge.data.loaders import get_train_valid_test_num_samples
from megatron.bridge.training.config import ConfigContainer
from megatron.core.datasets.blended_megatron_dataset_builder import _get_size_per_split_per_dataset
from megatron.core.datasets.blended_megatron_dataset_config import (
    BlendedMegatronDatasetConfig,
    convert_split_vector_to_split_matrix,
    parse_and_normalize_split,
)
from megatron.core.datasets.utils import Split, normalize

from launcher.errors import UsageError

# Splits to offer when the run's does not fit its data, most training data first; the last trains on every document.
OFFERED_SPLITS = ("90,5,5", "80,10,10", "50,25,25", "100,0,0")
Blend = tuple[list[str], list[float] | None]
Blends = list[Blend | None] | None  # one per split


@dataclasses.dataclass(frozen=True)
class Part:
    """One dataset's share of one split, as megatron-core builds it."""

    prefix: str
    split: Split
    documents: int
    tokens: int
    samples: int | None  # the part's sample target; None: one epoch (a blend without weights)


@dataclasses.dataclass(frozen=True)
class RunData:
    """What megatron-core's builder gets: the dataset config, its blend(s), split targets and datasets' lengths."""

    config: BlendedMegatronDatasetConfig
    blend: Blend | None
    per_split: Blends
    targets: list[int]
    lengths: dict[str, numpy.ndarray]


def check_splits(cfg: ConfigContainer, blends: tuple[Blend | None, Blends], lengths: dict[str, numpy.ndarray]) -> None:
    """Refuse data whose splits megatron-core would hang on or refuse (docs/data.md, "In the code")."""
    dataset = cfg.dataset
    targets = sample_targets(cfg) if isinstance(dataset, BlendedMegatronDatasetConfig) else None
    if targets is None:
        return
    data = RunData(dataset, *blends, targets, lengths)
    parts = split_parts(data, dataset.split)
    if said := problems(parts, dataset):
        raise UsageError(refusal(said, parts, data))


def sample_targets(cfg: ConfigContainer) -> list[int] | None:
    """Megatron Bridge's sample target of each split, from a finalized cfg.train copy; None when num_epochs sets it."""
    train = copy.copy(cfg.train)
    try:
        train.finalize()
    except AssertionError:  # Megatron Bridge's own validation refuses the training length, in its words
        return None
    if train.train_iters is None:
        return None
    finalized = copy.copy(cfg)
    finalized.train = train
    return list(get_train_valid_test_num_samples(finalized))


def split_parts(data: RunData, split: str | None) -> list[Part]:
    """Every part megatron-core builds with this dataset.split: each local dataset's documents, tokens and target."""
    if data.blend is not None:
        matrix = convert_split_vector_to_split_matrix(parse_and_normalize_split(split or ""))
        return [
            part
            for index, bounds in enumerate(matrix)
            if bounds is not None
            for part in blend_parts(data, data.blend, Split(index), bounds, data.targets)
        ]
    return [
        part
        for index, own in enumerate(data.per_split or [])
        if own is not None  # a split's own blend is read whole, with its target and 0 for the others
        for part in blend_parts(
            data, own, Split(index), (0.0, 1.0), [t * (i == index) for i, t in enumerate(data.targets)]
        )
    ]


def blend_parts(
    data: RunData, blend: Blend, split: Split, bounds: tuple[float, float], targets: list[int]
) -> list[Part]:
    prefixes, weights = blend
    separate = data.blend is None and split == Split.valid and data.config.multiple_validation_sets
    if (len(prefixes) == 1 and weights is None) or separate:  # each validation set its own dataset, of the target
        samples: list[int | None] = [targets[split.value]] * len(prefixes)
    elif weights is None:
        samples = [None] * len(prefixes)
    else:
        surplus = data.config.mid_level_dataset_surplus
        samples = [
            sizes[split.value] for sizes in _get_size_per_split_per_dataset(normalize(weights), targets, surplus)
        ]
    return [
        cut(prefix, split, bounds, data.lengths[prefix], target)
        for prefix, target in zip(prefixes, samples, strict=True)
        if prefix in data.lengths
    ]


def cut(prefix: str, split: Split, bounds: tuple[float, float], lengths: numpy.ndarray, samples: int | None) -> Part:
    """A dataset's documents in a split, cut as BlendedMegatronDatasetBuilder._build_megatron_dataset_splits cuts."""
    begin, end = (round(bound * float(len(lengths))) for bound in bounds)
    return Part(prefix, split, end - begin, int(lengths[begin:end].sum()), samples)


def sequence_length(dataset: BlendedMegatronDatasetConfig) -> int:
    return getattr(dataset, "seq_length", None) or dataset.sequence_length  # Bridge's field, copied at finalize


def one_epoch_samples(part: Part, dataset: BlendedMegatronDatasetConfig) -> int:
    """How many samples GPTDataset makes of one pass over the part's tokens (its length when it has no target)."""
    tokens = part.tokens - int(getattr(dataset, "add_extra_token_to_sequence", True))
    if part.split != Split.valid or getattr(dataset, "drop_last_partial_validation_sequence", True):
        return tokens // sequence_length(dataset)
    return math.ceil(tokens / sequence_length(dataset))


# Why megatron-core cannot build a part: the hang of a target without tokens, the assert of a size of 0 samples.
NO_TOKENS, NO_SAMPLE = "no tokens", "no sample"


def unbuildable(part: Part, dataset: BlendedMegatronDatasetConfig) -> str | None:
    if part.samples is not None and part.tokens == 0:
        return NO_TOKENS
    if part.samples is None and one_epoch_samples(part, dataset) <= 0:
        return NO_SAMPLE
    return None


def problems(parts: list[Part], dataset: BlendedMegatronDatasetConfig) -> str:
    """The parts megatron-core cannot build, grouped by why, in words; empty when it can build them all."""
    named = {NO_TOKENS: [], NO_SAMPLE: []}
    for part in parts:
        reason = unbuildable(part, dataset)
        if reason == NO_TOKENS:
            held = "" if part.documents == 0 else f", {part.documents:,} documents of 0 tokens"
            named[reason].append(f"the {part.split.name} split of {part.prefix} ({part.samples:,} samples{held})")
        elif reason == NO_SAMPLE:
            held = f"{part.documents:,} documents, {part.tokens:,} tokens"
            named[reason].append(f"the {part.split.name} split of {part.prefix} ({held})")
    said = []
    if named[NO_TOKENS]:
        said.append(
            f"{' and '.join(named[NO_TOKENS])} {'gets' if len(named[NO_TOKENS]) == 1 else 'get'} no document:"
            " megatron-core's GPTDataset would loop forever looking for the tokens of their samples, and the job would"
            " hang before its first step"
        )
    if named[NO_SAMPLE]:
        said.append(
            f"{' and '.join(named[NO_SAMPLE])} {'holds' if len(named[NO_SAMPLE]) == 1 else 'hold'} less than one"
            f" sample (dataset.seq_length+1={sequence_length(dataset) + 1:,} tokens): megatron-core's BlendedDataset"
            " refuses a dataset of 0 samples in a blend without weights"
        )
    return "; ".join(said)


def documents_per_split(parts: list[Part], prefix: str) -> str:
    counts = {part.split: part.documents for part in parts if part.prefix == prefix}
    return ", ".join(f"{counts.get(split, 0):,} {split.name}" for split in Split)


def refusal(said: str, parts: list[Part], data: RunData) -> str:
    prefixes = list(dict.fromkeys(part.prefix for part in parts))
    if data.blend is None:
        given = "; ".join(f"{prefix} gets {documents_per_split(parts, prefix)} documents" for prefix in prefixes)
        return f"{said} (blend_per_split: {given}): give each split a dataset with more text"
    given = "; ".join(
        f"{prefix} ({len(data.lengths[prefix]):,} documents) gets {documents_per_split(parts, prefix)}"
        for prefix in prefixes
    )
    return f"{said} (dataset.split={data.config.split}: {given}): {fix(data)}"


def fix(data: RunData) -> str:
    """The first offered dataset.split whose parts megatron-core can all build, with the documents each split gets."""
    for offered in OFFERED_SPLITS:
        parts = split_parts(data, offered)
        if not any(unbuildable(part, data.config) for part in parts):
            prefixes = dict.fromkeys(part.prefix for part in parts)
            gets = "; ".join(f"{prefix} gets {documents_per_split(parts, prefix)}" for prefix in prefixes)
            unused = " (no validation or test)" if offered == "100,0,0" else ""
            return f"pass dataset.split={offered}{unused}: {gets}"
    if data.blend is not None and data.blend[1] is None and len(data.blend[0]) > 1:
        return "give the blend weights (data_paths=[WEIGHT,PREFIX,...]), or prepare more text for each dataset"
    return "prepare more text for each dataset"
