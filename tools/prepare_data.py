#!/usr/bin/env python3
"""Turn raw text into a Megatron indexed dataset, PREFIX.bin + PREFIX.idx, for a recipe's data_paths=PREFIX.

    python3 tools/prepare_data.py INPUT [INPUT ...] --tokenizer DIR --output-prefix PREFIX [--workers N]

INPUT: JSONL files (one document a line, its text in the field --json-key), plain text files (one document a file,
or per paragraph or line with --plain-text), either gzipped (.gz), or folders holding such files (.jsonl, .json,
.ndjson, .txt, .text, .md; read in sorted order). DIR: the model's Hugging Face folder (the recipe's hf_path serves)
or any folder with tokenizer.json / tokenizer_config.json. Each document becomes its token ids, special tokens
included as the tokenizer adds them, followed by the tokenizer's end-of-document token (eos_token), as Megatron's
own preprocessing writes it with --append-eod; megatron-core's IndexedDatasetBuilder writes the files.

Progress (documents, tokens, tokens/s) goes to stderr, one line every --progress-interval seconds when stderr is not
a terminal; the last line on stdout sums it up. The files appear only once complete. Needs no GPU: run it on a login
node, or on a CPU node (srun) for a big corpus, with one worker process per CPU. Bad input is one line on stderr and
exit status 2.
"""

import argparse
import gzip
import itertools
import json
import os
import sys
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, NoReturn

import numpy
from tokenizers import Tokenizer

if TYPE_CHECKING:
    from tqdm import tqdm

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt", ".text", ".md")
CHUNK_BYTES = 1 << 20  # what one worker task encodes: large enough to hide the hand-off, small enough to stream
CHUNK_DOCUMENTS = 4096
# A unit of input: (line number where it starts, its bytes). A chunk: (kind, file, units).
Unit = tuple[int, bytes]
Chunk = tuple[str, str, list[Unit]]
# What a worker returns for a chunk: token ids of its documents back to back, each document's length, how many
# units held no text, and the first problem found (then nothing else).
Encoded = tuple[numpy.ndarray, numpy.ndarray, int, str | None]


class InputError(Exception):
    """Bad input; the message names the problem and the fix."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see tools/prepare_data.py --help)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = Parser(prog="prepare_data.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="JSONL or text files, or folders")
    parser.add_argument("--tokenizer", required=True, type=Path, metavar="DIR", help="Hugging Face tokenizer folder")
    parser.add_argument("--output-prefix", "-o", required=True, metavar="PREFIX", help="writes PREFIX.bin, .idx")
    parser.add_argument("--json-key", default="text", metavar="NAME", help="JSONL field with the text (text)")
    parser.add_argument(
        "--plain-text",
        choices=("file", "paragraph", "line"),
        default="file",
        help="plain text inputs: one document a file (default), a blank-line separated paragraph, or a line",
    )
    parser.add_argument(
        "--workers", type=int, default=len(os.sched_getaffinity(0)), metavar="N", help="encoding processes (CPUs)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace PREFIX.bin/.idx if they exist")
    parser.add_argument(
        "--progress-interval", type=float, default=10.0, metavar="S", help="seconds between progress lines in logs"
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        cpus = len(os.sched_getaffinity(0))
        raise InputError(f"--workers {args.workers}: give at least 1 (default: the {cpus} CPUs this process may use)")
    return args


def input_files(inputs: list[Path]) -> list[Path]:
    """The files to read, in order: each INPUT file, and the known kinds of file in each INPUT folder."""
    files: list[Path] = []
    known = tuple(suffix + gz for suffix in (*JSONL_SUFFIXES, *TEXT_SUFFIXES) for gz in ("", ".gz"))
    for path in inputs:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(known))
            if not found:
                raise InputError(f"input folder {path} holds no {', '.join(known[::2])} files (or .gz of them)")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"input {path} does not exist: give JSONL or text files, or folders holding them")
    return files


def paragraphs(stream: IO[bytes]) -> Iterator[Unit]:
    """Each run of lines that are not blank, from its first line's number."""
    for blank, run in itertools.groupby(enumerate(stream, start=1), key=lambda unit: not unit[1].strip()):
        if not blank:
            held = list(run)
            yield held[0][0], b"".join(line for _, line in held).rstrip(b"\r\n")


def units(kind: str, plain_text: str, stream: IO[bytes]) -> Iterator[Unit]:
    if kind == "jsonl":
        return enumerate(stream, start=1)
    if plain_text == "file":
        return iter([(1, stream.read())])
    if plain_text == "paragraph":
        return paragraphs(stream)
    return ((number, line.rstrip(b"\r\n")) for number, line in enumerate(stream, start=1))


def chunks(files: list[Path], plain_text: str) -> Iterator[tuple[Chunk, int]]:
    """The inputs in chunks for the workers, each with the bytes of input files it took (for the progress bar)."""
    for path in files:
        kind = "jsonl" if path.name.removesuffix(".gz").endswith(JSONL_SUFFIXES) else "text"
        # stream: the file's bytes, decompressed for .gz; raw.tell(): how far into the file on disk reading has got.
        with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw) if path.name.endswith(".gz") else raw as stream:
            held: list[Unit] = []
            size = reported = 0
            for unit in units(kind, plain_text, stream):
                held.append(unit)
                size += len(unit[1])
                if size >= CHUNK_BYTES or len(held) >= CHUNK_DOCUMENTS:
                    yield (kind, str(path), held), raw.tell() - reported
                    reported = raw.tell()
                    held, size = [], 0
            if held or reported == 0:
                yield (kind, str(path), held), raw.tell() - reported


WORKER: dict = {}


def start_worker(tokenizer_json: str, eod: int, dtype: str, json_key: str) -> None:
    # One thread per worker process: the processes already use every CPU.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    WORKER.update(tokenizer=Tokenizer.from_str(tokenizer_json), eod=eod, dtype=numpy.dtype(dtype), key=json_key)


def text_of(kind: str, source: str, number: int, data: bytes) -> str:
    """A unit's text; raises InputError naming the file and line when it has none to give."""
    if kind == "text":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InputError(f"{source}:{number} is not UTF-8 text ({error.reason}): convert it with iconv") from None
    if not data.strip():
        return ""
    try:
        record = json.loads(data)
    except ValueError as error:
        raise InputError(f"{source}:{number} is not JSON ({error}): JSONL holds one JSON object a line") from None
    key = WORKER["key"]
    if not isinstance(record, dict):
        raise InputError(f"{source}:{number} is a JSON {type(record).__name__}, not an object with a {key!r} field")
    if key not in record:
        fields = ", ".join(repr(name) for name in list(record)[:6])
        raise InputError(f"{source}:{number} has no {key!r} field (it has {fields}): name the text's with --json-key")
    text = record[key]
    if not isinstance(text, str):
        raise InputError(f"{source}:{number}: field {key!r} is a JSON {type(text).__name__}, not a string of text")
    return text


def encode(chunk: Chunk) -> Encoded:
    kind, source, held = chunk
    try:
        texts = [text_of(kind, source, number, data) for number, data in held]
    except InputError as error:
        return numpy.zeros(0, WORKER["dtype"]), numpy.zeros(0, numpy.int64), 0, str(error)
    kept = [text for text in texts if text.strip()]
    encodings = WORKER["tokenizer"].encode_batch_fast(kept)
    lengths = numpy.fromiter((len(e.ids) + 1 for e in encodings), numpy.int64, len(encodings))
    ids = numpy.empty(int(lengths.sum()), WORKER["dtype"])
    end = 0
    for encoding, length in zip(encodings, lengths, strict=True):
        ids[end : end + length - 1] = encoding.ids
        ids[end + length - 1] = WORKER["eod"]
        end += length
    return ids, lengths, len(texts) - len(kept), None


def load_tokenizer(directory: Path) -> tuple[str, int, int]:
    """The tokenizer as Megatron's HuggingFaceTokenizer sees it: -> (its tokenizers JSON, end-of-document id, vocabulary
    size). Megatron takes eos_token as the end of a document, sep_token where there is none, and len() as the size."""
    if not directory.is_dir():
        raise InputError(
            f"--tokenizer {directory} is not a folder: give the model's Hugging Face folder (with tokenizer.json)"
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise InputError(
            f"--tokenizer {directory} holds no Hugging Face tokenizer ({type(error).__name__}: {message}):"
            " give a folder with tokenizer.json or tokenizer_config.json"
        ) from None
    if not tokenizer.is_fast:
        raise InputError(f"--tokenizer {directory} has no fast tokenizer: save one there (tokenizer.json)")
    eod = tokenizer.eos_token_id if tokenizer.eos_token is not None else tokenizer.sep_token_id
    if eod is None:
        raise InputError(
            f"--tokenizer {directory} has no end-of-document token (eos_token or sep_token):"
            " set eos_token in its tokenizer_config.json"
        )
    backend = tokenizer.backend_tokenizer
    # Encoding as transformers does when called on a text: whole (no truncation), unpadded.
    backend.no_truncation()
    backend.no_padding()
    return backend.to_str(), eod, len(tokenizer)


def output_paths(prefix: str, overwrite: bool) -> tuple[Path, Path]:
    if prefix.endswith((".bin", ".idx")):
        raise InputError(f"--output-prefix {prefix} ends in a suffix: give the prefix, {prefix[:-4]}")
    bin_path, idx_path = Path(prefix + ".bin"), Path(prefix + ".idx")
    existing = [str(p) for p in (bin_path, idx_path) if p.exists()]
    if existing and not overwrite:
        raise InputError(f"{' and '.join(existing)} exist: pass --overwrite to replace, or another --output-prefix")
    return bin_path, idx_path


class LinePerUpdate:
    """Where tqdm writes when stderr is a log, not a terminal: each update becomes a line of its own."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").strip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(total: int, interval: float) -> "tqdm":
    from tqdm import tqdm

    bytes_read = {"total": total, "unit": "B", "unit_scale": True, "unit_divisor": 1024, "desc": "prepare_data.py"}
    if sys.stderr.isatty():
        return tqdm(**bytes_read, mininterval=0.5)
    return tqdm(
        **bytes_read,
        file=LinePerUpdate(sys.stderr),
        mininterval=interval,
        maxinterval=max(interval, 10.0),
        bar_format="{desc}: {percentage:3.0f}% of {total_fmt}B [{elapsed}<{remaining}{postfix}]",
    )


def prepare(args: argparse.Namespace) -> None:
    files = input_files(args.inputs)
    bin_path, idx_path = output_paths(args.output_prefix, args.overwrite)
    tokenizer_json, eod, vocab_size = load_tokenizer(args.tokenizer)
    try:
        bin_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"cannot create {bin_path.parent} for --output-prefix: {error.strerror}") from None

    import logging
    import multiprocessing

    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)  # "No CUDA runtime": none is needed here
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    dtype = DType.optimal_dtype(vocab_size)  # what Megatron's preprocessing picks: uint16 below 65500 tokens
    partial_bin, partial_idx = Path(f"{bin_path}.partial"), Path(f"{idx_path}.partial")
    read = sum(p.stat().st_size for p in files)
    start = time.monotonic()
    documents = tokens = skipped = 0
    context = multiprocessing.get_context("spawn")  # workers import numpy and tokenizers only, not this process's torch
    initargs = (tokenizer_json, eod, dtype.__name__, args.json_key)
    try:
        builder = IndexedDatasetBuilder(str(partial_bin), dtype=dtype)
        with (
            context.Pool(args.workers, initializer=start_worker, initargs=initargs) as pool,
            progress_bar(read, args.progress_interval) as bar,
        ):
            for (ids, lengths, empty, problem), taken in in_order(pool, chunks(files, args.plain_text), args.workers):
                if problem:
                    raise InputError(problem)
                end = 0
                for length in lengths:
                    builder.add_document(ids[end : end + length], [int(length)])
                    end += length
                documents, tokens, skipped = documents + len(lengths), tokens + end, skipped + empty
                rate = tokens / max(time.monotonic() - start, 1e-9)
                bar.set_postfix_str(f"{documents:,} docs, {tokens:,} tokens, {rate:,.0f} tokens/s", refresh=False)
                bar.update(taken)
        if documents == 0:
            raise InputError(f"no documents: {', '.join(map(str, args.inputs))} hold no text ({skipped} empty)")
        builder.finalize(str(partial_idx))
        os.replace(partial_bin, bin_path)
        os.replace(partial_idx, idx_path)
    finally:
        partial_bin.unlink(missing_ok=True)
        partial_idx.unlink(missing_ok=True)
    seconds = time.monotonic() - start
    print(
        f"prepare_data.py: wrote {args.output_prefix}.bin/.idx: {documents:,} documents, {tokens:,} tokens"
        f" ({dtype.__name__}), {bin_path.stat().st_size:,} bytes, from {read:,} bytes of {len(files)} file(s)"
        f" in {seconds:.1f} s ({tokens / seconds:,.0f} tokens/s, {args.workers} workers)"
        + (f"; {skipped:,} empty documents skipped" if skipped else "")
    )


def in_order(pool, work: Iterator[tuple[Chunk, int]], workers: int) -> Iterator[tuple[Encoded, int]]:
    """Each chunk's encoding, in input order, with a bounded number in flight (the input is never read far ahead)."""
    pending: deque = deque()
    for chunk, taken in work:
        pending.append((pool.apply_async(encode, (chunk,)), taken))
        if len(pending) >= 2 * workers:
            result, size = pending.popleft()
            yield result.get(), size
    while pending:
        result, size = pending.popleft()
        yield result.get(), size


def main(argv: list[str]) -> int:
    try:
        prepare(parse_args(argv))
    except InputError as error:
        print(f"prepare_data.py: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("prepare_data.py: interrupted; nothing written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
