"""launcher/host/notes.py against the GNU sed filter it replaced (srun.sh's keep_launcher_notes until 2026-12-02),
on lines srun, slurmstepd, pyxis and torchrun print and on lines hypothesis draws."""

import io
import subprocess
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.host.notes import pass_on

ONLY = (
    r"^(srun: error: [^ ]+: tasks? [0-9,-]+: (Exited with exit code [0-9]+|Terminated|Killed)$"
    r"|slurmstepd(-[^:]+)?: |srun: (launch/slurm: _step_signal: Terminating StepId|Job step aborted"
    r"|forcing job termination|Force Terminated|got SIGCONT|error: (pyxis|spank)))"
)
SED = {
    "1": ["sed", "-u", "-E", "-e", r"/^([0-9]+|srun\.sh): /!{w /dev/stderr", "-e", "d}"],
    "0": ["sed", "-u", "-E", "-e", f"\\#{ONLY}#{{w /dev/stderr", "-e", "d}", "-e", "/^srun: /w /dev/stderr"],
}
# Lines as SLURM 24.11, pyxis 0.24 and torchrun print them.
SEEN = [
    "srun: error: node2: task 5: Exited with exit code 3",
    "srun: error: node1: tasks 0-3: Terminated",
    "srun: error: node1: tasks 0,2: Killed",
    "slurmstepd: error: *** STEP 33.1 ON node1 CANCELLED AT 2026-12-01T20:11:05 ***",
    "slurmstepd-node2: error: *** STEP 33.1 ON node2 CANCELLED AT 2026-12-01T20:11:05 ***",
    "srun: launch/slurm: _step_signal: Terminating StepId=33.1",
    "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
    "srun: forcing job termination",
    "srun: Force Terminated StepId=33.1",
    "srun: got SIGCONT",
    "srun: error: pyxis: container start failed with error code: 1",
    "srun: error: spank: required plugin spank_pyxis.so: init() failed with rc=-1",
    "srun: job 33 queued and waiting for resources",
    "srun: error: Unable to create step for job 33: Requested node configuration is not available",
    "pyxis: imported docker image: /fsx/images/megatron.sqsh",
    "0: iteration        1/      20 | consumed samples:           32",
    "srun.sh: rank 5 on node2 failed first (exit status 3)",
    "W1201 20:11:05.123000 4242 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 4243 closing"
    " signal SIGTERM",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "",
    "\u00e9t\u00e9 \x1b[31mred\x1b[0m",
]


def run(command: list[str], lines: bytes, tmp_path: Path) -> tuple[bytes, bytes]:
    log = tmp_path / "log"
    log.write_bytes(b"")
    with log.open("ab") as sink:
        done = subprocess.run(command, input=lines, stdout=subprocess.PIPE, stderr=sink, check=True, timeout=60)
    return done.stdout, log.read_bytes()


def ours(local: str, lines: bytes, tmp_path: Path) -> tuple[bytes, bytes]:
    log = tmp_path / "ours.log"
    log.write_bytes(b"")
    console = io.BytesIO()
    with log.open("ab") as sink:
        pass_on(io.BytesIO(lines), console.write, sink, local == "1")
    return console.getvalue(), log.read_bytes()


def test_the_lines_srun_slurmstepd_pyxis_and_torchrun_print_go_where_the_sed_filter_sent_them(tmp_path):
    lines = "".join(f"{line}\n" for line in SEEN).encode()
    for local in ("0", "1"):
        assert ours(local, lines, tmp_path) == run(SED[local], lines, tmp_path)
    console, log = ours("0", lines, tmp_path)
    assert b"srun: error: node2: task 5: Exited with exit code 3" in log
    assert b"srun: error: node2: task 5" not in console
    assert b"srun: job 33 queued and waiting for resources\n" in console and b"queued" in log


words = st.sampled_from(
    [
        "srun:",
        "error:",
        "slurmstepd:",
        "slurmstepd-n1:",
        "0:",
        "12:",
        "srun.sh:",
        "task",
        "tasks",
        "0-3:",
        "Killed",
        "Terminated",
        "pyxis",
        "spank",
        "got",
        "SIGCONT",
        "x",
        "é",
    ]
)
line = st.lists(words, max_size=8).map(" ".join) | st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=40
)


@settings(max_examples=60, deadline=None)
@given(st.lists(line, max_size=12), st.sampled_from(["0", "1"]))
def test_any_lines_go_where_the_sed_filter_sent_them(tmp_path_factory, lines, local):
    tmp_path = tmp_path_factory.mktemp("notes")
    data = "".join(f"{one}\n" for one in lines).encode()
    assert ours(local, data, tmp_path) == run(SED[local], data, tmp_path)
