"""Tokens per second of tools/prepare_data.py (A) against megatron-core's reference preprocessing script (B,
tools/preprocess_data.py of Megatron-LM, fetched by you, never committed) on the same corpus, tokenizer and workers,
and the tokenizer's own batch rate on the same texts as a ceiling.

    python3 bench/bench_prepare_data.py PREFIX --reference /tmp/preprocess_data.py [--workers 2] [--rounds 3]

The corpus (PREFIX-work/corpus.jsonl) is made here, from what every Python installation has: the standard library's
source without its tests (about 11 MiB, repeated up to --corpus-mb), in documents of about 2 KB (consecutive
blank-line separated blocks). The tokenizer: a byte-level BPE of 32,000 tokens trained on a quarter of them with the
tokenizers library. Each run is the whole command, from its start to its exit (interpreter and imports included, as a
user waits for it), in rounds A B, then B A; tokens/s = tokens written / wall seconds (A also reports its own rate
after its start-up); the 1-minute load average at each start shows how busy a shared machine was. Both must write the
same token ids (checked every round). For scale: tokenizers' own batch rate (encode_batch_fast on all texts in this
process, once loaded), in one thread and on every core. Prints a table; writes PREFIX.md and PREFIX.json.
"""

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.report

from bench import report

REPO = Path(__file__).resolve().parents[1]
DOCUMENT_BYTES = 2048


def documents(limit: int) -> list[str]:
    """`limit` bytes of the standard library's source (its tests left out; again from the start when it is used up),
    in documents of about 2 KB, always the same ones."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in sorted(stdlib.rglob("*.py")) if not {"site-packages", "test", "tests"} & set(p.parts)]
    texts, held, size, total = [], [], 0, 0
    for path in itertools.cycle(files):
        for block in path.read_text(errors="replace").split("\n\n"):
            held.append(block)
            size += len(block) + 2
            if size >= DOCUMENT_BYTES:
                texts.append("\n\n".join(held))
                total += size
                held, size = [], 0
                if total >= limit:
                    return texts
    return texts


def write_tokenizer(directory: Path, texts: list[str]) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32_000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(texts, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>").save_pretrained(directory)
    return directory


def command(tool: str, args: argparse.Namespace, work: Path, tokenizer: Path) -> list[str]:
    corpus, prefix, workers = str(work / "corpus.jsonl"), str(work / f"out-{tool}"), str(args.workers)
    if tool == "A":
        script = [str(REPO / "tools" / "prepare_data.py"), corpus, "--tokenizer", str(tokenizer)]
        return [sys.executable, *script, "--output-prefix", prefix, "--workers", workers, "--overwrite"]
    return [
        sys.executable, str(args.reference), "--input", corpus, "--output-prefix", prefix, "--workers", workers,
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tokenizer), "--append-eod",
    ]  # fmt: skip


def written(tool: str, prefix: Path) -> Path:
    """The .bin a run wrote: B names it after the JSON key and the level, PREFIX_text_document.bin."""
    return Path(f"{prefix}.bin") if tool == "A" else Path(f"{prefix}_text_document.bin")


SUMMARY_RATE = re.compile(r"in ([\d.]+) s \(([\d,]+) tokens/s")


def run(tool: str, args: argparse.Namespace, work: Path, tokenizer: Path) -> dict:
    load = round(os.getloadavg()[0], 1)  # the machine may be shared: how busy it was as the run started
    start = time.monotonic()
    done = subprocess.run(
        command(tool, args, work, tokenizer),
        capture_output=True, text=True, timeout=args.timeout, check=False, cwd=work,
    )  # fmt: skip
    wall = time.monotonic() - start
    if done.returncode:
        raise SystemExit(f"bench_prepare_data.py: {tool} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    tokens = written(tool, work / f"out-{tool}").stat().st_size // 2  # uint16 ids: 32,000 tokens
    own = SUMMARY_RATE.search(done.stdout) if tool == "A" else None  # A's summary: after its start-up
    return {
        "tool": tool,
        "load": load,
        "wall_s": round(wall, 2),
        "tokens": tokens,
        "tokens_per_s": round(tokens / wall),
        "after_startup_tokens_per_s": own and int(own[2].replace(",", "")),
    }


def tokenizer_rates(tokenizer: Path, texts: list[str]) -> dict:
    """tokenizers' own batch rate on the texts, once loaded: in one thread (what each of A's workers runs), and on
    every core (TOKENIZERS_PARALLELISM, read by tokenizers at each call)."""
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(tokenizer).backend_tokenizer
    before, rates = dict(os.environ), {}
    for threads, parallelism in (("one thread", "false"), ("every core", "true")):
        os.environ["TOKENIZERS_PARALLELISM"] = parallelism
        start = time.monotonic()
        tokens = sum(len(encoding.ids) + 1 for encoding in backend.encode_batch_fast(texts))
        rates[threads] = round(tokens / (time.monotonic() - start))
    os.environ.clear()
    os.environ.update(before)  # the runs get the environment a user's shell gives them
    return rates


def markdown(result: dict) -> str:
    lines = [
        "# tools/prepare_data.py (A) against megatron-core's tools/preprocess_data.py (B)",
        "",
        f"{result['date']}; {result['machine']}. Corpus: {result['corpus']}. Both with --workers"
        f" {result['workers']}; wall seconds of the whole command (interpreter and imports included).",
        "",
        "| round | tool | load at start | wall s | tokens | tokens/s | A after its start-up, tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['round']} | {r['tool']} | {r['load']} | {r['wall_s']} | {r['tokens']:,} | {r['tokens_per_s']:,}"
        f" | {format(r['after_startup_tokens_per_s'], ',') if r['after_startup_tokens_per_s'] else '-'} |"
        for r in result["runs"]
    ]
    ratios = result["ratios"]
    if ratios:
        lines += [
            "",
            f"A/B tokens/s per round: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f},"
            f" range {min(ratios):.3f}-{max(ratios):.3f}. Same token ids in A's and B's .bin: {result['same_ids']}.",
        ]
    rates, workers = result["tokenizer"], result["workers"]
    lines += [
        "",
        f"The tokenizer alone (tokenizers' encode_batch_fast, once loaded): {rates['one thread']:,} tokens/s in one"
        f" thread ({workers} workers: {workers * rates['one thread']:,}), {rates['every core']:,} on every core.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", type=Path, help="writes PREFIX.md and PREFIX.json; works in PREFIX-work/")
    parser.add_argument("--reference", type=Path, required=True, help="Megatron-LM's tools/preprocess_data.py")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus-mb", type=float, default=40, help="MiB of text (start-up matters less with more)")
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args()
    work = Path(f"{args.prefix}-work")
    work.mkdir(parents=True, exist_ok=True)
    texts = documents(int(args.corpus_mb * 2**20))
    (work / "corpus.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    tokenizer = write_tokenizer(work / "tokenizer", texts[: len(texts) // 4])
    result = {
        "date": report.timestamp(),
        "machine": f"{len(os.sched_getaffinity(0))} CPUs ({os.uname().machine})",
        "corpus": f"{len(texts):,} documents, {sum(map(len, texts)) / 2**20:.1f} MiB of the Python standard library's"
        " source (repeated past its end); a 32,000-token byte-level BPE trained on a quarter of it",
        "workers": args.workers,
        "runs": [],
        "ratios": [],
        "same_ids": True,
        "tokenizer": tokenizer_rates(tokenizer, texts),
    }
    for number in range(args.rounds):
        pair = {}
        for tool in ("A", "B") if number % 2 == 0 else ("B", "A"):
            pair[tool] = run(tool, args, work, tokenizer)
            result["runs"].append({"round": number, **pair[tool]})
            report.write(args.prefix, result, markdown)
        same = numpy.array_equal(*(numpy.fromfile(written(t, work / f"out-{t}"), numpy.uint16) for t in "AB"))
        result["same_ids"] = result["same_ids"] and bool(same)
        result["ratios"].append(pair["A"]["tokens_per_s"] / pair["B"]["tokens_per_s"])
    print(report.write(args.prefix, result, markdown), end="")


if __name__ == "__main__":
    main()
