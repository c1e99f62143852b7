"""The tiny recipe on data prepared with tools/prepare_data.py (issue 27): 50 steps on one GPU with falling loss,
beside the same run on mock data; each run says once what it trains on. About 3 minutes on one H200."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests import hf_models
from tests.gpu.conftest import REPO, Run, tail

pytestmark = pytest.mark.gpu

TINY = "tiny_gpt_pretrain.py"
STEPS = 50
DOCUMENTS = 20_000  # ~1M tokens; 16 documents fall to validation (9999:8:2), which runs at step 50
VALIDATION = re.compile(r"validation loss at iteration 50 \| lm loss value: ([\d.E+-]+)")


class OwnData(NamedTuple):
    prefix: Path
    tokenizer: Path
    summary: str  # prepare_data.py's last line


@pytest.fixture(scope="module")
def own_data(tmp_path_factory: pytest.TempPathFactory) -> OwnData:
    """Made-up documents as JSONL, a tokenizer trained on the first 200 (the tokenizers library, no hub; ~400 tokens),
    and tools/prepare_data.py run on them as a user runs it."""
    root = tmp_path_factory.mktemp("own_data")
    texts = hf_models.sample_texts(DOCUMENTS, seed=1)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    tokenizer = hf_models.write_tokenizer(root / "tokenizer", texts[:200])
    prefix = root / "data" / "corpus"
    command = [sys.executable, str(REPO / "tools" / "prepare_data.py"), str(corpus), "--tokenizer", str(tokenizer)]
    command += ["--output-prefix", str(prefix)]
    prepared = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    return OwnData(prefix, tokenizer, prepared.stdout.strip())


@pytest.fixture(scope="module")
def runs(launch, own_data: OwnData) -> dict[str, Run]:
    """The same tiny run twice on one GPU: on the prepared data, then on mock data."""
    data = (f"data_paths={own_data.prefix}", f"tokenizer_path={own_data.tokenizer}")
    return {
        "own data": launch(TINY, *data, f"train.train_iters={STEPS}", gpus=1),
        "mock data": launch(TINY, f"train.train_iters={STEPS}", gpus=1),
    }


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def check_training(run: Run, record, said: str, **facts: object) -> None:
    losses = [run.losses[step] for step in sorted(run.losses)]
    first, last = (round(mean(losses[:5]), 3), round(mean(losses[-5:]), 3)) if losses else (None, None)
    record(run, first_5_mean_loss=first, last_5_mean_loss=last, **facts)
    assert run.returncode == 0, tail(run)
    assert len(losses) == STEPS and all(map(math.isfinite, losses)), losses
    assert last < first - 1.0, losses
    assert run.log.count("entrypoint.py: data: ") == 1, tail(run)
    assert said in run.log, tail(run)


def test_tiny_recipe_trains_50_steps_on_prepared_data_with_falling_loss(runs, own_data: OwnData, record):
    run = runs["own data"]
    said = f"entrypoint.py: data: {own_data.prefix} ({DOCUMENTS:,} documents, "
    validation = VALIDATION.search(run.log)
    check_training(run, record, said, prepared=own_data.summary, validation_loss=validation and validation[1])
    assert validation, tail(run)


def test_the_same_run_on_mock_data_says_so(runs, record):
    check_training(runs["mock data"], record, "entrypoint.py: data: mock (tokens Megatron generates, not a corpus)")
