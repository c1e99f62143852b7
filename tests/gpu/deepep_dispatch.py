"""DeepEP's dispatch and combine through megatron-core's own calls (fused_dispatch, fused_combine), forward and
backward, checked against what the routing implies; one process per rank.

    python3 tests/gpu/deepep_dispatch.py OUT_PREFIX [--ranks 2] [--tokens 1024] [--hidden 512] ...

With as many GPUs as ranks, each rank has its own GPU, as in training. With fewer, ranks share them (two ranks on one
GPU exchange buffers by CUDA IPC as on two, but their kernels take turns on the GPU instead of running at once): the
only way DeepEP's intranode kernels, built for 2, 4 or 8 ranks, run on a one-GPU machine. The process group is gloo:
DeepEP uses it only to exchange IPC handles, and NCCL refuses two ranks on one GPU.

The stand-in experts weight each received token by its routing probabilities for this rank's experts, as Megatron's
MoE layer does, so that with x, probs and an upstream gradient g of a token:
    combined = x * sum(probs)          grad x = g * sum(probs)          grad probs[k] = <g, x> for every k
Writes OUT_PREFIX.json and OUT_PREFIX.md; exit status 1 when a check fails.
"""

import argparse
import json
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench.report

from bench import report

TOLERANCE = 2e-2  # bf16 rounding of the weighted tokens before the combine's sum
COUNTS = ("received_tokens", "tokens_per_expert")  # (got, expected): must be equal
ERRORS = ("combined_error", "grad_x_error", "grad_probs_error")  # must be within TOLERANCE


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def routing(tokens: int, experts: int, topk: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One rank's routing: top-k expert indices (int64) and their float32 probabilities, as Megatron's router gives."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(tokens, experts, generator=generator).softmax(dim=-1)
    probs, indices = torch.topk(scores, topk, dim=-1)
    return indices, probs


def expected_arrivals(indices: list[torch.Tensor], rank: int, experts: int) -> tuple[int, list[int]]:
    """Tokens of all ranks that reach `rank`, and how many each of its experts gets (experts are split in order)."""
    per_rank = experts // len(indices)
    first = rank * per_rank
    routed = torch.cat(indices)
    local = (routed >= first) & (routed < first + per_rank)
    per_expert = [int((routed == first + e).sum()) for e in range(per_rank)]
    return int(local.any(dim=1).sum()), per_expert


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest error relative to the expected values' scale (1 where it is below 1)."""
    scale = expected.abs().clamp(min=1.0)
    return float(((actual.float() - expected) / scale).abs().max())


def one_round(args: argparse.Namespace, rank: int, group: dist.ProcessGroup) -> dict:
    """One dispatch and combine, forward and backward, with this rank's own tokens; every check's worst error."""
    from megatron.core.transformer.moe.fused_a2a import fused_combine, fused_dispatch

    ranks = group.size()
    indices, probs = routing(args.tokens, args.experts, args.topk, seed=rank)
    generator = torch.Generator().manual_seed(1000 + rank)
    x_cpu = torch.randn(args.tokens, args.hidden, generator=generator).bfloat16()
    g_cpu = torch.randn(args.tokens, args.hidden, generator=generator).bfloat16()
    x = x_cpu.cuda().requires_grad_()
    token_probs = probs.cuda().requires_grad_()

    torch.cuda.synchronize()
    start = time.perf_counter()
    recv_x, recv_indices, recv_probs, tokens_per_expert, handle = fused_dispatch(
        x, indices.cuda(), token_probs, args.experts, group
    )
    local_weight = (recv_probs * (recv_indices >= 0)).sum(dim=1, keepdim=True)
    combined, _ = fused_combine((recv_x.float() * local_weight).bfloat16(), group, handle)
    (combined.float() * g_cpu.cuda().float()).sum().backward()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start

    all_indices = [torch.empty_like(indices) for _ in range(ranks)]
    dist.all_gather(all_indices, indices, group=group)
    arrivals, per_expert = expected_arrivals(all_indices, rank, args.experts)
    weight = probs.sum(dim=1, keepdim=True)
    x_f, g_f = x_cpu.float(), g_cpu.float()
    return {
        "received_tokens": (int(recv_x.shape[0]), arrivals),
        "tokens_per_expert": (tokens_per_expert.tolist(), per_expert),
        "combined_error": max_error(combined.detach().cpu(), x_f * weight),
        "grad_x_error": max_error(x.grad.cpu(), g_f * weight),
        "grad_probs_error": max_error(token_probs.grad.cpu(), (g_f * x_f).sum(dim=1, keepdim=True).expand_as(probs)),
        "seconds": seconds,
    }


def rank_main(rank: int, args: argparse.Namespace, port: int) -> None:
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.ranks)
    group = dist.group.WORLD
    rounds = [one_round(args, rank, group) for _ in range(args.rounds)]
    gathered: list[list[dict] | None] = [None] * args.ranks
    dist.all_gather_object(gathered, rounds, group=group)
    if rank == 0:
        result = summary(args, gathered)
        print(report.write(args.prefix, result, markdown), end="")
    dist.destroy_process_group()


def summary(args: argparse.Namespace, per_rank: list[list[dict]]) -> dict:
    """Every rank's rounds: counts must be exact, values within TOLERANCE."""
    rows = []
    for rank, rounds in enumerate(per_rank):
        for number, checks in enumerate(rounds, start=1):
            exact = all(checks[key][0] == checks[key][1] for key in COUNTS)
            close = all(checks[key] <= TOLERANCE for key in ERRORS)
            rows.append({"rank": rank, "round": number, **checks, "ok": exact and close})
    return {
        "date": report.timestamp(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "ranks": args.ranks,
        "shape": {"tokens": args.tokens, "hidden": args.hidden, "experts": args.experts, "topk": args.topk},
        "tolerance": TOLERANCE,
        "rows": rows,
        "ok": all(row["ok"] for row in rows),
    }


def markdown(result: dict) -> str:
    shape = result["shape"]
    lines = [
        f"# DeepEP dispatch and combine through megatron-core, {result['date']}",
        "",
        f"{result['ranks']} ranks on {len(result['gpus'])} GPU(s) ({', '.join(sorted(set(result['gpus'])))}); per rank "
        f"{shape['tokens']} tokens, hidden {shape['hidden']}, {shape['experts']} experts, top-{shape['topk']}; "
        f"tolerance {result['tolerance']}. Counts: received (got, expected); tokens per local expert (got, expected).",
        "",
        "| rank | round | received | tokens per expert | combined | grad x | grad probs | seconds | ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['rank']} | {row['round']} | {row['received_tokens']} | {row['tokens_per_expert']} | "
            f"{row['combined_error']:.2e} | {row['grad_x_error']:.2e} | {row['grad_probs_error']:.2e} | "
            f"{row['seconds']:.3f} | {'yes' if row['ok'] else 'NO'} |"
        )
    return "\n".join(lines) + f"\n\nAll checks pass: {'yes' if result['ok'] else 'NO'}.\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prefix", type=Path, help="write PREFIX.json and PREFIX.md")
    parser.add_argument("--ranks", type=int, default=2, choices=(2, 4, 8), help="DeepEP's intranode rank counts")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per rank")
    parser.add_argument("--hidden", type=int, default=512, help="hidden size (the GPU suite's DeepSeek-V2 shape)")
    parser.add_argument("--experts", type=int, default=16, help="routed experts, split evenly over the ranks")
    parser.add_argument("--topk", type=int, default=4, help="experts per token")
    parser.add_argument("--rounds", type=int, default=3, help="dispatch-combine rounds per rank (buffers reused)")
    args = parser.parse_args(argv)
    if args.experts % args.ranks:
        parser.error(f"--experts {args.experts} does not split evenly over --ranks {args.ranks}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("deepep_dispatch.py: no GPU here: DeepEP's kernels need one", file=sys.stderr)
        return 1
    written = report.json_path(args.prefix)
    written.unlink(missing_ok=True)
    torch.multiprocessing.spawn(rank_main, args=(args, free_port()), nprocs=args.ranks)
    return 0 if json.loads(written.read_text())["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
