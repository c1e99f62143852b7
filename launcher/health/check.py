"""One rank of srun.sh's health check, run as launcher/health.py as a training rank is (docs/health.md)."""

import json
import math
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

GPU_SIZES = (64 << 10, 4 << 20, 256 << 20)  # bytes: latency-bound, mid, bandwidth-bound
CPU_SIZES = (16 << 10, 256 << 10, 1 << 20)  # gloo on a CPU: small enough to stay quick
# Each figure: SAMPLES timings of CALLS calls after WARMUP, the median and the best (docs/health.md).
WARMUP, SAMPLES, CALLS = 2, 8, 2
MATMUL_N, MATMUL_CALLS = 8192, 4
COPY_BYTES, COPY_CALLS = 1 << 30, 2
Pair = tuple[int, int]  # two nodes, by their index in the job, the lower first
Rates = tuple[float, float, list[float]]  # median, best, every sample
# A record's group of a part that every rank of the job is in, rather than 4,096 lists of 4,096 ranks.
JOB = None
SUSPECT = 0.9  # a node whose best pair is below 90% of the nodes' median is retested (judge.OUTLIER)
# Enough retests that the report's rank test rules out noise (docs/health.md, "In the code").
RETEST_CYCLES = 6
RETEST_SAMPLES = 16  # a retest's best sample is what the link did when nothing else got in the way (noise only slows)


class Record:
    """RUN_DIR/health/rank-R.json, rewritten whole (write, then rename) at every change of part or stage."""

    def __init__(self, path: Path, identity: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**identity, "part": None, "stage": None, "group": None, "results": {}}
        self.data |= {"error": None, "finished": False}
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self) -> None:
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(self.data))
        os.replace(temporary, self.path)

    def enter(self, part: str, group: list[int] | None = None, stage: str = "running") -> None:
        if part != self.data["part"]:
            self.data["since"] = time.time()
        self.data.update(part=part, group=group, stage=stage)
        self.write()

    def stage(self, stage: str) -> None:
        self.data["stage"] = stage
        self.write()

    def done(self, result: dict[str, Any]) -> None:
        seconds = round(time.time() - self.data["since"], 3)
        self.data["results"][self.data["part"]] = {**result, "seconds": seconds}
        self.write()

    def finish(self) -> None:
        self.data.update(part=None, stage=None, group=None, finished=True)
        self.write()

    def fail(self, error: BaseException) -> None:
        self.data["error"] = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
        self.write()


def node_ranks(hosts: list[str]) -> list[list[int]]:
    """Ranks by host, hosts in the order of their first rank."""
    nodes: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        nodes.setdefault(host, []).append(rank)
    return list(nodes.values())


def pair_rounds(nodes: int, node: int) -> Iterator[tuple[int, int | None]]:
    """(round, partner) of `node` in every round; partner None where node XOR 2^round is past the last node."""
    for round_ in range(math.ceil(math.log2(nodes)) if nodes > 1 else 0):
        partner = node ^ (1 << round_)
        yield round_, partner if partner < nodes else None


def round_pairs(nodes: int, round_: int) -> list[Pair]:
    return [(node, node ^ (1 << round_)) for node in range(nodes) if node < node ^ (1 << round_) < nodes]


def ordered(a: int, b: int) -> Pair:
    return min(a, b), max(a, b)


def pair_ranks(nodes: list[list[int]], a: int, b: int) -> list[int]:
    return sorted(nodes[a] + nodes[b])


def rates(work: float, samples: list[float]) -> Rates:
    return work / statistics.median(samples), work / min(samples), [round(work / sample, 6) for sample in samples]


def best_pairs(pairs: dict[Pair, float]) -> dict[int, tuple[float, int]]:
    """Each node's best pair, (figure, partner), of the pairs measured {(node, node): figure}."""
    best: dict[int, tuple[float, int]] = {}
    for (a, b), figure in sorted(pairs.items()):
        for node, partner in ((a, b), (b, a)):
            if node not in best or figure > best[node][0]:
                best[node] = (figure, partner)
    return best


def suspects(best: dict[int, tuple[float, int]]) -> list[int]:
    if len(best) < 3:  # a pair's two nodes share its figure
        return []
    middle = statistics.median(figure for figure, _ in best.values())
    return sorted(node for node, (figure, _) in best.items() if figure < SUSPECT * middle)


def retest_plan(flagged: dict[str, dict[int, tuple[float, int]]]) -> list[list[tuple[int, str, Pair]]]:
    """The retests of every suspect as steps of (suspect, role, pair) whose pairs share no node."""
    found = {op: suspects(best) for op, best in flagged.items()}
    measurements = []
    for _ in range(RETEST_CYCLES):
        for suspect in sorted({node for nodes in found.values() for node in nodes}):
            best = flagged[next(op for op, nodes in found.items() if suspect in nodes)]
            same = best[suspect][1]
            other = max((figure, node) for node, (figure, _) in best.items() if node not in (suspect, same))[1]
            for role, partner in (("same", same), ("other", other)):
                measurements.append((suspect, "reference", ordered(same, other)))
                measurements.append((suspect, role, ordered(suspect, partner)))
    steps: list[list[tuple[int, str, Pair]]] = []
    for measurement in measurements:  # into the last step unless a node of its pair is busy there
        if steps and not any(set(measurement[2]) & set(pair) for _, _, pair in steps[-1]):
            steps[-1].append(measurement)
        else:
            steps.append([measurement])
    return steps


class Check:
    def __init__(self, record: Record, rank: int, local_rank: int) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.record, self.rank, self.local_rank = record, rank, local_rank
        self.cuda = torch.cuda.is_available()
        self.device = torch.device("cuda", local_rank) if self.cuda else torch.device("cpu")
        self.sizes = GPU_SIZES if self.cuda else CPU_SIZES

    def synchronize(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def start(self) -> list[str]:
        self.record.stage("rendezvous")
        if self.cuda:
            self.torch.cuda.set_device(self.device)
        self.dist.init_process_group("nccl" if self.cuda else "gloo")
        hosts: list[Any] = [None] * self.dist.get_world_size()
        self.dist.all_gather_object(hosts, socket.gethostname())
        self.record.done({"backend": self.dist.get_backend(), "world_size": len(hosts)})
        return hosts

    def gpu(self) -> None:
        if not self.cuda:
            self.record.done({"applicable": False, "why": "no CUDA device: the check runs with gloo on the CPU"})
            return
        torch = self.torch
        properties = torch.cuda.get_device_properties(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        result = {"applicable": True, "visible": torch.cuda.device_count(), "device": self.local_rank}
        result.update(name=properties.name, uuid=str(properties.uuid), free_gib=free / 2**30, total_gib=total / 2**30)
        self.record.stage("matmul")
        result["matmul_tflops"], result["matmul_tflops_best"], result["matmul_tflops_samples"] = self.matmul_rate()
        self.record.stage("hbm copy")
        result["hbm_tb_s"], result["hbm_tb_s_best"], result["hbm_tb_s_samples"] = self.copy_rate()
        self.record.done(result)

    def timed(self, work: Callable[[], object], calls: int, count: int = SAMPLES) -> list[float]:
        for _ in range(WARMUP):
            work()
        self.synchronize()
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            for _ in range(calls):
                work()
            self.synchronize()
            samples.append((time.perf_counter() - started) / calls)
        return samples

    def matmul_rate(self) -> Rates:
        torch, n = self.torch, MATMUL_N
        a, b = (torch.randn(n, n, dtype=torch.bfloat16, device=self.device) for _ in range(2))
        return rates(2 * n**3 / 1e12, self.timed(lambda: torch.matmul(a, b), MATMUL_CALLS))

    def copy_rate(self) -> Rates:
        source = self.torch.empty(COPY_BYTES, dtype=self.torch.uint8, device=self.device)
        target = self.torch.empty_like(source)
        return rates(2 * COPY_BYTES / 1e12, self.timed(lambda: target.copy_(source), COPY_CALLS))  # read + write

    def collectives(
        self, prefix: str, ranks: list[int] | None, group: object, extra: dict[str, Any], retest: bool = False
    ) -> dict[str, float]:
        """`prefix`.all_reduce and .broadcast among `ranks`: {op: the median at the largest size, "op best"}."""
        sizes, count = (self.sizes[-1:], RETEST_SAMPLES) if retest else (self.sizes, SAMPLES)
        largest = {}
        for op in ("all_reduce", "broadcast"):
            # Every node measures the same part at the same time: each sees the network as loaded as the others do.
            self.record.enter(f"{prefix}.{op}", JOB, stage="barrier")
            self.dist.barrier()
            if ranks is None:
                continue
            recorded = JOB if len(ranks) == self.dist.get_world_size() else ranks
            self.record.enter(f"{prefix}.{op}", recorded)
            median, best = {}, {}
            for size in sizes:  # ascending: the samples kept are the largest size's
                median[str(size)], best[str(size)], samples = self.bus_bandwidth(op, size, ranks, group, count)
            largest[op], largest[f"{op} best"] = median[str(sizes[-1])], best[str(sizes[-1])]
            result = {"ranks": recorded, "busbw_gb_s": median, "busbw_gb_s_best": best, "busbw_gb_s_samples": samples}
            self.record.done({**extra, **result})
        return largest

    def bus_bandwidth(self, op: str, size: int, ranks: list[int], group: object, count: int) -> Rates:
        dist = self.dist
        tensor = self.torch.zeros(size // 4, dtype=self.torch.float32, device=self.device)
        if op == "all_reduce":
            samples = self.timed(lambda: dist.all_reduce(tensor, group=group), CALLS, count)
        else:
            samples = self.timed(lambda: dist.broadcast(tensor, src=ranks[0], group=group), CALLS, count)
        factor = 2 * (len(ranks) - 1) / len(ranks) if op == "all_reduce" else 1.0  # nccl-tests' bus bandwidth
        return rates(size * factor / 1e9, samples)

    def new_groups(self, part: str, groups: list[list[int]], desc: str) -> object | None:
        """This rank's group among `groups`: every rank creates all of them in one order, as torch asks."""
        own = next((ranks for ranks in groups if self.rank in ranks), None)
        self.record.enter(part, own, stage="group")
        made = [self.dist.new_group(ranks, group_desc=desc) for ranks in groups]
        return made[groups.index(own)] if own else None

    def retests(self, nodes: list[list[int]], hosts: list[str], mine: int, measured: dict) -> None:
        """The suspects' retests, planned alike on every rank from all pair figures (docs/health.md)."""
        gathered: list[Any] = [None] * self.dist.get_world_size()
        self.dist.all_gather_object(gathered, measured)
        figures: dict[str, dict[Pair, float]] = {}
        for pairs in gathered:
            for pair, ops in pairs.items():
                for op, figure in ops.items():
                    figures.setdefault(op, {})[pair] = min(figure, figures.get(op, {}).get(pair, figure))
        plan = retest_plan({op: best_pairs(pairs) for op, pairs in figures.items()})
        pairs = sorted({pair for step in plan for _, _, pair in step})
        if pairs:
            self.record.enter("retest.0.all_reduce", None, stage="group")
        # Every rank creates every group, in one order.
        groups = {pair: self.dist.new_group(pair_ranks(nodes, *pair), group_desc="health retest") for pair in pairs}
        name = [hosts[ranks[0]] for ranks in nodes]
        for index, step in enumerate(plan):
            own = next((m for m in step if mine in m[2]), None)
            if own is None:
                self.collectives(f"retest.{index}", None, None, {})
                continue
            suspect, role, (a, b) = own
            extra = {"suspect": name[suspect], "role": role, "pair": [name[a], name[b]]}
            self.collectives(f"retest.{index}", pair_ranks(nodes, a, b), groups[a, b], extra, retest=True)

    def run(self) -> None:
        hosts = self.start()
        self.record.enter("gpu", [self.rank])
        self.gpu()
        nodes = node_ranks(hosts)
        mine = next(index for index, ranks in enumerate(nodes) if self.rank in ranks)
        # Every rank goes through the same parts, in the same order (their barriers are the whole job's).
        node_groups = [ranks for ranks in nodes if len(ranks) > 1]
        if node_groups:
            group = self.new_groups("node.all_reduce", node_groups, "health node")
            self.collectives("node", nodes[mine] if group else None, group, {})
        measured = {}
        for round_, partner in pair_rounds(len(nodes), mine):
            pairs = [pair_ranks(nodes, a, b) for a, b in round_pairs(len(nodes), round_)]
            group = self.new_groups(f"pair.{round_}.all_reduce", pairs, f"health pair round {round_}")
            ranks = pair_ranks(nodes, mine, partner) if partner is not None else None
            extra = {"partner": hosts[nodes[partner][0]]} if ranks else {}
            figures = self.collectives(f"pair.{round_}", ranks, group, extra)
            if partner is not None:
                measured[ordered(mine, partner)] = figures
        if len(nodes) > 2:
            self.retests(nodes, hosts, mine, measured)
        if len(nodes) > 1:
            self.collectives("job", list(range(len(hosts))), None, {})
        self.dist.destroy_process_group()
        self.record.finish()


def main() -> int:
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    identity = {"rank": rank, "local_rank": local_rank, "host": socket.gethostname(), "pid": os.getpid()}
    record = Record(Path(os.environ["RUN_DIR"]) / "health" / f"rank-{rank}.json", identity)
    record.enter("start", stage="importing torch")
    check = Check(record, rank, local_rank)
    try:
        check.run()
    except RuntimeError as error:  # torch's own: CUDA, NCCL and gloo errors, out of memory
        record.fail(error)
        print(f"health.py: rank {rank}: {record.data['part']} failed: {record.data['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
