"""launcher/config/data.py's check, in-process and fast: each function on
datasets written by megatron-core's own IndexedDatasetBuilder and a real Hugging Face tokenizer folder, on Megatron
Bridge's vanilla GPT config. The expected values come from README's Your data (the first 4,096 ids of 16 sequences: the
first, the last and evenly between), from megatron-core's index format (a sequence's pointer is in bytes) and from the
tokenizer's size; tests/test_data.py runs the same refusals through entrypoint.py."""

import re
from pathlib import Path

import numpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from megatron.bridge.recipes.gpt.vanilla_gpt import vanilla_gpt_pretrain_config
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from launcher.config import data
from launcher.errors import UsageError
from tests.conftest import REPO
from tests.test_data import wide_tokenizer

VOCAB = 400  # the tokenizer below: ids 0-399
README_SAMPLE = re.search(
    r"the first ([\d,]+) ids of (\d+) sequences", " ".join((REPO / "README.md").read_text().split())
)
READ_IDS, SAMPLED = int(README_SAMPLE[1].replace(",", "")), int(README_SAMPLE[2])


def write(prefix: Path, documents: list[list[int]], dtype=numpy.uint16) -> str:
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for document in documents:
        builder.add_document(numpy.array(document), [len(document)])
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wide_tokenizer(tmp_path_factory.mktemp("tokenizer"), VOCAB)


@pytest.fixture
def cfg(tokenizer: Path):
    cfg = vanilla_gpt_pretrain_config()
    cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model = "HuggingFaceTokenizer", str(tokenizer)
    cfg.model.vocab_size = None
    cfg.dataset.split = "100,0,0"
    return cfg


@pytest.fixture(autouse=True)
def no_container(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SRUNSH_MOUNT", raising=False)


def refusal(call, *args) -> str:
    with pytest.raises(UsageError) as refused:
        call(*args)
    return str(refused.value)


# ---- what the run reads --------------------------------------------------------------------------------------------


def test_every_dataset_of_a_weighted_blend_with_its_weight(cfg):
    cfg.dataset.blend = (["a", "b"], [0.3, 0.7])
    assert data.datasets(cfg) == [("a", 0.3), ("b", 0.7)]
    cfg.dataset.blend = (["a", "b"], None)
    assert data.datasets(cfg) == [("a", None), ("b", None)]


def test_every_dataset_of_each_split_and_none_for_mock_data(cfg):
    cfg.dataset.blend, cfg.dataset.split = None, None
    cfg.dataset.blend_per_split = [(["a"], None), None, (["b", "c"], [1.0, 2.0])]
    assert data.datasets(cfg) == [("a", None), ("b", 1.0), ("c", 2.0)]
    cfg.dataset.blend_per_split = None
    assert data.datasets(cfg) == []
    cfg.dataset = object()
    assert data.datasets(cfg) == []


def test_data_path_is_read_as_megatron_bridge_makes_it_the_blend(cfg):
    cfg.dataset.blend, cfg.dataset.data_path = None, "0.25 a 0.75 b"
    assert data.datasets(cfg) == [("a", 0.25), ("b", 0.75)]


# ---- the container's mounts ----------------------------------------------------------------------------------------


def in_srun_sh_container(monkeypatch: pytest.MonkeyPatch, mounts: str) -> None:
    """What srun.sh exports to its ranks in a container: RUN_DIR, and SRUNSH_MOUNT as it resolved it."""
    monkeypatch.setenv("RUN_DIR", "/fsx/outputs/recipe/r1")
    monkeypatch.setenv("SRUNSH_MOUNT", mounts)


def test_the_mount_destinations_are_those_srun_sh_exports(monkeypatch: pytest.MonkeyPatch):
    assert data.container_mounts() is None
    monkeypatch.setenv("SRUNSH_MOUNT", "/data:/fsx")
    assert data.container_mounts() is None  # the knob, exported for srun.sh: this is no rank that srun.sh started
    in_srun_sh_container(monkeypatch, "")
    assert data.container_mounts() is None
    in_srun_sh_container(monkeypatch, "/home/me/repo:/workspace/megatron,/fsx:/fsx:ro,/scratch")
    assert data.container_mounts() == ["/workspace/megatron", "/fsx"]  # pyxis's SRC:DST[:FLAGS]; a bare path is none


def test_a_path_under_a_destination_is_visible_and_one_outside_says_how_to_mount_it(monkeypatch: pytest.MonkeyPatch):
    assert data.outside_mounts("/elsewhere/web") is None  # no container: nothing to say
    in_srun_sh_container(monkeypatch, "/data:/fsx,/home/me:/workspace")
    assert data.outside_mounts("/fsx/corpus/web") is None
    assert data.outside_mounts("/workspace/web") is None
    assert data.outside_mounts("/elsewhere/web") == (
        "is outside every SRUNSH_MOUNT destination (/fsx, /workspace), so the ranks cannot see it in the container:"
        " add its folder to SRUNSH_MOUNT (now /data:/fsx,/home/me:/workspace) and give the path it has there"
    )


# ---- the tokenizer -------------------------------------------------------------------------------------------------


def test_the_vocabulary_is_the_tokenizers_own_size(cfg):
    assert data.tokenizer_vocab_size(cfg) == VOCAB


def test_the_null_tokenizer_is_refused_for_real_data(cfg):
    cfg.tokenizer.tokenizer_type = "NullTokenizer"
    assert refusal(data.tokenizer_vocab_size, cfg) == (
        "the run reads real data but has Megatron's NullTokenizer, which only mock data can use: pass"
        " tokenizer_path=DIR, the tokenizer the data was prepared with (tools/prepare_data.py --tokenizer DIR)"
    )


def test_a_tokenizer_folder_not_there_is_named_with_where_it_is_looked_for(cfg, tmp_path, monkeypatch):
    cfg.tokenizer.tokenizer_model = str(tmp_path / "gone")
    with pytest.raises(UsageError) as refused:
        data.tokenizer_vocab_size(cfg)
    assert str(refused.value) == (
        f"tokenizer_path {tmp_path}/gone does not exist: give the folder the data was prepared with"
    )
    in_srun_sh_container(monkeypatch, "/data:/fsx")
    with pytest.raises(UsageError, match=f"^tokenizer_path {tmp_path}/gone is outside every SRUNSH_MOUNT destination"):
        data.tokenizer_vocab_size(cfg)


def test_a_folder_that_holds_no_tokenizer_is_refused_with_the_loaders_reason(cfg, tmp_path):
    (tmp_path / "tokenizer.json").write_text("not json")
    cfg.tokenizer.tokenizer_model = str(tmp_path)
    line = refusal(data.tokenizer_vocab_size, cfg)
    assert line.startswith(  # the reason in Megatron Bridge's words
        f"tokenizer {tmp_path} cannot be loaded (ValueError: Unable to instantiate HuggingFace AutoTokenizer for"
        f" {tmp_path}. Exception: "
    )
    assert line.endswith(
        "): pass tokenizer_path=DIR, a Hugging Face tokenizer folder (the one tools/prepare_data.py read)"
    )


@pytest.mark.parametrize(
    ("model_vocab", "use_tokenizer_size", "refused"),
    [(VOCAB - 1, False, True), (VOCAB, False, False), (VOCAB + 1, False, False), (VOCAB - 1, True, False)],
)
def test_a_model_vocabulary_below_the_tokenizers_is_refused(cfg, model_vocab, use_tokenizer_size, refused):
    cfg.model.vocab_size, cfg.tokenizer.use_tokenizer_vocab_size = model_vocab, use_tokenizer_size
    if not refused:
        assert data.tokenizer_vocab_size(cfg) == VOCAB
        return
    with pytest.raises(UsageError) as error:
        data.tokenizer_vocab_size(cfg)
    assert str(error.value) == (
        f"model.vocab_size=399 is smaller than the 400 tokens of tokenizer {cfg.tokenizer.tokenizer_model}:"
        " the model cannot embed every token id; use the model's own tokenizer or a larger model.vocab_size"
    )


# ---- one dataset ---------------------------------------------------------------------------------------------------


def test_a_prefix_that_names_a_file_is_refused_with_the_prefix(tmp_path):
    for suffix in (".bin", ".idx"):
        with pytest.raises(UsageError) as refused:
            data.check_dataset(f"{tmp_path}/web{suffix}", VOCAB, "tok")
        assert (
            str(refused.value)
            == f"data path {tmp_path}/web{suffix} names a file of a dataset: give its prefix, {tmp_path}/web"
        )


def test_a_dataset_missing_one_file_says_which(tmp_path):
    prefix = write(tmp_path / "web", [[1, 2, 3]])
    Path(f"{prefix}.idx").unlink()
    with pytest.raises(UsageError) as refused:
        data.check_dataset(prefix, VOCAB, "tok")
    assert str(refused.value) == (
        f"data path {prefix} has web.bin but no web.idx: copy both files of the dataset, or prepare it again"
    )
    prefix = write(tmp_path / "news", [[1, 2, 3]])
    Path(f"{prefix}.bin").unlink()
    with pytest.raises(UsageError, match=r"has news\.idx but no news\.bin: "):
        data.check_dataset(prefix, VOCAB, "tok")


def test_a_misspelt_prefix_is_shown_the_datasets_its_folder_holds(tmp_path):
    for name in ("e", "d", "c", "b", "a"):
        write(tmp_path / name, [[1]])
    with pytest.raises(UsageError) as refused:
        data.check_dataset(f"{tmp_path}/wbe", VOCAB, "tok")
    assert str(refused.value) == (
        f"data path {tmp_path}/wbe has no wbe.bin and wbe.idx; {tmp_path} holds a, b, c, d: give the prefix of a"
        f" prepared dataset (PREFIX.bin + PREFIX.idx), or prepare it with tools/prepare_data.py --output-prefix"
        f" {tmp_path}/wbe"
    )
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=f"no web.bin and web.idx; {tmp_path}/empty holds no dataset: "):
        data.check_dataset(f"{tmp_path}/empty/web", VOCAB, "tok")
    with pytest.raises(UsageError, match=f"no web.bin and web.idx; {tmp_path}/none holds no dataset: "):
        data.check_dataset(f"{tmp_path}/none/web", VOCAB, "tok")


def test_a_missing_dataset_outside_the_container_says_so_first(tmp_path, monkeypatch):
    in_srun_sh_container(monkeypatch, "/data:/fsx")
    with pytest.raises(UsageError, match=f"^data path {tmp_path}/web is outside every SRUNSH_MOUNT destination"):
        data.check_dataset(f"{tmp_path}/web", VOCAB, "tok")


def test_an_index_megatron_core_cannot_read_is_refused(tmp_path):
    prefix = write(tmp_path / "web", [[1, 2, 3]])
    Path(f"{prefix}.idx").write_bytes(b"MMIDIDX\x00\x00 and then not an index")
    assert refusal(data.check_dataset, prefix, VOCAB, "tok") == (  # the reason in megatron-core's words
        f"{prefix}.idx is not an index megatron-core can read (AssertionError: bad version, cannot read:"
        f" {prefix}.idx): prepare {prefix} again with tools/prepare_data.py"
    )


def test_an_index_that_describes_other_bytes_is_refused_with_both_sizes(tmp_path):
    prefix = write(tmp_path / "web", [[1, 2, 3], [4, 5]])  # 5 uint16 ids: 10 bytes
    with open(f"{prefix}.bin", "ab") as extra:
        extra.write(b"\x00\x00\x00")
    with pytest.raises(UsageError) as refused:
        data.check_dataset(prefix, VOCAB, "tok")
    assert str(refused.value) == (
        "web.idx does not match web.bin: the index describes 10 bytes of uint16 token ids, web.bin has 13 (a partial"
        f" copy, or files of two preparations): copy both files again, or prepare {prefix} again"
    )


def test_the_size_counts_the_bytes_of_each_id(tmp_path):
    prefix = write(tmp_path / "wide", [[1, 2, 3], [4, 5]], dtype=numpy.int32)  # 5 int32 ids: 20 bytes
    assert len(data.check_dataset(prefix, VOCAB, "tok")) == 2


def test_a_dataset_without_documents_is_refused(tmp_path):
    prefix = write(tmp_path / "empty", [])
    with pytest.raises(UsageError) as refused:
        data.check_dataset(prefix, VOCAB, "tok")
    assert str(refused.value) == f"data path {prefix} holds no documents: prepare it from a corpus with text"


@pytest.mark.parametrize(
    ("dtype", "vocab", "refused"),
    [(numpy.uint8, 256, False), (numpy.uint8, 257, True), (numpy.uint16, 65_536, False), (numpy.uint16, 70_000, True)],
)
def test_ids_stored_too_narrow_for_the_tokenizer_are_refused(tmp_path, dtype, vocab, refused):
    prefix = write(tmp_path / "web", [[1, 2, 3]], dtype=dtype)
    if not refused:
        data.check_dataset(prefix, vocab, "tok")
        return
    with pytest.raises(UsageError) as error:
        data.check_dataset(prefix, vocab, "tok")
    assert str(error.value) == (
        f"data path {prefix} stores its token ids as {numpy.dtype(dtype)}, which cannot hold the {vocab:,} tokens of"
        " tokenizer tok: it was prepared with another tokenizer; prepare it again with tools/prepare_data.py"
        " --tokenizer tok, or pass the tokenizer it was prepared with"
    )


def test_ids_stored_as_floats_are_refused(tmp_path):
    prefix = write(tmp_path / "web", [[1, 2, 3]], dtype=numpy.float32)
    with pytest.raises(UsageError, match="stores its token ids as float32, which cannot hold the 400 tokens"):
        data.check_dataset(prefix, VOCAB, "tok")


def test_the_first_id_beyond_the_tokenizer_is_named_with_its_sequence(tmp_path):
    prefix = write(tmp_path / "web", [[5, 6, 7], [8, 399, 9], [1, 400, 401]])
    with pytest.raises(UsageError) as refused:
        data.check_dataset(prefix, VOCAB, "tok")
    assert str(refused.value) == (
        f"data path {prefix} holds token id 400 (in sequence 2), outside the 400 tokens of tokenizer tok: it was"
        " prepared with another tokenizer; prepare it again with tools/prepare_data.py --tokenizer tok, or pass the"
        " tokenizer it was prepared with"
    )


def test_the_first_and_the_last_id_of_the_tokenizer_pass(tmp_path):
    data.check_dataset(write(tmp_path / "web", [[0, 399], [399, 0]]), VOCAB, "tok")


def test_a_negative_id_is_outside_the_tokenizer(tmp_path):
    prefix = write(tmp_path / "web", [[5, -1, 7]], dtype=numpy.int32)
    with pytest.raises(UsageError, match="holds token id -1 \\(in sequence 0\\), outside the 400 tokens"):
        data.check_dataset(prefix, VOCAB, "tok")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sequences=st.integers(1, 60),
    where=st.sampled_from(["first", "last", "beyond the ids read"]),
    position=st.integers(0, READ_IDS - 1),
)
def test_the_first_and_last_sequences_are_read_up_to_the_documented_ids_and_no_further(
    tmp_path_factory, sequences: int, where: str, position: int
):
    """README: the first 4,096 ids of 16 sequences, the first and the last among them: an id beyond the tokenizer
    there is refused; one after the ids read is not read."""
    documents = [[7] * (READ_IDS + 2) for _ in range(sequences)]
    sequence = 0 if where == "first" else sequences - 1
    documents[sequence][READ_IDS + 1 if where == "beyond the ids read" else position] = VOCAB
    prefix = write(tmp_path_factory.mktemp("ids") / "web", documents)
    if where == "beyond the ids read":
        data.check_dataset(prefix, VOCAB, "tok")
        return
    with pytest.raises(UsageError, match=f"holds token id 400 \\(in sequence {sequence}\\)"):
        data.check_dataset(prefix, VOCAB, "tok")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequences=st.integers(1, SAMPLED), bad=st.data())
def test_a_dataset_of_at_most_16_sequences_is_read_in_every_sequence(tmp_path_factory, sequences: int, bad):
    sequence = bad.draw(st.integers(0, sequences - 1))
    documents = [[3, 4, 5] for _ in range(sequences)]
    documents[sequence][1] = VOCAB + 7
    prefix = write(tmp_path_factory.mktemp("ids") / "web", documents)
    with pytest.raises(UsageError, match=f"holds token id 407 \\(in sequence {sequence}\\)"):
        data.check_dataset(prefix, VOCAB, "tok")


def test_at_most_16_sequences_are_read_evenly_spread(tmp_path):
    """Of 31 sequences, 16 evenly from the first to the last are every second one: an id beyond the tokenizer in an
    odd-numbered sequence is not read, in an even-numbered one it is."""
    documents = [[3, 4, 5] for _ in range(31)]
    documents[15][0] = VOCAB
    data.check_dataset(write(tmp_path / "odd", documents), VOCAB, "tok")
    documents[15][0], documents[16][0] = 3, VOCAB
    with pytest.raises(UsageError, match="in sequence 16"):
        data.check_dataset(write(tmp_path / "even", documents), VOCAB, "tok")


def test_a_sequence_shorter_than_the_ids_read_is_read_to_its_end(tmp_path):
    prefix = write(tmp_path / "web", [[3, 4, 5], [3, 4, VOCAB]])
    with pytest.raises(UsageError, match="holds token id 400 \\(in sequence 1\\)"):
        data.check_dataset(prefix, VOCAB, "tok")


# ---- the whole check and the line a run prints ---------------------------------------------------------------------


def test_each_dataset_is_checked_once_and_object_storage_is_left_to_megatron_core(cfg, tmp_path):
    good = write(tmp_path / "good", [[1, 2, 3]] * 4)
    cfg.dataset.blend = ([good, "s3://bucket/web", good], [0.2, 0.3, 0.5])
    data.check_data(cfg)
    bad = write(tmp_path / "bad", [[1, 2, VOCAB]])
    cfg.dataset.blend = ([good, bad], None)
    assert refusal(data.check_data, cfg).startswith(
        f"data path {bad} holds token id 400 (in sequence 0), outside the 400 tokens of tokenizer"
        f" {cfg.tokenizer.tokenizer_model}: it was prepared with another tokenizer; prepare it again with"
        f" tools/prepare_data.py --tokenizer {cfg.tokenizer.tokenizer_model}, or pass"
    )


def test_mock_data_is_not_checked(cfg):
    cfg.tokenizer.tokenizer_type = "NullTokenizer"  # would be refused for real data
    data.check_data(cfg)


def test_the_splits_are_judged_with_each_datasets_documents(cfg, tmp_path):
    prefix = write(tmp_path / "web", [[1] * 100] * 167)
    cfg.dataset.blend, cfg.dataset.split = ([prefix], None), "9999,8,2"
    with pytest.raises(UsageError, match=f"\\(dataset.split=9999,8,2: {prefix} \\(167 documents\\) gets 167 train, 0"):
        data.check_data(cfg)


def test_the_line_a_run_prints_names_each_dataset_its_documents_tokens_and_weight(cfg, tmp_path):
    web = write(tmp_path / "web", [[1, 2, 3], [4, 5], [6]])
    code = write(tmp_path / "code", [[1] * 10], dtype=numpy.int32)
    cfg.dataset.blend = ([web, "s3://bucket/books", code], [0.5, 0.25, 0.25])
    assert data.describe(cfg) == (
        f"data: {web} (weight 0.5, 3 documents, 6 tokens); s3://bucket/books; {code} (weight 0.25, 1 documents, 10"
        f" tokens); tokenizer {cfg.tokenizer.tokenizer_model}"
    )
    cfg.dataset.blend = ([web], None)
    assert data.describe(cfg) == f"data: {web} (3 documents, 6 tokens); tokenizer {cfg.tokenizer.tokenizer_model}"


def test_the_line_of_a_run_on_mock_data_says_how_to_train_on_a_corpus(cfg):
    cfg.dataset.blend = None
    assert data.describe(cfg) == (
        "data: mock (tokens Megatron generates, not a corpus): pass data_paths=PREFIX to train on prepared data"
        " (README: Your data; tools/prepare_data.py makes PREFIX.bin/.idx)"
    )
    cfg.dataset = object()
    assert data.describe(cfg) is None


def test_the_described_counts_agree_with_megatron_cores_reader(tmp_path):
    prefix = write(tmp_path / "web", [[1, 2, 3, 4], [5, 6]], dtype=numpy.int32)
    index = IndexedDataset(prefix, mmap=False)
    assert (len(index.document_indices) - 1, int(index.sequence_lengths.sum())) == (2, 6)
