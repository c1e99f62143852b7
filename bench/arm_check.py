"""Each arm's config checked as entrypoint.py --check checks it (the real Megatron Bridge classes, its own validation
for the arm's world size), with what every override holds after Megatron Bridge's runtime update (an override it
undoes is inert), and the FLOPs per token by three formulas:

- megatron_bridge: Megatron Bridge's num_floating_point_operations, behind its logged TFLOP/s: the GEMMs of every
  layer and of the output layer, 6 x (N - input embedding), plus causal attention, 6 x L x heads x head_dim x s;
- 6N: six FLOPs per parameter per token, every parameter (Megatron Bridge's own count) counted;
- 6N + attention: 6N plus the same attention term.

    python3 -m bench.arm_check RECORD.json OUT.json     # RECORD: bench_turns.py's record of arms
"""

import copy
import io
import json
import logging
import sys
from contextlib import redirect_stderr, redirect_stdout
from enum import Enum
from pathlib import Path

from megatron.bridge.training.utils.flop_utils import num_floating_point_operations
from megatron.bridge.training.utils.theoretical_memory_utils import estimate_training_memory

import entrypoint
from launcher import checks, overrides
from launcher.errors import UsageError


def normalized(value: object) -> object:
    """A value as an override writes it: enum members by name, dtypes by their text."""
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, (list, tuple)):
        return [normalized(item) for item in value]
    return value if value is None or isinstance(value, (bool, int, float, str, dict)) else str(value)


def held(cfg: object, key: str) -> object:
    node = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def inert(arguments: list[str], validated: object) -> dict[str, dict]:
    """Overrides of config fields whose value the runtime update changed back: {key: {given, holds}}."""
    undone = {}
    for override in overrides.parse(arguments):
        key = override.key_or_group
        if "." not in key:  # a recipe argument or a preset name (mixed_precision=NAME), not a field value
            continue
        given, holds = normalized(override.value()), normalized(held(validated, key))
        if given != holds:
            undone[key] = {"given": given, "holds": holds}
    return undone


def gflop_per_token(cfg: object) -> dict[str, float]:
    if cfg.model.vocab_size is None:  # Megatron Bridge's setup takes it from the tokenizer (the null one has it)
        if cfg.tokenizer.vocab_size is None:
            return {}
        cfg = copy.deepcopy(cfg)
        cfg.model.vocab_size = cfg.tokenizer.vocab_size
    model = cfg.model
    sequence = model.seq_length
    megatron_bridge = num_floating_point_operations(cfg, batch_size=1) / sequence
    six_n = 6 * estimate_training_memory(cfg, include_activation=False).total_parameters
    attention = 6 * model.num_layers * model.num_attention_heads * model.kv_channels * sequence
    return {
        "megatron_bridge": round(megatron_bridge / 1e9, 3),
        "6N": round(six_n / 1e9, 3),
        "6N + attention": round((six_n + attention) / 1e9, 3),
    }


def check_arm(recipe: str, arguments: list[str], world_size: int) -> dict:
    """{"ok": True, "inert": ..., "gflop_per_token": ...} or {"ok": False, "error": the one-line refusal}."""
    chatter = io.StringIO()
    logging.disable(logging.WARNING)  # Megatron's log handlers hold the streams of import time
    try:
        with redirect_stdout(chatter), redirect_stderr(chatter):
            args = entrypoint.parse_args([recipe, *arguments, "--check", "--world-size", str(world_size)])
            cfg, _ = entrypoint.resolve(args)
            validated = checks.upstream_validated(cfg, world_size) or cfg
    except UsageError as error:
        return {"ok": False, "error": str(error)}
    finally:
        logging.disable(logging.NOTSET)
    return {"ok": True, "inert": inert(arguments, validated), "gflop_per_token": gflop_per_token(validated)}


def check_record(record: dict) -> dict[str, dict]:
    repo = Path(__file__).resolve().parents[1]
    return {name: check_arm(str(repo / arm["recipe"]), arm["overrides"], arm["gpus"]) for name, arm in record.items()}


def main() -> None:
    record_path, out_path = map(Path, sys.argv[1:3])
    results = check_record(json.loads(record_path.read_text()))
    out_path.write_text(json.dumps(results, indent=2) + "\n")
    sys.exit(0 if all(result["ok"] for result in results.values()) else 2)


if __name__ == "__main__":
    main()
