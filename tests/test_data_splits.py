"""The data check's judgement of the train/valid/test splits (issue 35, part 3), against megatron-core's own dataset
builder: a small real corpus (CPython's own library sources, one file a document) whose validation split the default
9999,8,2 leaves without a document is refused in one line before any rank trains, and the split that line offers,
typed as printed, builds; and, over corpora, documents, splits and blends drawn by hypothesis, whatever the check
passes builds within a time limit, and whatever it refuses hangs or fails in the builder."""

import multiprocessing
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import numpy
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from megatron.bridge.data.loaders import get_train_valid_test_num_samples
from megatron.bridge.data.utils import pretrain_train_valid_test_datasets_provider
from megatron.bridge.training.tokenizers.tokenizer import build_tokenizer

import entrypoint
from launcher.config import data
from launcher.errors import UsageError
from tests import hf_models
from tests.conftest import REPO, Corpus, Prepared, error_lines
from tests.test_data import write_dataset

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")
BUILD_LIMIT_S = 120  # a build of these small datasets takes well under a second; a hang never ends
STDLIB_DOCUMENTS = 167  # the corpus: 167 files of CPython's library


def resolve(*argv: str):
    cfg, _ = entrypoint.resolve(entrypoint.parse_args([*argv]))
    return cfg


def build_in_child(cfg, sizes: list[int], answer) -> None:
    """Megatron Bridge's GPT dataset provider (megatron-core's BlendedMegatronDatasetBuilder), as pretrain calls it:
    finalized config, the run's tokenizer, the sample targets. What it raises ends the child with status 1."""
    cfg.dataset.finalize()
    cfg.dataset.tokenizer = build_tokenizer(cfg.tokenizer)
    built = pretrain_train_valid_test_datasets_provider(sizes, cfg.dataset)
    answer.send([None if dataset is None else len(dataset) for dataset in built])


def build(cfg, limit_s: float = BUILD_LIMIT_S) -> tuple[str, list[int | None] | int | None]:
    """("built", each split's length), ("failed", the exit status) or ("hung", None) when the build outlasts limit_s.
    In a forked child, so that a hang can be stopped (megatron-core's loop never returns)."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=build_in_child, args=(cfg, get_train_valid_test_num_samples(cfg), send))
    child.start()
    try:
        child.join(limit_s)  # the lengths it sends fit in the pipe's buffer: it exits without waiting for a reader
        if child.exitcode is None:
            return "hung", None
        return ("built", receive.recv()) if child.exitcode == 0 else ("failed", child.exitcode)
    finally:
        child.kill()
        child.join()


@pytest.fixture(scope="session")
def stdlib_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(prefix, tokenizer): the first 167 non-empty .py files of this Python's standard library, one file a document,
    through tools/prepare_data.py with a BPE tokenizer trained on them, as the issue prepared them."""
    root = tmp_path_factory.mktemp("stdlib")
    library = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))
    sources = [source for source in library if source.stat().st_size][:STDLIB_DOCUMENTS]  # prepare_data skips empty
    folder = root / "sources"
    folder.mkdir()
    for number, source in enumerate(sources):
        shutil.copy(source, folder / f"{number:03}_{source.name}.txt")
    texts = [source.read_text(encoding="utf-8", errors="replace")[:4000] for source in sources]
    tokenizer = hf_models.write_tokenizer(root / "tokenizer", texts, vocab_size=1000)
    prefix = root / "stdlib"
    command = [sys.executable, str(REPO / "tools" / "prepare_data.py"), str(folder), "--tokenizer", str(tokenizer)]
    result = subprocess.run(
        [*command, "-o", str(prefix), "--workers", "2"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f": {STDLIB_DOCUMENTS} documents, " in result.stdout
    return prefix, tokenizer


def test_a_small_corpus_whose_valid_split_gets_no_document_is_refused_in_one_line(
    stdlib_corpus: tuple[Path, Path], entrypoint_main: Callable[..., subprocess.CompletedProcess[str]]
):
    """Megatron Bridge's 9999,8,2 gives the 167 documents' valid and test splits none (round(0.9989 * 167) = 167):
    without the check, --check passed and every rank then hung in megatron-core's GPTDataset._get_num_epochs."""
    prefix, tokenizer = stdlib_corpus
    result = entrypoint_main(TINY, f"data_paths={prefix}", f"tokenizer_path={tokenizer}", "--check")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stdout == ""
    (line,) = error_lines(result.stderr)
    assert line == (
        f"entrypoint.py: error: the valid split of {prefix} (192 samples) and the test split of {prefix} (64 samples)"
        " get no document: megatron-core's GPTDataset would loop forever looking for the tokens of their samples, and"
        f" the job would hang before its first step (dataset.split=9999,8,2: {prefix} (167 documents) gets 167 train,"
        f" 0 valid, 0 test): pass dataset.split=90,5,5: {prefix} gets 150 train, 9 valid, 8 test"
    )


def test_the_split_the_refusal_offers_passes_as_typed_and_megatron_core_builds_it(
    stdlib_corpus: tuple[Path, Path], entrypoint_main, output_root: Path
):
    prefix, tokenizer = stdlib_corpus
    arguments = [TINY, f"data_paths={prefix}", f"tokenizer_path={tokenizer}", "dataset.split=90,5,5"]
    result = entrypoint_main(*arguments, "--check")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "profile_ranks=0\n"
    cfg = resolve(*arguments)
    assert cfg.dataset.split == "90,5,5"
    status, lengths = build(cfg)
    assert status == "built", lengths
    targets = get_train_valid_test_num_samples(cfg)
    assert all(length >= target for length, target in zip(lengths, targets, strict=True)), (lengths, targets)


def test_without_the_check_the_default_split_of_that_corpus_hangs_the_builder(stdlib_corpus: tuple[Path, Path]):
    """The premise of the refusal: megatron-core's builder, given what the check refuses, never returns."""
    prefix, tokenizer = stdlib_corpus
    cfg = resolve(TINY, f"data_paths={prefix}", f"tokenizer_path={tokenizer}", "dataset.split=90,5,5")
    cfg.dataset.split = "9999,8,2"
    assert build(cfg, limit_s=20) == ("hung", None)


def test_an_unweighted_blend_with_a_dataset_of_less_than_one_sample_in_a_split_is_refused(
    stdlib_corpus: tuple[Path, Path], tmp_path: Path, output_root: Path
):
    """In a blend without weights each dataset's weight is its size: one of 0 samples fails BlendedDataset's assert."""
    prefix, tokenizer = stdlib_corpus
    tiny = write_dataset(tmp_path / "tiny", [[5, 6, 1]] * 10)
    arguments = [TINY, f"data_paths=[{prefix},{tiny}]", f"tokenizer_path={tokenizer}", "dataset.split=90,5,5"]
    with pytest.raises(UsageError) as refused:
        resolve(*arguments)
    assert str(refused.value).startswith(
        f"the train split of {tiny} (9 documents, 27 tokens) and the valid split of {tiny} (1 documents, 3 tokens) and"
        f" the test split of {tiny} (0 documents, 0 tokens) hold less than one sample (dataset.seq_length+1=2,049"
        " tokens): megatron-core's BlendedDataset refuses a dataset of 0 samples in a blend without weights"
    ), str(refused.value)
    assert str(refused.value).endswith(
        "give the blend weights (data_paths=[WEIGHT,PREFIX,...]), or prepare more text for each dataset"
    )
    # with weights, a part needs only a token (it repeats until its target is met); 90,5,5 leaves tiny's test none
    weighted = [TINY, f"data_paths=[0.9,{prefix},0.1,{tiny}]", f"tokenizer_path={tokenizer}"]
    with pytest.raises(UsageError, match=f"the test split of {tiny} \\(8 samples\\) gets no document: "):
        resolve(*weighted, "dataset.split=90,5,5")
    assert build(resolve(*weighted, "dataset.split=80,10,10"))[0] == "built"


# ---- property: what the check passes builds, what it refuses does not ------------------------------------------------

HANG_LIMIT_S = 5  # what the check refuses is given this long to prove it would build (these builds take < 1 s)


@st.composite
def runs(draw: st.DrawFn) -> dict:
    """A run's data: 1-3 datasets of 1-40 documents of 1-80 tokens, how they are blended (one prefix, a blend with or
    without weights, or a blend per split), the split, the sequence length and the training and validation lengths."""
    corpora = draw(st.lists(st.lists(st.integers(1, 80), min_size=1, max_size=40), min_size=1, max_size=3))
    form = draw(st.sampled_from(["blend", "weighted", "per split"]))
    split = draw(
        st.one_of(
            st.just("9999,8,2"),
            st.tuples(st.integers(0, 100), st.integers(0, 20), st.integers(0, 20))
            .filter(lambda weights: sum(weights) > 0)
            .map(lambda weights: ",".join(map(str, weights))),
        )
    )
    per_split = [draw(st.one_of(st.none(), st.lists(st.integers(0, len(corpora) - 1), min_size=1, max_size=2)))
                 for _ in range(3)]  # fmt: skip
    return {
        "corpora": corpora,
        "form": form,
        "weights": draw(st.lists(st.integers(1, 9), min_size=len(corpora), max_size=len(corpora))),
        "split": split,
        "per_split": per_split,
        "seq_length": draw(st.integers(4, 64)),
        "train_iters": draw(st.integers(1, 20)),
        "global_batch_size": draw(st.integers(1, 4)),
        "eval_interval": draw(st.one_of(st.none(), st.integers(1, 10))),
        "eval_iters": draw(st.integers(0, 3)),
        "seed": draw(st.integers(0, 2**16)),
    }


@pytest.fixture(scope="module")
def base_cfg(corpus: Corpus, prepared: Prepared):
    """The tiny recipe on the session's prepared data and tokenizer, resolved once; each example sets its data."""
    assert prepared.result.returncode == 0, prepared.result.stderr[-2000:]
    return resolve(
        TINY, f"data_paths={prepared.prefix}", f"tokenizer_path={corpus.tokenizer}", "dataset.split='90,5,5'"
    )


def write_corpora(root: Path, run: dict) -> list[str]:
    """Each corpus as a dataset of random token ids of the session's 400-token tokenizer, as prepare_data writes it."""
    rng = numpy.random.default_rng(run["seed"])
    prefixes = []
    for number, lengths in enumerate(run["corpora"]):
        documents = [list(rng.integers(0, 400, length)) for length in lengths]
        prefixes.append(str(write_dataset(root / f"d{number}", documents)))
    return prefixes


def set_run(cfg, prefixes: list[str], run: dict) -> None:
    dataset = cfg.dataset
    if run["form"] == "per split":
        per_split = [None if chosen is None else ([prefixes[i] for i in chosen], None) for chosen in run["per_split"]]
        dataset.blend, dataset.blend_per_split, dataset.split = None, per_split, None
    else:
        weights = [float(w) for w in run["weights"]] if run["form"] == "weighted" else None
        dataset.blend, dataset.blend_per_split, dataset.split = (prefixes, weights), None, run["split"]
    dataset.seq_length = run["seq_length"]
    cfg.train.train_iters, cfg.train.global_batch_size = run["train_iters"], run["global_batch_size"]
    cfg.validation.eval_interval, cfg.validation.eval_iters = run["eval_interval"], run["eval_iters"]


@settings(
    max_examples=25,
    deadline=timedelta(seconds=60),
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(run=runs())
def test_what_the_data_check_passes_megatron_core_builds_and_what_it_refuses_it_cannot(base_cfg, run: dict):
    with tempfile.TemporaryDirectory() as root:
        set_run(base_cfg, write_corpora(Path(root), run), run)
        try:
            data.check_data(base_cfg)
        except UsageError as refused:
            line = str(refused)
            assert "\n" not in line
            assert "dataset.split=" in line or "blend_per_split" in line
            status, said = build(base_cfg, limit_s=HANG_LIMIT_S)
            event(f"refused, and megatron-core {status}")
            assert status in {"hung", "failed"}, f"refused ({line}), but megatron-core built {said}"
        else:
            status, said = build(base_cfg)
            event(f"passed, and megatron-core {status}")
            assert status == "built", f"passed, but megatron-core {status}: {said}"
