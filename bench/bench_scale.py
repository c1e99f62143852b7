"""What the launching host does for a job of N ranks (8 a node), timed on the run folder such a job leaves: no GPU,
no cluster. For each N, bench/scale_tree.py writes the records N ranks leave, with the writers a real run uses; then
each host step (STEPS) runs on them as one process, with its seconds, CPU seconds and peak memory (its own and its
children's), less what it waits for that is not its work (the health check's launch, the ranks' answers): the health
and the hang report (stand-ins move the ranks' records and answers into place; one rank never answers), ./srun.sh in
an allocation of N/8 nodes (srun a stand-in, the launch plan checked), and its console of a start-up whose ranks each
print the same 200 lines (lines counted). Each fault must be named right, as the tests assert it, or the run exits 1.
The growth exponent between sizes, log(t2/t1) / log(N2/N1), is given for the seconds and for the CPU seconds.

The tree of 16,384 ranks takes about 8 GB of disk, 4,096 ranks about 2 GB; each is removed once measured (--keep keeps
them). The host steps run under `python3 -S` (the standard library only, as on a launching host: where torch is
importable, the hang report also runs torchfrtrace, which this does not time); srun.sh runs the python3 on PATH.
SLURM's scontrol must be installed (`show hostnames` needs no controller); a stand-in answers `show config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing import Pool
from pathlib import Path

from bench import report, scale_tree
from bench.scale_health import health_plan, write_health_rank
from bench.scale_host import START_UP as START_UP_TEXT
from bench.scale_tree import PER_NODE, Job, Tree, faults
from launcher import run_files
from launcher.hang.collectives import ranges
from launcher.host.preflight import knob_names

REPO = Path(__file__).resolve().parents[1]
SIZES = (8, 64, 512, 4_096, 16_384)
# Issue 47's limits: seconds at 4,096 ranks. The dry run's 2 s holds the launch, which does all it does and writes the
# launch plan.
LIMITS_S = {"health report": 5.0, "hang report": 15.0, "launch plan written": 2.0}
START_UP, START_UP_LINES, LINES_LIMIT = "console of a start-up", 200, 400  # issue 68: every rank prints the same 200
LIMIT_AT = 4_096
HOST = [sys.executable, "-S", str(REPO / "bench" / "scale_host.py")]
RECIPE = REPO / "recipes" / "llama3_8b_pretrain.py"
HEALTH_END_S = 0.5  # how long the check's launch takes to end after its ranks finished


@dataclasses.dataclass
class Ran:
    """One step's run: exit status, seconds (less what the step set aside), peak memory, and what it said."""

    status: int
    seconds: float
    peak_bytes: int
    stdout: str
    stderr: str
    cpu_seconds: float = 0.0
    set_aside_s: float = 0.0


@dataclasses.dataclass
class World:
    """One size's tree and the world its steps run in."""

    tree: Tree
    job: Job
    args: argparse.Namespace

    def env(self, slurm: bool = False) -> dict[str, str]:
        """This process's environment without SLURM's, srun.sh's and torch's launch variables (and the knobs' old
        names); the stand-ins first on PATH; with SLURM: inside an allocation of the job's nodes."""
        old = {name.removeprefix("SRUNSH_") for name in knob_names()} | {"MASTER_ADDR", "MASTER_PORT"}
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRUNSH_")) and k not in old}
        root, nodes = self.tree.root, self.job.nodes
        env |= {"PATH": f"{root / 'bin'}:{env.get('PATH', '')}", "SLURM_CONF": str(root / "slurm.conf")}
        if slurm:
            env |= {"SLURM_JOB_ID": scale_tree.JOB_ID, "SLURM_JOB_NODELIST": self.job.node_list}
            env |= {"SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes), "SLURM_GPUS_PER_NODE": "8"}
            env |= {"SLURM_JOB_CPUS_PER_NODE": f"96(x{nodes})", "MASTER_ADDR": "10.0.0.1"}
            env |= {"SRUNSH_SQSH": str(root / "image.sqsh"), "SRUNSH_OUTPUT_ROOT": str(root / "outputs")}
            env |= {"SRUNSH_MOUNT": f"{REPO}:/workspace/megatron,{root}:{root}"}
        return env

    def run(self, *command: str, slurm: bool = False, more: dict[str, str] | None = None) -> Ran:
        """COMMAND, timed, with its peak memory, under a memory limit (bench/scale_host.py's measure), less the
        seconds it wrote to $SCALE_SPENT as not its own; killed, with everything it started, past --step-timeout."""
        limit = str(int(self.args.memory_limit_gb * 2**30))
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryDirectory() as temp:
            measured, spent = Path(temp) / "measured.json", Path(temp) / "spent.json"
            spawner = [*HOST, "measure", str(measured), limit, "--", *command]
            env = self.env(slurm) | {"SCALE_SPENT": str(spent)} | (more or {})
            process = subprocess.Popen(
                spawner, stdout=out, stderr=err, env=env, cwd=self.tree.root, start_new_session=True
            )
            try:
                process.wait(timeout=self.args.step_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            said = []
            for file in (out, err):
                file.seek(0)
                said.append(file.read().decode(errors="replace"))
            result = json.loads(read(measured) or '{"status": -9, "seconds": 0, "peak_bytes": 0, "cpu_seconds": 0}')
            aside = json.loads(read(spent) or "0.0")
        seconds, peak, cpu = result["seconds"] - aside, result["peak_bytes"], result["cpu_seconds"]
        return Ran(result["status"], seconds, peak, *said, cpu_seconds=cpu, set_aside_s=aside)


def write_stand_ins(world: World) -> None:
    """scancel (the ranks answer), scontrol (`show config` as a controller answers it; the rest SLURM's own), srun
    (the ranks end at once, or print a start-up), and what srun.sh's allocation needs: a SLURM config, an image."""
    root, tree = world.tree.root, world.tree
    (root / "bin").mkdir(parents=True)
    real, host = shutil.which("scontrol") or "/usr/bin/scontrol", " ".join(HOST)
    stand_ins = {
        "scancel": f"exec {host} answer {tree.staged_answers} {tree.run_dir / 'hang'}\n",
        "scontrol": (
            'if [ "$1 $2" = "show config" ]; then\n'
            f"  printf 'KillWait = 30 sec\\nPlugStackConfig = {root}/plugstack.conf\\n'\n"
            f'  exit 0\nfi\nexec {real} "$@"\n'
        ),
        "srun": f'[ -z "${{SCALE_START_UP:-}}" ] || exec {host} start-up "$SCALE_START_UP" "$@"\nexit 0\n',
    }
    for name, body in stand_ins.items():
        (root / "bin" / name).write_text(f"#!/bin/sh\n# bench/bench_scale.py's stand-in {name}\n{body}")
        (root / "bin" / name).chmod(0o755)
    (root / "slurm.conf").write_text("ClusterName=bench\nSlurmctldHost=localhost\n")
    (root / "plugstack.conf").write_text("required /usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so\n")
    (root / "image.sqsh").write_bytes(b"hsqs" + bytes(60))


# ---- the steps, each run and judged -----------------------------------------------------------------------------
def health_report(world: World) -> tuple[Ran, str]:
    """The one slow node, named as docs/health.md says: its reasons with the fix, the verdict line, failed-nodes."""
    tree, job, host = world.tree, world.job, world.job.slow_host
    launch = [*HOST, "health-launch", str(tree.staged_health), str(tree.run_dir / "health"), str(HEALTH_END_S)]
    ran = world.run(*HOST, "health-report", "--", str(tree.run_dir), "--timeout", "60", "--nodes", ",".join(job.hosts),
                    "--ranks-per-node", str(PER_NODE), "--", *launch)  # fmt: skip
    lines = ran.stdout.splitlines()
    verdict = f"srun.sh: health check failed on 1 of {job.nodes} node(s): {host} (salloc/sbatch --exclude={host});"
    problems = expect(ran.status, 1, "exit status") + expect(lines[-1:], [f"{verdict} {tree.run_dir}/health.json"])
    problems += expect(read(tree.run_dir / "health" / "failed-nodes"), f"{host}\n", "failed-nodes")
    fix = rf"srun\.sh: {host}: (.*): exclude it: --exclude={host}"
    reasons = [found.group(1) for line in lines if (found := re.fullmatch(fix, line))]
    if job.link_fault:
        link = r"pair {} with node\d+ and node\d+ [\d.]+ GB/s is \d+% below node\d+-node\d+'s [\d.]+ \(the median best"
        link += r" sample of 12 and 12 retests\); noise ranks them so in [\d.e-]+ of checks"
        wanted = [link.format("all-reduce"), link.format("broadcast")]
    else:
        wanted = [rf"rank {job.slow_gpu}: bf16 matmul [\d.]+ is 23% below the median [\d.]+"]
    if len(reasons) != len(wanted) or not all(map(re.fullmatch, wanted, reasons)):
        problems += f"reasons {reasons}, not {wanted}; "
    return ran, problems


def hang_report(world: World) -> tuple[Ran, str]:
    """The console's three lines and the report's "not in it" lines, as tests/test_hang_report.py words them."""
    tree, job, path = world.tree, world.job, world.tree.run_dir / "hang-report.txt"
    ran = world.run(*HOST, "hang-report", str(world.args.answer_wait_s), "--", str(tree.run_dir), "--why",
                    scale_tree.why(job), "--world-size", str(job.ranks), "--nodes", ",".join(job.hosts),
                    "--ranks-per-node", str(PER_NODE), "--step", scale_tree.STEP, "--stalled")  # fmt: skip
    missing, silent, node = job.missing, job.silent, job.host(job.silent)
    peers = [rank for rank in range(job.ranks) if job.host(rank) == node and rank != silent]
    waiting = ranges(rank for rank in range(job.ranks) if rank not in (missing, silent))
    said = f"{'rank' if len(peers) == 1 else 'ranks'} {ranges(peers)} on it answered"
    console = [
        f"srun.sh: hang report ({scale_tree.why(job)}): 1 rank(s) did not answer: rank {silent} on {node}"
        f" (pid {4000 + silent}): no answer from node {node} ({said})",
        f"srun.sh:   ranks {waiting} wait in nccl:all_reduce #{2 * (scale_tree.LAST_STEP + 1)} of process group 0"
        f" (default_pg, ranks 0-{job.ranks - 1}); 2 rank(s) not in it",
        f"srun.sh:   every rank's top frames and torch's analysis: {path}",
    ]
    outside = {
        missing: f"    not in it: rank {missing} on {job.host(missing)} (pid {4000 + missing}), last step"
        f" {scale_tree.LAST_STEP}: at {scale_tree.MISSING_AT}",
        silent: f"    not in it: rank {silent} on {node} (pid {4000 + silent}): no answer",
    }
    found = [line for line in read(path).splitlines() if line.startswith("    not in it: ")]
    problems = expect(ran.stderr.splitlines(), console, "console")
    return ran, problems + expect(found, [outside[rank] for rank in sorted(outside)])


def launch_plan_written(world: World) -> tuple[Ran, str]:
    ran = world.run(str(REPO / "srun.sh"), str(RECIPE), "train.train_iters=1000", slurm=True)
    plans = list((world.tree.root / "outputs" / RECIPE.stem).glob("*/launch-plan.json"))
    hosts = json.loads(read(plans[0]) if len(plans) == 1 else "{}").get("hosts")
    return ran, expect(ran.status, 0, "exit status") + expect(hosts, world.job.hosts, "the plan's hosts")


def console_of_a_start_up(world: World) -> tuple[Ran, str]:
    """./srun.sh whose ranks (bench/scale_host.py's srun) each print the same lines: rank 0's shown, once each."""
    ran = world.run(str(REPO / "srun.sh"), str(RECIPE), slurm=True, more={"SCALE_START_UP": str(START_UP_LINES)})
    said = (ran.stdout + ran.stderr).splitlines()
    wanted = sorted(f"0: {START_UP_TEXT[number % 10 == 9]}{number}" for number in range(START_UP_LINES))
    problems = expect(sorted(line for line in said if line.startswith("0: ")), wanted, "rank 0's lines")
    return ran, problems + expect(ran.status, 0, "exit status") + ("" if len(said) < LINES_LIMIT else "too many; ")


STEPS: dict[str, Callable[[World], tuple[Ran, str]]] = {
    "health report": health_report,
    "hang report": hang_report,
    "launch plan written": launch_plan_written,
    START_UP: console_of_a_start_up,
}


def expect(got: object, wanted: object, what: str = "lines") -> str:
    """ "" when GOT is WANTED; else what differs, in a few words."""
    if got == wanted:
        return ""
    if isinstance(got, list) and isinstance(wanted, list):
        differ = [(g, w) for g, w in zip(got, wanted, strict=False) if g != w][:1] or [(got[-1:], wanted[-1:])]
        return (
            f"{what}: {len(got)} of them, not {len(wanted)}; first difference {differ[0][0]!r}, not {differ[0][1]!r}; "
        )
    return f"{what} {str(got)[:300]!r}, not {str(wanted)[:300]!r}; "


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def disk_bytes(root: Path) -> int:
    """What ROOT takes on disk, each file once however many links it has (du's count)."""
    return int(
        subprocess.run(["du", "-s", "-B1", str(root)], capture_output=True, text=True, check=True).stdout.split()[0]
    )


def write_ranks(arguments: tuple[Tree, Job, range, list]) -> None:
    """One worker's share of the ranks: their hang records and their health records."""
    tree, job, ranks, plan = arguments
    for rank in ranks:
        scale_tree.write_hang_rank(tree, job, rank)
        write_health_rank(tree.staged_health, job, rank, plan)


def build(tree: Tree, job: Job) -> None:
    """Every record of the job, the ranks shared among as many processes as there are CPUs."""
    for folder in (tree.run_dir / run_files.HANG / "fr", tree.staged_answers / "fr", tree.staged_health):
        folder.mkdir(parents=True, exist_ok=True)
    scale_tree.write_progress(tree.run_dir, job)
    plan, size = health_plan(job), -(-job.ranks // (4 * (os.cpu_count() or 1)))
    work = [(tree, job, range(start, min(start + size, job.ranks)), plan) for start in range(0, job.ranks, size)]
    with Pool(os.cpu_count()) as pool:
        for _ in pool.imap_unordered(write_ranks, work):
            pass


def measure(job: Job, args: argparse.Namespace) -> dict:
    """Build JOB's tree, run every step on it; the numbers and the verdicts."""
    ranks = job.ranks
    root = Path(tempfile.mkdtemp(prefix=f"bench-scale-{ranks}-", dir=args.work))
    world = World(Tree(root), job, args)
    try:
        started = time.monotonic()
        write_stand_ins(world)
        build(world.tree, job)
        result = {"ranks": ranks, "nodes": job.nodes, "build_s": round(time.monotonic() - started, 1)}
        result |= {"disk_mb": round(disk_bytes(root) / 2**20), "faults": dataclasses.asdict(job), "steps": {}}
        for name, step in STEPS.items():
            ran, wrong = step(world)
            wrong = wrong or ("" if ran.status in (0, 1) else f"exit status {ran.status}; ")
            result["steps"][name] = {
                "seconds": round(ran.seconds, 3), "cpu_s": round(ran.cpu_seconds, 3),
                "set_aside_s": round(ran.set_aside_s, 2),
                "peak_mb": round(ran.peak_bytes / 2**20, 1), "status": ran.status, "wrong": wrong,
                "console_lines": ran.stdout.count("\n") + ran.stderr.count("\n"),
                **({"stderr": ran.stderr[-2000:]} if wrong else {}),
            }  # fmt: skip
            figures = f"{ran.seconds:.2f} s ({ran.cpu_seconds:.2f} s CPU), {ran.peak_bytes / 2**20:.0f} MB"
            print(f"{ranks} ranks: {name}: {figures} {wrong}", flush=True)
        return result
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def growth(sizes: list[dict], figure: str = "seconds") -> dict[str, dict[str, float | None]]:
    """Each step's growth exponent of FIGURE (seconds, or CPU seconds: "cpu_s") between consecutive sizes,
    log(t2/t1) / log(N2/N1): {step: {"N1-N2": exponent}}."""
    found: dict[str, dict[str, float | None]] = {name: {} for name in STEPS}
    for name, (a, b) in itertools.product(STEPS, itertools.pairwise(sizes)):
        t1, t2 = a["steps"][name][figure], b["steps"][name][figure]
        exponent = math.log(t2 / t1) / math.log(b["ranks"] / a["ranks"]) if t1 > 0 and t2 > 0 else None
        found[name][f"{a['ranks']}-{b['ranks']}"] = None if exponent is None else round(exponent, 2)
    return found


def markdown(result: dict) -> str:
    sizes = result["sizes"]
    how = (
        "Each step one process: seconds from its start to its end (less what it waits for the ranks), peak memory"
        f" (its own and its children's). `python3 -m bench.bench_scale`; faults placed by seed {result['seed']}."
    )
    lines = [f"# The launching host at scale, {result['date']}", "", f"{result['host']}. {how}", ""]
    lines += report.table(("step", *(f"{s['ranks']:,} ranks" for s in sizes), f"limit at {LIMIT_AT:,}"))
    for name in STEPS:
        cells = []
        for size in sizes:
            step = size["steps"][name]
            wrong = " **wrong verdict**" if step["wrong"] else ""
            said = f", {step['console_lines']:,} lines" if name == START_UP else ""
            cells.append(f"{step['seconds']:.2f} s ({step['cpu_s']:.2f} s CPU), {step['peak_mb']:.0f} MB{said}{wrong}")
        limit = f"{LINES_LIMIT} lines" if name == START_UP else f"{LIMITS_S[name]:g} s" if name in LIMITS_S else None
        lines.append(report.row([name, *cells, limit]))
    built = [f"{size['build_s']:.0f} s, {size['disk_mb']:,} MB" for size in sizes]
    lines.append(report.row(["tree: build, disk", *built, None]))
    pairs = list(itertools.pairwise(sizes))
    growths = (("seconds", "growth"), ("CPU seconds (other work on the machine does not inflate them)", "cpu_growth"))
    for figure, key in growths if pairs else ():
        lines += ["", f"Growth exponent of the {figure}, log(t2/t1) / log(N2/N1):", ""]
        lines += report.table(("step", *(f"{a['ranks']:,} to {b['ranks']:,}" for a, b in pairs)))
        lines += [report.row([name, *by_pair.values()]) for name, by_pair in result[key].items()]
    wrong = [
        f"{s['ranks']} ranks, {n}: {step['wrong']}" for s in sizes for n, step in s["steps"].items() if step["wrong"]
    ]
    lines += ["", "Verdicts: " + ("; ".join(wrong) if wrong else "every fault named right at every size.")]
    return "\n".join(lines) + "\n"


def host_line() -> str:
    model = next((line.split(":", 1)[1].strip() for line in read(Path("/proc/cpuinfo")).splitlines()
                  if line.startswith("model name")), "CPU")  # fmt: skip
    python = shutil.which("python3") or "python3"
    version = subprocess.run([python, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({model}), {memory:.0f} GB; host steps under {sys.executable} -S; srun.sh's"
        f" python3: {version}"
    )


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = report.parser("bench_scale", __doc__)
    parser.add_argument("--ranks", type=report.positive, action="append", help="a size to measure (a multiple of 8;"
                        f" again for more); default: {', '.join(map(str, SIZES))}")  # fmt: skip
    parser.add_argument("--work", type=Path, help="where the trees are built (default: the system's temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep each tree")
    parser.add_argument("--seed", type=int, default=47, help="where the faults are (default: 47)")
    parser.add_argument("--answer-wait-s", type=float, default=10.0, help="how long the hang report waits for the"
                        " rank that never answers (default: its own, 10 s; never in its seconds)")  # fmt: skip
    parser.add_argument("--memory-limit-gb", type=float, default=8.0, help="address space of a step (default: 8)")
    parser.add_argument("--step-timeout", type=float, default=600.0, help="seconds a step may take (default: 600)")
    args = parser.parse_args(argv)
    args.ranks = sorted(set(args.ranks or SIZES))
    if bad := [size for size in args.ranks if size % PER_NODE]:
        parser.error(f"--ranks {bad[0]}: not a multiple of {PER_NODE} (ranks a node)")
    if args.work:
        args.work.mkdir(parents=True, exist_ok=True)
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    result = {"date": report.timestamp(), "host": host_line(), "seed": args.seed, "sizes": []}
    for ranks in args.ranks:
        result["sizes"].append(measure(faults(ranks, args.seed), args))
        result["growth"] = growth(result["sizes"])
        result["cpu_growth"] = growth(result["sizes"], "cpu_s")
        table = report.write(args.out / "scale", result, markdown)
    print(table)
    wrong = any(step["wrong"] for size in result["sizes"] for step in size["steps"].values())
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
