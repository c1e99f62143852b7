"""One rank of srun.sh's health check (`./srun.sh --health`, or SRUNSH_HEALTH=1 first): started by srun.sh exactly
as a training rank is (`srun.sh --rank-exec`: the same srun step, container, environment and torch.distributed over
the NCCL and network plugin the job uses), it tests its GPU, its node and the network, and records each part in
RUN_DIR/health/rank-R.json as it goes. launcher/health_report.py, on the launching host, enforces each part's
deadline (it stops the step when a rank is stuck past it), and reads these records into the table.

The parts, in order (each one is a collective over the group named, after a barrier of the whole job, so that every
node measures the same part at the same time):
  start              import torch, join torch.distributed (the world), learn every rank's host
  gpu                the GPU of LOCAL_RANK: visible, its free memory, a bf16 matrix-multiply rate, an HBM copy rate
  node.all_reduce    among the ranks of this node (NVLink); then node.broadcast
  pair.K.all_reduce  round K of the pairs of nodes: node i with node i XOR 2^K, so ceil(log2 N) rounds of N/2
                     pairs each, every node with a new partner; then pair.K.broadcast
  job.all_reduce     over the whole job; then job.broadcast
Collectives report bus bandwidth (nccl-tests' definition) at a few message sizes; every rate is the median of a few
samples, with the best sample beside it. Without CUDA the check runs with gloo on the CPU, and the GPU part records
that it does not apply.
"""

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
# Each figure is measured as SAMPLES timings of CALLS calls, after WARMUP calls: its median is the figure, its best
# what the hardware did at least once (launcher/health_report.py compares both, so that noise is not an outlier).
WARMUP, SAMPLES, CALLS = 2, 8, 2
MATMUL_N, MATMUL_CALLS = 8192, 4
COPY_BYTES, COPY_CALLS = 1 << 30, 2


class Record:
    """RUN_DIR/health/rank-R.json, rewritten whole (write, then rename) at every change of part or stage."""

    def __init__(self, path: Path, identity: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**identity, "part": None, "stage": None, "group": None, "results": {}}
        self.data.update(error=None, finished=False)
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

    def fail(self, error: BaseException) -> None:
        self.data["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
        self.write()

    def finish(self) -> None:
        self.data.update(part=None, stage=None, group=None, finished=True)
        self.write()


def node_ranks(hosts: list[str]) -> list[list[int]]:
    """Ranks by host, hosts in the order of their first rank."""
    nodes: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        nodes.setdefault(host, []).append(rank)
    return list(nodes.values())


def pair_rounds(nodes: int, node: int) -> Iterator[tuple[int, int | None]]:
    """(round, partner) of `node` in every round: round K pairs node i with node i XOR 2^K; None when that node
    does not exist (with a node count that is not a power of two)."""
    for round_ in range(math.ceil(math.log2(nodes)) if nodes > 1 else 0):
        partner = node ^ (1 << round_)
        yield round_, partner if partner < nodes else None


def round_pairs(nodes: int, round_: int) -> list[tuple[int, int]]:
    """Every pair of nodes of a round, in one order for every rank."""
    return [(node, node ^ (1 << round_)) for node in range(nodes) if node < node ^ (1 << round_) < nodes]


def rates(work: float, samples: list[float]) -> tuple[float, float]:
    """(median, best) of work per second over the samples' seconds."""
    return work / statistics.median(samples), work / min(samples)


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' bus bandwidth: what each link carries, comparable across group sizes."""
    return 2 * (ranks - 1) / ranks if op == "all_reduce" else 1.0


class Check:
    """The parts of the check on this rank, in order."""

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
        result["matmul_tflops"], result["matmul_tflops_best"] = self.matmul_rate()
        self.record.stage("hbm copy")
        result["hbm_tb_s"], result["hbm_tb_s_best"] = self.copy_rate()
        self.record.done(result)

    def timed(self, work: Callable[[], object], calls: int) -> list[float]:
        """Seconds per call of work, SAMPLES times over `calls` calls each, after WARMUP calls."""
        for _ in range(WARMUP):
            work()
        self.synchronize()
        samples = []
        for _ in range(SAMPLES):
            started = time.perf_counter()
            for _ in range(calls):
                work()
            self.synchronize()
            samples.append((time.perf_counter() - started) / calls)
        return samples

    def matmul_rate(self) -> tuple[float, float]:
        torch, n = self.torch, MATMUL_N
        a, b = (torch.randn(n, n, dtype=torch.bfloat16, device=self.device) for _ in range(2))
        return rates(2 * n**3 / 1e12, self.timed(lambda: torch.matmul(a, b), MATMUL_CALLS))

    def copy_rate(self) -> tuple[float, float]:
        source = self.torch.empty(COPY_BYTES, dtype=self.torch.uint8, device=self.device)
        target = self.torch.empty_like(source)
        return rates(2 * COPY_BYTES / 1e12, self.timed(lambda: target.copy_(source), COPY_CALLS))  # read + write

    def collectives(self, prefix: str, ranks: list[int] | None, group: object, extra: dict[str, Any]) -> None:
        """`prefix`.all_reduce, then `prefix`.broadcast, among `ranks` (group None: the world); ranks None: this rank
        sits the part out, but joins its barriers."""
        for op in ("all_reduce", "broadcast"):
            # Every node measures the same part at the same time: each sees the network as loaded as the others do.
            self.record.enter(f"{prefix}.{op}", list(range(self.dist.get_world_size())), stage="barrier")
            self.dist.barrier()
            if ranks is None:
                continue
            self.record.enter(f"{prefix}.{op}", ranks)
            median, best = {}, {}
            for size in self.sizes:
                median[str(size)], best[str(size)] = self.bus_bandwidth(op, size, ranks, group)
            self.record.done({**extra, "ranks": ranks, "busbw_gb_s": median, "busbw_gb_s_best": best})

    def bus_bandwidth(self, op: str, size: int, ranks: list[int], group: object) -> tuple[float, float]:
        dist = self.dist
        tensor = self.torch.zeros(size // 4, dtype=self.torch.float32, device=self.device)
        if op == "all_reduce":
            samples = self.timed(lambda: dist.all_reduce(tensor, group=group), CALLS)
        else:
            samples = self.timed(lambda: dist.broadcast(tensor, src=ranks[0], group=group), CALLS)
        return rates(size * bus_factor(op, len(ranks)) / 1e9, samples)

    def new_groups(self, part: str, groups: list[list[int]], desc: str) -> object | None:
        """This rank's group among `groups`: every rank creates all of them, in one order, as torch asks (gloo's
        groups deadlock when members create overlapping ones in different orders). A rank waits only for the members
        of its own group; creating another is bookkeeping (NCCL connects at the first collective)."""
        own = next((ranks for ranks in groups if self.rank in ranks), None)
        self.record.enter(part, own, stage="group")
        mine = None
        for ranks in groups:
            group = self.dist.new_group(ranks, group_desc=desc)
            mine = group if ranks is own else mine
        return mine

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
        for round_, partner in pair_rounds(len(nodes), mine):
            pairs = [sorted(nodes[a] + nodes[b]) for a, b in round_pairs(len(nodes), round_)]
            group = self.new_groups(f"pair.{round_}.all_reduce", pairs, f"health pair round {round_}")
            ranks = sorted(nodes[mine] + nodes[partner]) if partner is not None else None
            self.collectives(f"pair.{round_}", ranks, group, {"partner": hosts[nodes[partner][0]]} if ranks else {})
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
