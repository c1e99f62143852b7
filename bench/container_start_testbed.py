"""bench/container_start.py on the project's test SLURM (tests/slurm_cluster.py) with a real pyxis and enroot.

    python3 bench/container_start_testbed.py PREFIX --pyxis /src/pyxis/spank_pyxis.so --enroot /opt/enroot \\
        --image big.sqsh [--lifecycle-image tiny.sqsh] [--repeats 2]

pyxis and enroot are built from their sources beforehand (docs/containers.md says how); --enroot is enroot's install
prefix. Every node keeps its enroot data, cache and runtime folders, and pyxis its runtime_path, on its own disk.
The benchmark runs twice, under pyxis's default plugstack line and with use_squashfuse=1: PREFIX-unpack.md and
PREFIX-squashfuse.md. With --lifecycle-image it first runs a SRUNSH_HEALTH=1 launch (ranks: this host's Python through
identity mounts) and records, per node, how often pyxis created a container and what enroot lists afterwards.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.slurm_cluster import NODES, SlurmCluster, running_cluster  # noqa: E402

VENV_PYTHON = Path(sys.executable)


def enroot_config(prefix: Path, where: Path) -> None:
    """The enroot build's configuration: its data on each node's own folder (enroot expands $(hostname) per node)."""
    data = where / "enroot-nodes" / "$(hostname)"
    (prefix / "etc" / "enroot" / "enroot.conf").write_text(
        "".join(f"ENROOT_{key}_PATH {data}/{key.lower()}\n" for key in ("DATA", "CACHE", "RUNTIME"))
        + "ENROOT_TEMP_PATH /tmp\n"
    )


def use_pyxis(cluster: SlurmCluster, plugin: Path, options: str) -> None:
    for host in cluster.hosts.values():
        (host.local / "pyxis").mkdir(exist_ok=True)
    line = f"required {plugin} runtime_path={cluster.root}/local/pyxis {options}\n"
    (cluster.root / "plugstack.conf").write_text(line)


def lifecycle(cluster: SlurmCluster, image: Path, where: Path, out: Path) -> None:
    """A SRUNSH_HEALTH=1 launch under the real pyxis; pyxis's 'creating' notes and enroot's list on each node after
    it."""
    world = where / "lifecycle"
    world.mkdir(exist_ok=True)
    (world / "recipe.py").write_text("")
    venv, pyenv = Path(sys.prefix).resolve(), VENV_PYTHON.resolve().parent.parent
    env = {
        **cluster.env,
        "SRUNSH_SQSH": str(image),
        "SRUNSH_HEALTH": "1",
        "SRUNSH_GPUS_PER_NODE": "1",
        "CUDA_VISIBLE_DEVICES": "0",
        "SRUNSH_MOUNT": f"{REPO}:{REPO},{world}:{world},{venv}:{venv},{pyenv}:{pyenv}",
        "SRUNSH_PYTHON": str(REPO / "tests" / "fixtures" / "fake_python"),
        "FAKE_RECORD_DIR": str(world),
        "PATH": f"{VENV_PYTHON.parent}:{cluster.env['PATH']}",
    }
    launch = cluster.run(
        ["salloc", "-N2", "--gpus-per-node=1", str(REPO / "srun.sh"), "recipe.py"], 300, env=env, cwd=world
    )
    listed = cluster.run(["salloc", "-N2", "srun", "-N2", "--ntasks-per-node=1", "enroot", "list"], 60)
    created = {
        node: (cluster.hosts[node].local / "slurmd.log").read_text().count("pyxis: creating container filesystem")
        for node in NODES
    }
    out.write_text(
        f"srun.sh exit status {launch.returncode}\n{launch.stderr}\n"
        f"pyxis 'creating container filesystem' notes per node: {created}\n"
        f"enroot list on the nodes afterwards: {listed.stdout.split()}\n"
    )


def pyxis_timings(cluster: SlurmCluster, out: Path) -> None:
    """pyxis's own account of each container start (slurmd's log of each node), so far."""
    notes = ("creating container filesystem", "completed container setup", "starting container", "reusing existing")
    lines = []
    for node in NODES:
        for line in (cluster.hosts[node].local / "slurmd.log").read_text().splitlines():
            if any(note in line for note in notes):
                lines.append(f"{node} {line}")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix", type=Path)
    parser.add_argument("--pyxis", type=Path, required=True)
    parser.add_argument("--enroot", type=Path, required=True)
    parser.add_argument("--image", type=Path, help="the image to benchmark; without it, only --lifecycle-image")
    parser.add_argument("--lifecycle-image", type=Path)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", default="unpack,squashfuse", help="pyxis's plugstack settings to run under")
    parser.add_argument("--bench-args", default="", help="more arguments of container_start.py, e.g. --arms=named")
    args = parser.parse_args()
    where = Path(f"{args.prefix}-testbed").resolve()
    where.mkdir(parents=True, exist_ok=True)
    enroot_config(args.enroot, where)
    os.environ.pop("SRUNSH_CONTAINER_NAME", None)  # srun.sh's knob, if this host's environment happens to have it
    os.environ["PATH"] = f"{args.enroot / 'bin'}:{os.environ['PATH']}"
    with running_cluster(node_addr=True) as cluster:
        (where / "outputs").mkdir(exist_ok=True)
        if args.lifecycle_image:
            use_pyxis(cluster, args.pyxis, "")
            lifecycle(cluster, args.lifecycle_image.resolve(), where, Path(f"{args.prefix}-lifecycle.txt"))
        configs = {"unpack": "", "squashfuse": "use_squashfuse=1"}
        for label in args.configs.split(",") if args.image else ():
            options = configs[label]
            use_pyxis(cluster, args.pyxis, options)
            bench = [sys.executable, str(REPO / "bench" / "container_start.py"), f"{args.prefix}-{label}"]
            bench += ["--image", str(Path(args.image).resolve()), "--repeats", str(args.repeats)]
            bench += args.bench_args.split()
            for name, value in (
                ("SRUNSH_MOUNT", f"{REPO}:/workspace/megatron,{where}:{where}"),
                ("SRUNSH_OUTPUT_ROOT", f"{where}/outputs"),
                ("SRUNSH_PYTHON", str(Path(sys.prefix).resolve() / "bin" / "python")),  # the image holds this venv
                ("SRUNSH_GPUS_PER_NODE", "1"),
                ("CUDA_VISIBLE_DEVICES", "0"),
            ):
                bench += ["--env", f"{name}={value}"]
            result = cluster.run(["salloc", "-N2", "--gpus-per-node=1", *bench], 3000, cwd=REPO)
            print(result.stdout, result.stderr[-3000:], flush=True)
            pyxis_timings(cluster, Path(f"{args.prefix}-{label}-pyxis.txt"))


if __name__ == "__main__":
    main()
