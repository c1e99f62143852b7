"""Shared fixtures: the repository, a CLI runner for entrypoint.py, tiny Hugging Face model folders, a corpus with its
tokenizer and prepared dataset, and a value made once a session for the tests of every xdist worker."""

import dataclasses
import fcntl
import json
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # entrypoint, viztracer_plugin, launcher and recipes import as the launcher sees them

from tests import hf_models  # noqa: E402

RECIPES = sorted(p for p in (REPO / "recipes").glob("*_pretrain.py"))


@pytest.fixture(autouse=True)
def environment_restored():
    """Whatever a test's code exports (entrypoint.py sets CUDA_DEVICE_MAX_CONNECTIONS per job, Megatron Bridge exports
    a recipe's env_vars) is gone when it ends, so no later test or subprocess inherits it."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def inherited_signal_state() -> tuple[frozenset[int], frozenset[int]]:
    """What every child of this process inherits through exec: its blocked signals and the ignored ones."""
    ignored = frozenset(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)
                        and signal.getsignal(s) == signal.SIG_IGN)  # fmt: skip
    return frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, [])), ignored


@pytest.fixture(autouse=True)
def signals_inherited_unchanged():
    """A test that leaves a signal blocked or ignored in this process (an in-process entrypoint.train installs the
    hang report's SIGUSR2 handling, which blocks SIGUSR2) would hand it to every launch a later test starts, whose
    srun.sh could then never be told of a hang. Such a test fails here, and the state is put back."""
    blocked, ignored = inherited_signal_state()
    yield
    now_blocked, now_ignored = inherited_signal_state()
    if (now_blocked, now_ignored) == (blocked, ignored):
        return
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    for signum in now_ignored - ignored:
        signal.signal(signum, signal.SIG_DFL)
    changed = sorted(signal.Signals(s).name for s in (now_blocked ^ blocked) | (now_ignored ^ ignored))
    pytest.fail(f"the test left signals blocked or ignored for every process it starts: {changed}", pytrace=False)


@pytest.fixture
def output_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every run output of the test lands in its own temp dir."""
    root = tmp_path / "outputs"
    monkeypatch.setenv("OUTPUT_ROOT", str(root))
    monkeypatch.setenv("RUN_ID", "test-run")
    monkeypatch.delenv("VIZTRACER_OUTPUT_DIR", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return root


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """hf_dir('deepseek_v2') -> a folder with that shape's config.json (made once per session)."""
    made: dict[str, Path] = {}

    def make(shape: str) -> Path:
        if shape not in made:
            made[shape] = hf_models.write(shape, tmp_path_factory.mktemp(shape))
        return made[shape]

    return make


@dataclasses.dataclass(frozen=True)
class Corpus:
    texts: list[str]
    jsonl: Path  # one {"id": N, "text": ...} a line
    tokenizer: Path  # a Hugging Face tokenizer folder trained on the first few KB of texts


@dataclasses.dataclass(frozen=True)
class Prepared:
    prefix: Path  # PREFIX.bin + PREFIX.idx
    result: subprocess.CompletedProcess  # tools/prepare_data.py's run that wrote them


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    root = tmp_path_factory.mktemp("corpus")
    texts = hf_models.sample_texts(300)
    jsonl = root / "web.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in enumerate(texts)))
    return Corpus(texts, jsonl, hf_models.write_tokenizer(root / "tokenizer", texts[:30]))


@pytest.fixture(scope="session")
def prepared(corpus: Corpus, tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """The corpus through tools/prepare_data.py, as a user runs it, with 2 workers."""
    prefix = tmp_path_factory.mktemp("prepared") / "web"
    command = [sys.executable, str(REPO / "tools" / "prepare_data.py"), str(corpus.jsonl), "--workers", "2"]
    command += ["--tokenizer", str(corpus.tokenizer), "--output-prefix", str(prefix)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    return Prepared(prefix, result)


@pytest.fixture(scope="session")
def once(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Callable[[], Any]], Any]:
    """once(NAME, make) -> make()'s value (a picklable one), made by the first test of the session that asks for NAME,
    on whichever xdist worker, and read back by every later one: a slow subprocess that several tests read starts once
    a session. A make() that raises keeps nothing, so each test that asks again runs it again."""
    folder = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        folder = folder.parent  # the session's temp folder, which holds each worker's

    def value(name: str, make: Callable[[], Any]) -> Any:
        made = folder / f"once-{name}.pickle"
        with open(folder / f"once-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a worker making it holds the lock: wait for its value
            if not made.exists():
                made.write_bytes(pickle.dumps(make()))
        return pickle.loads(made.read_bytes())

    return value


@pytest.fixture
def run_entrypoint(output_root: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run entrypoint.py as srun.sh does, in a subprocess; returns the completed process (text, captured)."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(REPO / "entrypoint.py"), *args],
            check=False,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=REPO,
            timeout=300,
        )

    return run


@pytest.fixture
def entrypoint_main(
    output_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """entrypoint.main() in this process, from the repository, with what it printed: run_entrypoint's result without
    the new process, whose imports of the training stack cost some 15 s of CPU (this worker has them already). For
    tests of what the arguments and the recipe do; test_entrypoint.py checks that the program says the same."""
    import entrypoint

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        monkeypatch.chdir(REPO)
        capsys.readouterr()  # what the test printed before is not the call's
        status = entrypoint.main(list(args))
        said = capsys.readouterr()
        return subprocess.CompletedProcess(["entrypoint.py", *args], status, said.out, said.err)

    return run


def error_lines(stderr: str) -> list[str]:
    """The lines of stderr that entrypoint.py wrote itself (Megatron's import-time warnings filtered out)."""
    return [line for line in stderr.splitlines() if line.startswith("entrypoint.py:")]
