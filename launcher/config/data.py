"""The data a run trains on, checked where the ranks read it, before any joins the job (docs/data.md)."""

import os
from pathlib import Path

import numpy
from megatron.bridge.training.config import ConfigContainer
from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
from megatron.core.datasets.blended_megatron_dataset_config import BlendedMegatronDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset, get_bin_path, get_idx_path
from megatron.core.datasets.object_storage_utils import is_object_storage_path
from megatron.core.datasets.utils import get_blend_from_list

from launcher.config import splits
from launcher.config.splits import Blend, Blends
from launcher.errors import UsageError, first_line, from_srun_sh

SAMPLED_SEQUENCES = 16  # first, last and evenly in between
SAMPLED_TOKENS = 4096  # from the start of each sampled sequence
PREPARE = "tools/prepare_data.py"
# What reading a damaged index raises in megatron-core 0.19 (asserts on the header, numpy on a short file).
UNREADABLE = (AssertionError, ValueError, KeyError, OSError)


def datasets(cfg: ConfigContainer) -> list[tuple[str, float | None]]:
    """Every (prefix, weight) the run reads; none for mock data (or a dataset that is no indexed GPT data)."""
    dataset = cfg.dataset
    if not isinstance(dataset, BlendedMegatronDatasetConfig):
        return []
    whole, per_split = run_blends(dataset)
    listed = []
    for prefixes, weights in filter(None, [whole, *(per_split or [])]):
        listed += zip(prefixes, weights or [None] * len(prefixes), strict=True)
    return listed


def run_blends(dataset: BlendedMegatronDatasetConfig) -> tuple[Blend | None, Blends]:
    """The blend (or blend per split) megatron-core will read; Megatron Bridge makes data_path the blend."""
    if any(dataset.blend_per_split or []):
        return None, list(dataset.blend_per_split)
    data_path = getattr(dataset, "data_path", None)
    if dataset.blend is None and data_path:
        return get_blend_from_list(data_path.split() if isinstance(data_path, str) else list(data_path)), None
    return dataset.blend, None


def check_data(cfg: ConfigContainer) -> None:
    listed = datasets(cfg)
    if not listed:
        return
    vocab_size = tokenizer_vocab_size(cfg)
    indexes = {}  # held while the splits are checked: each one's sequence_lengths is a view of its mapped index
    for prefix in dict.fromkeys(prefix for prefix, _ in listed):
        if not is_object_storage_path(prefix):  # s3:// and msc:// data are megatron-core's to fetch and read
            indexes[prefix] = check_dataset(prefix, vocab_size, cfg.tokenizer.tokenizer_model)
    blends, lengths = run_blends(cfg.dataset), {prefix: index.sequence_lengths for prefix, index in indexes.items()}
    splits.check_splits(cfg, blends, lengths)


def container_mounts() -> list[str] | None:
    """SRUNSH_MOUNT's destinations when the ranks run in srun.sh's container (only those get it), else None."""
    mount = from_srun_sh("SRUNSH_MOUNT")
    return [entry.split(":")[1] for entry in mount.split(",") if ":" in entry] if mount else None


def outside_mounts(path: str) -> str | None:
    """The reason a missing path cannot be seen in the container, outside every SRUNSH_MOUNT destination."""
    destinations = container_mounts()
    absolute = Path(path).absolute()
    if destinations is None or any(absolute.is_relative_to(destination) for destination in destinations):
        return None
    return (
        f"is outside every SRUNSH_MOUNT destination ({', '.join(destinations)}), so the ranks cannot see it in the"
        f" container: add its folder to SRUNSH_MOUNT (now {os.environ['SRUNSH_MOUNT']}) and give the path it has there"
    )


def tokenizer_vocab_size(cfg: ConfigContainer) -> int:
    """The vocabulary of the tokenizer the run builds (Megatron Bridge's own build), checked against the model's."""
    tokenizer = cfg.tokenizer
    if tokenizer.tokenizer_type == "NullTokenizer":
        raise UsageError(
            "the run reads real data but has Megatron's NullTokenizer, which only mock data can use:"
            " pass tokenizer_path=DIR, the tokenizer the data was prepared with (tools/prepare_data.py --tokenizer DIR)"
        )
    name = str(tokenizer.tokenizer_model)
    if Path(name).is_absolute() and not Path(name).exists():
        reason = outside_mounts(name) or "does not exist"
        raise UsageError(f"tokenizer_path {name} {reason}: give the folder the data was prepared with")
    try:
        vocab_size = build_tokenizer(tokenizer).vocab_size
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise UsageError(
            f"tokenizer {name} cannot be loaded ({type(error).__name__}: {first_line(error)}):"
            " pass tokenizer_path=DIR, a Hugging Face tokenizer folder (the one tools/prepare_data.py read)"
        ) from None
    model_vocab = cfg.model.vocab_size
    if model_vocab is not None and not tokenizer.use_tokenizer_vocab_size and model_vocab < vocab_size:
        raise UsageError(
            f"model.vocab_size={model_vocab:,} is smaller than the {vocab_size:,} tokens of tokenizer {name}:"
            " the model cannot embed every token id; use the model's own tokenizer or a larger model.vocab_size"
        )
    return vocab_size


def check_dataset(prefix: str, vocab_size: int, tokenizer: object) -> IndexedDataset:
    if prefix.endswith((".bin", ".idx")):
        raise UsageError(f"data path {prefix} names a file of a dataset: give its prefix, {prefix[:-4]}")
    bin_path, idx_path = Path(get_bin_path(prefix)), Path(get_idx_path(prefix))
    if not (bin_path.is_file() and idx_path.is_file()):
        raise UsageError(missing(prefix, bin_path, idx_path))
    try:
        index = IndexedDataset(prefix, mmap=False)  # the index only: its .bin is not mapped now
    except UNREADABLE as error:
        raise UsageError(
            f"{idx_path} is not an index megatron-core can read ({type(error).__name__}: {first_line(error)}):"
            f" prepare {prefix} again with {PREPARE}"
        ) from None
    check_sizes(prefix, index, bin_path, idx_path)
    check_token_ids(prefix, index, vocab_size, tokenizer)
    return index


def missing(prefix: str, bin_path: Path, idx_path: Path) -> str:
    reason = outside_mounts(prefix)
    if reason:
        return f"data path {prefix} {reason}"
    if bin_path.is_file() or idx_path.is_file():
        there, absent = (bin_path, idx_path) if bin_path.is_file() else (idx_path, bin_path)
        fix = "copy both files of the dataset, or prepare it again"
        return f"data path {prefix} has {there.name} but no {absent.name}: {fix}"
    folder = bin_path.parent
    found = sorted(path.name.removesuffix(".idx") for path in folder.glob("*.idx")) if folder.is_dir() else []
    where = f"; {folder} holds {', '.join(found[:4])}" if found else f"; {folder} holds no dataset"
    return (
        f"data path {prefix} has no {bin_path.name} and {idx_path.name}{where}: give the prefix of a prepared dataset"
        f" (PREFIX.bin + PREFIX.idx), or prepare it with {PREPARE} --output-prefix {prefix}"
    )


def check_sizes(prefix: str, index: IndexedDataset, bin_path: Path, idx_path: Path) -> None:
    lengths, pointers = index.sequence_lengths, index.index.sequence_pointers
    if len(lengths) == 0:
        raise UsageError(f"data path {prefix} holds no documents: prepare it from a corpus with text")
    dtype = numpy.dtype(index.index.dtype)
    described = int(pointers[-1]) + int(lengths[-1]) * dtype.itemsize
    size = bin_path.stat().st_size
    if described != size:
        raise UsageError(
            f"{idx_path.name} does not match {bin_path.name}: the index describes {described:,} bytes of {dtype}"
            f" token ids, {bin_path.name} has {size:,} (a partial copy, or files of two preparations):"
            f" copy both files again, or prepare {prefix} again"
        )


def check_token_ids(prefix: str, index: IndexedDataset, vocab_size: int, tokenizer: object) -> None:
    fix = f"prepare it again with {PREPARE} --tokenizer {tokenizer}, or pass the tokenizer it was prepared with"
    dtype = numpy.dtype(index.index.dtype)
    if not numpy.issubdtype(dtype, numpy.integer) or numpy.iinfo(dtype).max < vocab_size - 1:
        raise UsageError(
            f"data path {prefix} stores its token ids as {dtype}, which cannot hold the {vocab_size:,} tokens of"
            f" tokenizer {tokenizer}: it was prepared with another tokenizer; {fix}"
        )
    lengths = index.sequence_lengths
    picked = numpy.unique(numpy.linspace(0, len(lengths) - 1, min(len(lengths), SAMPLED_SEQUENCES)).astype(int))
    for sequence in picked:
        ids = index.get(int(sequence), 0, min(int(lengths[sequence]), SAMPLED_TOKENS))
        outside = ids[(ids < 0) | (ids >= vocab_size)]
        if outside.size:
            raise UsageError(
                f"data path {prefix} holds token id {int(outside[0]):,} (in sequence {int(sequence):,}), outside"
                f" the {vocab_size:,} tokens of tokenizer {tokenizer}: it was prepared with another tokenizer; {fix}"
            )


def describe(cfg: ConfigContainer) -> str | None:
    listed = datasets(cfg)
    if not listed:
        if not isinstance(cfg.dataset, BlendedMegatronDatasetConfig):
            return None
        return (
            "data: mock (tokens Megatron generates, not a corpus): pass data_paths=PREFIX to train on prepared data"
            f" (README: Your data; {PREPARE} makes PREFIX.bin/.idx)"
        )
    described = []
    for prefix, weight in listed:
        if is_object_storage_path(prefix):
            described.append(prefix)
            continue
        index = IndexedDataset(prefix, mmap=False)
        tokens = int(index.index.sequence_pointers[-1]) // index.index.dtype_size + int(index.sequence_lengths[-1])
        share = f"weight {weight:g}, " if weight is not None else ""
        described.append(f"{prefix} ({share}{len(index.document_indices) - 1:,} documents, {tokens:,} tokens)")
    return f"data: {'; '.join(described)}; tokenizer {cfg.tokenizer.tokenizer_model}"
