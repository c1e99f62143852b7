"""Pretraining on your own data (issue 27): tools/prepare_data.py turns a corpus into a Megatron indexed dataset with
a tokenizer trained here (tokenizers, no hub), data_paths= puts it into every shipped recipe, Megatron Bridge's own
dataset builder reads back the same token ids, and every bad input is refused with one line before training."""

import gzip
import json
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy
import pytest
import torch
from megatron.bridge.data.utils import pretrain_train_valid_test_datasets_provider
from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import entrypoint
from launcher.errors import UsageError
from tests import hf_models
from tests.conftest import RECIPES, REPO, Corpus, Prepared, error_lines

sys.path.insert(0, str(REPO / "tools"))
import prepare_data

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")
README = REPO / "README.md"
SUMMARY = re.compile(
    r"^prepare_data\.py: wrote (?P<prefix>\S+)\.bin/\.idx: (?P<documents>[\d,]+) documents, (?P<tokens>[\d,]+) tokens"
    r" \(uint16\), (?P<bytes>[\d,]+) bytes, from [\d,]+ bytes of 1 file\(s\) in (?P<seconds>[\d.]+) s"
    r" \([\d,]+ tokens/s, 2 workers\)$"
)
PROGRESS = re.compile(
    r"^prepare_data\.py: 100% of \S+B \[\S+<\S+, (?P<documents>[\d,]+) docs, (?P<tokens>[\d,]+) tokens,"
)


def number(text: str) -> int:
    return int(text.replace(",", ""))


def resolve(*argv: str):
    cfg, _ = entrypoint.resolve(entrypoint.parse_args([*argv]))
    return cfg


def expected_documents(corpus: Corpus) -> list[list[int]]:
    """What Megatron's tokenizer makes of each document (transformers, special tokens kept), then its end token."""
    tokenizer = AutoTokenizer.from_pretrained(corpus.tokenizer)
    return [[*tokenizer(text).input_ids, tokenizer.eos_token_id] for text in corpus.texts]


# ---- tools/prepare_data.py ------------------------------------------------------------------------------------------


def test_prepare_data_writes_each_document_as_its_token_ids_then_the_end_of_document_token(
    corpus: Corpus, prepared: Prepared
):
    assert prepared.result.returncode == 0, prepared.result.stderr[-2000:]
    dataset = IndexedDataset(str(prepared.prefix))
    assert dataset.index.dtype is numpy.uint16  # Megatron's choice below 65500 tokens
    assert [list(map(int, dataset[i])) for i in range(len(dataset))] == expected_documents(corpus)
    assert list(dataset.document_indices) == list(range(len(corpus.texts) + 1))  # one sequence per document


def test_prepare_data_sums_up_in_one_line_on_stdout(corpus: Corpus, prepared: Prepared):
    (line,) = prepared.result.stdout.splitlines()
    summary = SUMMARY.match(line)
    assert summary, line
    tokens = sum(map(len, expected_documents(corpus)))
    assert summary["prefix"] == str(prepared.prefix)
    assert (number(summary["documents"]), number(summary["tokens"])) == (len(corpus.texts), tokens)
    assert number(summary["bytes"]) == Path(f"{prepared.prefix}.bin").stat().st_size == 2 * tokens
    assert float(summary["seconds"]) > 0


def test_prepare_data_progress_shows_documents_tokens_and_throughput_a_line_each_in_a_log(
    corpus: Corpus, prepared: Prepared
):
    """stderr is a pipe here, as in a batch job's log: every progress update is a line of its own, no \\r."""
    lines = [line for line in prepared.result.stderr.splitlines() if line.startswith("prepare_data.py:")]
    assert "\r" not in prepared.result.stderr
    final = PROGRESS.match(lines[-1])
    assert final, lines
    assert number(final["documents"]) == len(corpus.texts)
    assert number(final["tokens"]) == sum(map(len, expected_documents(corpus)))
    assert re.search(r", [\d,]+ tokens/s\]$", lines[-1]), lines[-1]


def prepare(*argv: str) -> int:
    return prepare_data.main([*map(str, argv), "--workers", "2"])


def test_prepare_data_reads_folders_of_plain_text_and_gzip_by_paragraph_or_by_file(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    texts = corpus.texts[:5]
    folder = tmp_path / "books"
    (folder / "more").mkdir(parents=True)
    (folder / "a.txt").write_text(f"{texts[0]}\n\n\n{texts[1]}\nsame paragraph\n\n{texts[2]}\n")
    with gzip.open(folder / "more" / "b.txt.gz", "wt") as compressed:
        compressed.write(f"{texts[3]}\n\n{texts[4]}")
    (folder / "notes.csv").write_text("not,read\n")
    tokenizer = AutoTokenizer.from_pretrained(corpus.tokenizer)

    def documents(prefix: Path) -> list[list[int]]:
        dataset = IndexedDataset(str(prefix))
        return [list(map(int, dataset[i])) for i in range(len(dataset))]

    def encoded(text: str) -> list[int]:
        return [*tokenizer(text).input_ids, tokenizer.eos_token_id]

    assert prepare(folder, "--tokenizer", corpus.tokenizer, "-o", tmp_path / "p", "--plain-text", "paragraph") == 0
    paragraphs = [texts[0], f"{texts[1]}\nsame paragraph", texts[2], texts[3], texts[4]]
    assert documents(tmp_path / "p") == [encoded(text) for text in paragraphs]
    assert prepare(folder, "--tokenizer", corpus.tokenizer, "-o", tmp_path / "f") == 0
    files = [(folder / "a.txt").read_text(), f"{texts[3]}\n\n{texts[4]}"]
    assert documents(tmp_path / "f") == [encoded(text) for text in files]
    assert "2 documents" in capsys.readouterr().out


def test_prepare_data_in_many_chunks_over_several_workers_writes_the_documents_in_input_order(
    corpus: Corpus, prepared: Prepared, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(prepare_data, "CHUNK_DOCUMENTS", 7)  # 43 chunks of the 300 documents, over 2 workers
    assert prepare(corpus.jsonl, "--tokenizer", corpus.tokenizer, "-o", tmp_path / "chunked") == 0
    for suffix in (".bin", ".idx"):
        assert Path(f"{tmp_path}/chunked{suffix}").read_bytes() == Path(f"{prepared.prefix}{suffix}").read_bytes()


def test_prepare_data_skips_empty_documents_and_says_how_many(
    corpus: Corpus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    jsonl = tmp_path / "gaps.jsonl"
    jsonl.write_text(json.dumps({"text": "a cat"}) + "\n\n" + json.dumps({"text": "  "}) + "\n")
    assert prepare(jsonl, "--tokenizer", corpus.tokenizer, "-o", tmp_path / "gaps") == 0
    assert len(IndexedDataset(str(tmp_path / "gaps"))) == 1
    summary = capsys.readouterr().out
    assert ": 1 documents, " in summary and summary.endswith("; 2 empty documents skipped\n"), summary


def tokenizer_without_an_end_token(directory: Path) -> Path:
    tokenizer = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(directory)  # no eos_token, no sep_token
    return directory


# Arguments (CORPUS, TOKENIZER: the session's) -> the line prepare_data.py refuses them with. Without --tokenizer or
# -o the case gets the session's tokenizer and -o out.
BAD_INPUTS = {
    "missing input": (["missing.jsonl"], "input missing.jsonl does not exist: give JSONL or text files, or folders"),
    "folder without text": (
        ["empty_folder"],
        "input folder empty_folder holds no .jsonl, .json, .ndjson, .txt, .text, .md files",
    ),
    "a line that is not JSON": (["broken.jsonl"], "broken.jsonl:2 is not JSON (Expecting value"),
    "a record without the field": (["other.jsonl"], "other.jsonl:1 has no 'text' field (it has 'body'): name the"),
    "a field that is not text": (["numbers.jsonl"], "numbers.jsonl:1: field 'text' is a JSON list, not a string"),
    "text that is not UTF-8": (["latin1.txt"], "latin1.txt:1 is not UTF-8 text (invalid continuation byte)"),
    "no documents": (["blank.jsonl"], "no documents: blank.jsonl hold no text (3 empty)"),
    "no tokenizer folder": (["CORPUS", "--tokenizer", "nowhere"], "--tokenizer nowhere is not a folder: give the"),
    "a folder without a tokenizer": (["CORPUS", "--tokenizer", "config_only"], "holds no Hugging Face tokenizer ("),
    "a tokenizer without an end token": (["CORPUS", "--tokenizer", "no_eos"], "has no end-of-document token (eos_"),
    "an output that exists": (["CORPUS", "-o", "existing"], "existing.bin and existing.idx exist: pass --overwrite"),
    "a suffix on the prefix": (["CORPUS", "-o", "out.bin"], "--output-prefix out.bin ends in a suffix: give the"),
    "no workers": (["CORPUS", "--workers", "0"], "--workers 0: give at least 1"),
}


@pytest.mark.parametrize("case", BAD_INPUTS, ids=list(BAD_INPUTS))
def test_prepare_data_refuses_bad_input_in_one_line_and_writes_nothing(
    case: str, corpus: Corpus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty_folder").mkdir()
    (tmp_path / "broken.jsonl").write_text('{"text": "fine"}\n{"text": oops}\n')
    (tmp_path / "other.jsonl").write_text('{"body": "x"}\n')
    (tmp_path / "numbers.jsonl").write_text('{"text": [1, 2]}\n')
    (tmp_path / "latin1.txt").write_bytes("un café noir".encode("latin-1"))
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n\n{"text": " "}\n')
    (tmp_path / "existing.bin").write_bytes(b"")
    (tmp_path / "existing.idx").write_bytes(b"")
    hf_models.write("llama", tmp_path / "config_only")
    tokenizer_without_an_end_token(tmp_path / "no_eos")
    arguments, message = BAD_INPUTS[case]
    arguments = [str(corpus.jsonl) if word == "CORPUS" else word for word in arguments]
    arguments += [] if "--tokenizer" in arguments else ["--tokenizer", str(corpus.tokenizer)]
    arguments += [] if "-o" in arguments else ["-o", "out"]
    before = sorted(tmp_path.rglob("*"))

    status = prepare_data.main([*arguments, *([] if "--workers" in arguments else ["--workers", "1"])])

    assert status == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("prepare_data.py: error: "), errors
    assert message in errors[0]
    assert sorted(tmp_path.rglob("*")) == before  # no .bin, .idx or .partial left


# ---- data_paths= and the checks before training ---------------------------------------------------------------------


def test_check_accepts_data_paths_and_says_what_the_run_trains_on(corpus: Corpus, prepared: Prepared, entrypoint_main):
    data = [f"data_paths={prepared.prefix}", f"tokenizer_path={corpus.tokenizer}", "dataset.split=90,5,5"]
    result = entrypoint_main(TINY, *data, "--check", "--world-size", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "profile_ranks=0\n"
    tokens = sum(map(len, expected_documents(corpus)))
    said = f"entrypoint.py: data: {prepared.prefix} (300 documents, {tokens:,} tokens); tokenizer {corpus.tokenizer}"
    assert error_lines(result.stderr) == [said]


def test_megatron_bridges_dataset_builder_reads_back_the_same_token_ids(
    corpus: Corpus, prepared: Prepared, output_root: Path
):
    """The samples Megatron Bridge's GPT dataset provider builds from data_paths are windows of seq_length + 1
    tokens of the documents, in the dataset's document order, that prepare_data.py wrote."""
    # 300 small documents: all of them for training
    cfg = resolve(
        TINY, f"data_paths=[{prepared.prefix}]", f"tokenizer_path={corpus.tokenizer}", "dataset.split=100,0,0"
    )
    cfg.dataset.seq_length = length = 64
    cfg.dataset.finalize()
    cfg.dataset.tokenizer = build_tokenizer(cfg.tokenizer)
    train, valid, test = pretrain_train_valid_test_datasets_provider([1, 0, 0], cfg.dataset)

    assert (valid, test) == (None, None)
    documents = expected_documents(corpus)
    assert [list(map(int, train.dataset[i])) for i in range(len(documents))] == documents
    stream = numpy.concatenate([numpy.array(documents[d]) for d in train.document_index])
    windows = sorted(tuple(stream[k * length : (k + 1) * length + 1]) for k in range(len(train)))
    samples = sorted(
        tuple(torch.cat([s["tokens"], s["labels"][-1:]]).tolist()) for s in map(train.__getitem__, range(len(train)))
    )
    assert len(train) == (len(stream) - 1) // length
    assert samples == windows


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_shipped_recipe_takes_data_paths_and_tokenizer_path(
    recipe: Path, corpus: Corpus, prepared: Prepared, output_root: Path, hf_dir
):
    shape = hf_models.RECIPE_SHAPES[recipe.stem]
    hf_path = [f"hf_path={hf_dir(shape)}"] if shape else []
    data = [f"data_paths={prepared.prefix}", f"tokenizer_path={corpus.tokenizer}", "dataset.split=90,5,5"]
    cfg = resolve(str(recipe), *hf_path, *data)
    # the blend as the config holds it after an override (through OmegaConf, where a tuple becomes a list)
    assert (list(cfg.dataset.blend), cfg.dataset.blend_per_split) == ([[str(prepared.prefix)], None], None)
    assert (cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model) == (
        "HuggingFaceTokenizer",
        str(corpus.tokenizer),
    )


@pytest.mark.parametrize(
    "given",
    ["data_paths=[0.7,{a},0.3,{b}]", "data_paths='0.7 {a} 0.3 {b}'", "data_paths=[70,{a},30,{b}]"],
    ids=["list", "megatron string", "integer weights"],
)
def test_weighted_data_paths_become_megatron_bridges_blend(
    given: str, corpus: Corpus, prepared: Prepared, tmp_path: Path, output_root: Path
):
    other = tmp_path / "copy"
    for suffix in (".bin", ".idx"):
        shutil.copy(f"{prepared.prefix}{suffix}", f"{other}{suffix}")
    split = "dataset.split=90,5,5"  # 300 documents: 9999,8,2 would give validation none
    cfg = resolve(TINY, given.format(a=prepared.prefix, b=other), f"tokenizer_path={corpus.tokenizer}", split)
    prefixes, weights = cfg.dataset.blend
    assert prefixes == [str(prepared.prefix), str(other)]
    assert numpy.allclose(numpy.array(weights) / sum(weights), [0.7, 0.3])


def test_several_prefixes_without_weights_are_a_blend_by_size(
    corpus: Corpus, prepared: Prepared, tmp_path: Path, output_root: Path
):
    # each dataset's split a sample (2,049 tokens) at least: the weight of each in a blend without weights
    split = "dataset.split=50,25,25"
    cfg = resolve(
        TINY, f"data_paths=[{prepared.prefix},{prepared.prefix}]", f"tokenizer_path={corpus.tokenizer}", split
    )
    assert list(cfg.dataset.blend) == [[str(prepared.prefix)] * 2, None]


def test_the_tokenizer_comes_from_hf_path_when_it_holds_one(
    corpus: Corpus, prepared: Prepared, tmp_path: Path, output_root: Path
):
    model = hf_models.write("llama", tmp_path / "llama")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(corpus.tokenizer / name, model / name)
    recipe = str(REPO / "recipes" / "llama3_8b_pretrain.py")
    cfg = resolve(recipe, f"hf_path={model}", f"data_paths={prepared.prefix}", "dataset.split=90,5,5")
    assert (cfg.tokenizer.tokenizer_type, cfg.tokenizer.tokenizer_model) == ("HuggingFaceTokenizer", str(model))
    mock = resolve(recipe, f"hf_path={model}")
    assert (mock.tokenizer.tokenizer_type, mock.dataset.blend) == ("NullTokenizer", None)  # as before, without data


class World(NamedTuple):
    """What a bad-data case builds on: the session's dataset and tokenizer, and a folder of its own."""

    prepared: Prepared
    corpus: Corpus
    root: Path

    @property
    def tokenizer(self) -> str:
        return f"tokenizer_path={self.corpus.tokenizer}"

    def copy(self, *, without: str | None = None, truncate: int = 0) -> Path:
        """A copy of the dataset at ROOT/d/web, maybe without one of its files or with its .bin cut short."""
        prefix = self.root / "d" / "web"
        prefix.parent.mkdir(parents=True, exist_ok=True)
        for suffix in (".bin", ".idx"):
            if suffix != without:
                shutil.copy(f"{self.prepared.prefix}{suffix}", f"{prefix}{suffix}")
        if truncate:
            with open(f"{prefix}.bin", "r+b") as data:
                data.truncate(Path(f"{prefix}.bin").stat().st_size - truncate)
        return prefix


def write_dataset(prefix: Path, documents: list[list[int]]) -> Path:
    """A dataset as another preparation (another tokenizer) leaves it, written by megatron-core's builder."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=numpy.uint16)
    for document in documents:
        builder.add_document(numpy.array(document), [len(document)])
    builder.finalize(f"{prefix}.idx")
    return prefix


def wide_tokenizer(directory: Path, size: int) -> Path:
    """A tokenizer of more tokens than uint16 holds (as Llama 3's 128,256), with an end token."""
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(size)}, unk_token="w0"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="w1").save_pretrained(directory)
    return directory


# Each case: World -> (entrypoint arguments after the recipe, the line they must be refused with).
def no_bin(w: World) -> tuple[list[str], str]:
    prefix = w.copy(without=".bin")
    return [f"data_paths={prefix}", w.tokenizer], f"data path {prefix} has web.idx but no web.bin: copy both files"


def no_idx(w: World) -> tuple[list[str], str]:
    prefix = w.copy(without=".idx")
    return [f"data_paths={prefix}", w.tokenizer], f"data path {prefix} has web.bin but no web.idx"


def a_misspelt_prefix(w: World) -> tuple[list[str], str]:
    folder = w.copy().parent
    return [f"data_paths={folder}/wbe", w.tokenizer], (
        f"data path {folder}/wbe has no wbe.bin and wbe.idx; {folder} holds web: give the prefix of a prepared dataset"
        f" (PREFIX.bin + PREFIX.idx), or prepare it with tools/prepare_data.py --output-prefix {folder}/wbe"
    )


def a_file_for_the_prefix(w: World) -> tuple[list[str], str]:
    prefix = w.prepared.prefix
    return [
        f"data_paths={prefix}.bin",
        w.tokenizer,
    ], f"data path {prefix}.bin names a file of a dataset: give its prefix, {prefix}"


def outside_mount(w: World) -> tuple[list[str], str]:
    return [f"data_paths=[{w.prepared.prefix},/elsewhere/web]", w.tokenizer], (
        f"data path /elsewhere/web is outside every SRUNSH_MOUNT destination (/workspace/megatron, /fsx, {w.root}),"
        " so the ranks cannot see it in the container: add its folder to SRUNSH_MOUNT"
    )


def an_idx_of_another_bin(w: World) -> tuple[list[str], str]:
    prefix = w.copy(truncate=6)
    size = Path(f"{w.prepared.prefix}.bin").stat().st_size
    return [f"data_paths={prefix}", w.tokenizer], (
        f"web.idx does not match web.bin: the index describes {size:,} bytes of uint16 token ids, web.bin has"
        f" {size - 6:,} (a partial copy, or files of two preparations): copy both files again, or prepare"
    )


def not_an_index(w: World) -> tuple[list[str], str]:
    prefix = w.copy()
    Path(f"{prefix}.idx").write_bytes(b"MMIDIDX is what an index starts with, not this")
    return [f"data_paths={prefix}", w.tokenizer], f"{prefix}.idx is not an index megatron-core can read"


def no_documents(w: World) -> tuple[list[str], str]:
    prefix = write_dataset(w.root / "empty", [])
    return [f"data_paths={prefix}", w.tokenizer], f"data path {prefix} holds no documents"


def token_ids_of_another_tokenizer(w: World) -> tuple[list[str], str]:
    prefix = write_dataset(w.root / "other", [[5, 6, 7], [8, 50256, 9]])
    return [f"data_paths={prefix}", w.tokenizer], (
        f"data path {prefix} holds token id 50,256 (in sequence 1), outside the 400 tokens of tokenizer"
        f" {w.corpus.tokenizer}: it was prepared with another tokenizer; prepare it again with tools/prepare_data.py"
    )


def ids_too_narrow_for_the_tokenizer(w: World) -> tuple[list[str], str]:
    wide = wide_tokenizer(w.root / "wide", 70_000)
    return [f"data_paths={w.prepared.prefix}", f"tokenizer_path={wide}"], (
        f"data path {w.prepared.prefix} stores its token ids as uint16, which cannot hold the 70,000 tokens of"
        f" tokenizer {wide}: it was prepared with another tokenizer"
    )


def the_null_tokenizer(w: World) -> tuple[list[str], str]:
    return [f"data_paths={w.prepared.prefix}"], (
        "the run reads real data but has Megatron's NullTokenizer, which only mock data can use:"
        " pass tokenizer_path=DIR, the tokenizer the data was prepared with"
    )


def a_tokenizer_path_not_there(w: World) -> tuple[list[str], str]:
    return [f"data_paths={w.prepared.prefix}", f"tokenizer_path={w.root}/tok"], f"tokenizer_path {w.root}/tok does not"


def a_model_smaller_than_the_tokenizer(w: World) -> tuple[list[str], str]:
    return [f"data_paths={w.prepared.prefix}", w.tokenizer, "model.vocab_size=100"], (
        f"model.vocab_size=100 is smaller than the 400 tokens of tokenizer {w.corpus.tokenizer}"
    )


def weights_mixed_into_prefixes(w: World) -> tuple[list[str], str]:
    prefix = w.prepared.prefix
    return [f"data_paths=[0.7,{prefix},{prefix}]", w.tokenizer], (
        f"configure() failed: ValueError: data_paths '0.7 {prefix} {prefix}' mixes numbers and prefixes:"
        " give prefixes, or WEIGHT PREFIX pairs"
    )


def a_weight_of_0(w: World) -> tuple[list[str], str]:
    return [f"data_paths=[0,{w.prepared.prefix}]", w.tokenizer], "has a weight of 0 or less: each weight must be"


def no_prefix(w: World) -> tuple[list[str], str]:
    return ["data_paths=[]", w.tokenizer], "data_paths is empty: give the prefix of each prepared dataset"


BAD_DATA = [
    no_bin,
    no_idx,
    a_misspelt_prefix,
    a_file_for_the_prefix,
    outside_mount,
    an_idx_of_another_bin,
    not_an_index,
    no_documents,
    token_ids_of_another_tokenizer,
    ids_too_narrow_for_the_tokenizer,
    the_null_tokenizer,
    a_tokenizer_path_not_there,
    a_model_smaller_than_the_tokenizer,
    weights_mixed_into_prefixes,
    a_weight_of_0,
    no_prefix,
]


@pytest.mark.usefixtures("output_root")
@pytest.mark.parametrize("case", BAD_DATA, ids=lambda case: case.__name__)
def test_bad_data_is_refused_before_training_with_its_line(
    case: Callable[[World], tuple[list[str], str]],
    corpus: Corpus,
    prepared: Prepared,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    """What every rank (and --check) runs before distributed init: entrypoint.py's resolve. The ranks run in srun.sh's
    container, which sees SRUNSH_MOUNT's destinations only (srun.sh exports RUN_DIR and SRUNSH_MOUNT to them)."""
    monkeypatch.setenv("RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("SRUNSH_MOUNT", f"{REPO}:/workspace/megatron,/fsx:/fsx,{tmp_path}:{tmp_path}")
    arguments, message = case(World(prepared, corpus, tmp_path))
    with pytest.raises(UsageError) as refused:
        resolve(TINY, *arguments)
    line = str(refused.value)
    assert "\n" not in line
    assert message in line, line


def test_a_missing_data_path_outside_the_container_says_only_that_it_is_missing(
    corpus: Corpus, tmp_path: Path, output_root: Path, monkeypatch: pytest.MonkeyPatch
):
    """Without srun.sh's container (--local, --no-container, a user's --check) no SRUNSH_MOUNT applies."""
    monkeypatch.delenv("SRUNSH_MOUNT", raising=False)
    with pytest.raises(UsageError, match=f"data path {tmp_path}/web has no web.bin and web.idx; {tmp_path} holds no"):
        resolve(TINY, f"data_paths={tmp_path}/web", f"tokenizer_path={corpus.tokenizer}")


def test_object_storage_data_is_left_to_megatron_core(corpus: Corpus, output_root: Path):
    """s3:// and msc:// prefixes are fetched by megatron-core's own readers during training; nothing here reads them."""
    cfg = resolve(TINY, "data_paths=s3://bucket/corpus/web", f"tokenizer_path={corpus.tokenizer}")
    assert cfg.dataset.blend == (["s3://bucket/corpus/web"], None)


def test_a_run_without_data_says_it_trains_on_mock_data(output_root: Path):
    from launcher.config import data

    line = data.describe(resolve(TINY))
    assert line.startswith("data: mock (tokens Megatron generates, not a corpus): pass data_paths=PREFIX")


def documented_sample() -> tuple[int, int]:
    """(ids read from the start of each sampled sequence, sequences sampled), as README's Your data states them."""
    said = re.search(r"the first ([\d,]+) ids of (\d+) sequences", " ".join(README.read_text().split()))
    assert said, "README's Your data no longer says how the token ids are sampled"
    return number(said[1]), int(said[2])


def bad_id_at(sequences: int, sequence: int, position: int, length: int) -> list[list[int]]:
    """sequences documents of length ids below the 400 of the session's tokenizer (399, its last id, included), with
    400, the first id beyond it, at one place."""
    documents = [[(i * 7 + j) % 400 for j in range(length - 1)] + [399] for i in range(sequences)]
    documents[sequence][position] = 400
    return documents


@pytest.mark.usefixtures("output_root")
def test_token_ids_up_to_the_last_of_the_tokenizer_pass_and_the_first_beyond_is_refused_where_read(
    corpus: Corpus, tmp_path: Path
):
    """The boundary of the sampled ids: 399 (the 400-token tokenizer's last) passes everywhere; 400 is refused in
    the first and last sequence and at the last id read of a sequence, and is not read one id further."""
    read, sampled = documented_sample()
    length = read + 8
    arguments = [f"tokenizer_path={corpus.tokenizer}", "dataset.split=100,0,0"]

    def check(documents: list[list[int]], name: str):
        return resolve(TINY, f"data_paths={write_dataset(tmp_path / name, documents)}", *arguments)

    clean = [[(i * 7 + j) % 400 for j in range(length - 1)] + [399] for i in range(sampled)]
    assert max(map(max, clean)) == 399
    check(clean, "clean")
    for sequence, position in [(0, 0), (sampled - 1, read - 1), (sampled // 2, read - 1)]:
        with pytest.raises(
            UsageError, match=f"holds token id 400 \\(in sequence {sequence}\\), outside the 400 tokens"
        ):
            check(bad_id_at(sampled, sequence, position, length), f"bad{sequence}")
    check(bad_id_at(sampled, 1, read, length), "unread")  # beyond the ids read: the check samples, never reads all
