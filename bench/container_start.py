"""What a container start costs on a pyxis cluster: run it inside an allocation of the nodes to measure.

    salloc -N 2 python3 bench/container_start.py PREFIX --image /fsx/images/megatron.sqsh [--repeats 3]

For each way pyxis can start srun.sh's ranks it times, on every node of the allocation at once:
  - a bare container step, `srun --container-image=IMAGE true` (pyxis's own start, nothing of srun.sh's),
  - an srun.sh launch until the first line of any rank (`./srun.sh recipes/tiny_gpt_pretrain.py`; the launch is then
    stopped): what a user waits before Python speaks.
The ways: pyxis's unnamed container (an unpack at every step, or with `use_squashfuse=1` in pyxis's plugstack line
a start from the squash file; the cluster's setting decides, and the table says which it read), and a named container,
its first step (the unpack) and a later one (what SRUNSH_HEALTH=1's training step gets; not with use_squashfuse=1, where
srun.sh names nothing). To compare unpack with squashfuse, run it once with each plugstack setting. The table
names the image's size and its file count (`unsquashfs -s`).
PREFIX.md gets the table, PREFIX.json the figures; PREFIX-runs/ the launches' console logs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.container import plugstack_file, read_pyxis  # noqa: E402

RANK_LINE = re.compile(r"^\d+: ")
LAUNCH_LIMIT_S = 600


def nodes() -> int:
    return int(os.environ["SLURM_JOB_NUM_NODES"])


def image_files(image: Path) -> str:
    """The image's inode count, as unsquashfs reads it from the superblock; n/a without squashfs-tools."""
    try:
        out = subprocess.run(["unsquashfs", "-s", str(image)], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "n/a"
    match = re.search(r"Number of inodes (\d+)", out)
    return f"{int(match[1]):,}" if match else "n/a"


def container_step(image: Path, name: str) -> float:
    """Seconds of `srun --container-image=IMAGE [--container-name=NAME] true` on every node."""
    command = ["srun", f"--nodes={nodes()}", f"--ntasks={nodes()}", "--ntasks-per-node=1", "--overlap"]
    command += [f"--container-image={image}", *([f"--container-name={name}"] if name else []), "true"]
    started = time.monotonic()
    subprocess.run(command, check=True, timeout=LAUNCH_LIMIT_S)
    return time.monotonic() - started


def first_rank_line(image: Path, name: str, log: Path, extra_env: dict[str, str]) -> float:
    """Seconds from starting srun.sh to the first line of any rank; the launch is stopped then."""
    env = {
        **os.environ,
        "SRUNSH_SQSH": str(image),
        "SRUNSH_CONTAINER_NAME": name,
        "SRUNSH_HANG_TIMEOUT_S": "off",
        **extra_env,
    }
    command = [str(REPO / "srun.sh"), "recipes/tiny_gpt_pretrain.py", "train.train_iters=2"]
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        seconds = None
        for line in proc.stdout:
            out.write(f"{time.monotonic() - started:9.3f} {line}")
            if seconds is None and RANK_LINE.match(line):
                seconds = time.monotonic() - started
                proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=LAUNCH_LIMIT_S)
    if seconds is None:
        raise RuntimeError(f"no rank line from {shlex.join(command)}: see {log}")
    return seconds


def remove_named(name: str) -> None:
    every_node = ["srun", f"--nodes={nodes()}", f"--ntasks={nodes()}", "--ntasks-per-node=1", "--overlap"]
    subprocess.run([*every_node, "enroot", "remove", "-f", f"pyxis_{name}"], check=True)


def measure(image: Path, repeats: int, runs: Path, extra_env: dict[str, str], *, arms: list[str], columns: list[str]):
    """Each arm's figures by column: "unnamed", and for "named" its first and a later step."""
    figures: dict[str, dict[str, list[float]]] = {}
    for arm in ["unnamed"] * ("unnamed" in arms) + ["named, first", "named, later"] * ("named" in arms):
        figures[arm] = {column: [] for column in columns}
    for repeat in range(repeats):
        if "unnamed" in arms:
            if "step" in columns:
                figures["unnamed"]["step"].append(container_step(image, ""))
            if "launch" in columns:
                log = runs / f"unnamed-{repeat}.log"
                figures["unnamed"]["launch"].append(first_rank_line(image, "", log, extra_env))
        for column in columns if "named" in arms else ():
            name = f"bench-{os.getpid()}-{repeat}-{column}"
            for arm in ("named, first", "named, later"):
                if column == "step":
                    seconds = container_step(image, name)
                else:
                    seconds = first_rank_line(image, name, runs / f"{arm[-5:]}-{repeat}.log", extra_env)
                figures[arm][column].append(seconds)
            remove_named(name)
    return figures


def table(image: Path, start_path: str, figures: dict[str, dict[str, list[float]]]) -> str:
    size = f"{image.stat().st_size / 1e9:.2f} GB"
    lines = [
        f"Image {image} ({size} squashed, {image_files(image)} files); {nodes()} node(s); pyxis: {start_path}.",
        "",
        "| container | container step `true`, s (median; all) | srun.sh launch to first rank line, s (median; all) |",
        "|---|---|---|",
    ]
    for arm, columns in figures.items():
        cells = [
            f"{statistics.median(v):.1f} ({', '.join(f'{x:.1f}' for x in v)})" if v else "not run"
            for v in (columns.get("step", []), columns.get("launch", []))
        ]
        lines.append(f"| {arm} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", type=Path)
    parser.add_argument("--image", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", default="unnamed,named", help="unnamed, named (its first and a later step)")
    parser.add_argument("--columns", default="step,launch", help="step (a container step), launch (srun.sh)")
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for srun.sh (SRUNSH_MOUNT=..., SRUNSH_PYTHON=...)"
    )
    args = parser.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.env)
    pyxis = read_pyxis(plugstack_file())
    start_path = "use_squashfuse=1 (unnamed: from the squash file)" if pyxis.squashfuse else "unnamed: unpacked"
    if not pyxis.found:
        start_path += f" (no pyxis line read from {pyxis.file or 'the plugstack configuration'})"
    runs = Path(f"{args.prefix}-runs")
    runs.mkdir(parents=True, exist_ok=True)
    arms = [arm for arm in args.arms.split(",") if arm != "named" or not pyxis.squashfuse]
    columns = args.columns.split(",")
    figures = measure(args.image.resolve(), args.repeats, runs, extra_env, arms=arms, columns=columns)
    text = table(args.image.resolve(), start_path, figures)
    Path(f"{args.prefix}.md").write_text(text)
    Path(f"{args.prefix}.json").write_text(json.dumps({"start_path": start_path, "figures": figures}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
