"""The launch's one process on the launching host: srun.sh hands it the knobs and its arguments, and it checks them,
settles the launch plan, and runs the launch to its end. Standard library only: the host may have no training stack.

    python3 launcher/host/supervisor.py NAME=VALUE... -- [--sbatch SBATCH_OPTION... -- | --batch-job] [options] ...
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

if not __package__:  # run as a script (srun.sh): the repository, two folders up, holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher import run_files, trackers
from launcher.checkpoints import plan as saves
from launcher.errors import UsageError, say
from launcher.hang.watch import watch
from launcher.health.exclude_nodes import exclude
from launcher.host import batch, command, container, goodput
from launcher.host import plan as plans
from launcher.host.batch import BatchJob
from launcher.host.console import Console, shown_ranks
from launcher.host.first_failure import log_end
from launcher.host.first_failure import report as report_failure
from launcher.host.job import resolve_job, take_run
from launcher.host.notes import pass_on
from launcher.host.preflight import REPO, Knobs, parse_options, preflight
from launcher.host.slurm import config, launch_step
from launcher.restart.plan import outcome as inprocess_outcome
from launcher.restart.plan import plan as inprocess_plan

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.1
STARTED = time.time()  # the launch's start, from which its goodput counts


def kill_wait_s() -> int:
    """The cluster's grace period between SIGTERM and SIGKILL (KillWait, "30 sec"); torchrun's 30 s without one."""
    value = config("KillWait")
    return 30 if value is None else int(re.match("[0-9]*", value).group() or 0)


class Step:
    """One launch command, run to its end, its ranks' lines through a Console; `stop` sends its ranks SIGTERM."""

    def __init__(self, command: list[str], log: Path, plan: plans.LaunchPlan) -> None:
        self.command, self.log, self.local = command, log, plan.local
        self.console = Console(shown_ranks(plan.console_ranks, plan.world_size))
        self.process: subprocess.Popen[bytes] | None = None
        self.log_start = 1

    def run(self, each_poll: Callable[[], object] = lambda: None) -> int:
        """Runs the command to its end, calling EACH_POLL in this thread meanwhile."""
        with run_files.private_files():
            log = open(self.log, "ab")  # closed by the notes thread
        self.log_start = log.tell() + 1  # this launch's lines of launcher.log start here
        # torchrun gets a session of its own, so that a terminal's Ctrl-C reaches the ranks once, as srun.sh's SIGTERM.
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=self.local
        )
        readers = [
            threading.Thread(target=keep_notes, args=(self.process.stderr, log, self.local, self.console), daemon=True),
            threading.Thread(target=self.console.pass_on, args=(self.process.stdout, sys.stdout.buffer), daemon=True),
        ]
        for reader in readers:
            reader.start()
        while self.process.poll() is None:
            each_poll()
            self.console.tick()
            time.sleep(POLL_S)
        for reader in readers:
            reader.join()
        self.console.tick(end=True)
        code = self.process.returncode
        return 128 - code if code < 0 else code  # as the shell gives it: 128+N for a signal

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, job_id: str, step_name: str, to_save: bool = False) -> None:
        """SIGTERM to every rank, SIGKILL to what is left after the grace period; TO_SAVE: no SIGKILL, the ranks save
        a checkpoint before the time limit (SLURM kills what is left at the limit)."""
        step = "" if self.local else launch_step(job_id, step_name)
        if not step:  # torchrun, or srun before its step exists (it then cancels its request)
            if self.process is not None and self.alive():
                self.process.send_signal(signal.SIGTERM)
            return
        subprocess.run(["scancel", "--signal=TERM", step], check=False)
        if to_save:
            return
        deadline = time.monotonic() + kill_wait_s()
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        subprocess.run(["scancel", step], stderr=subprocess.DEVNULL, check=False)


def keep_notes(source: BinaryIO, log: BinaryIO, local: bool, console: Console) -> None:
    """What srun or torchrun say, to launcher.log, the console or both (notes.py), in a thread that outlives a stop."""
    with log:
        pass_on(source, lambda line: console.line(line, sys.stderr.buffer), log, local)


class Supervisor:
    """One launch, from its header to its exit status."""

    def __init__(self, plan: plans.LaunchPlan, limit: BatchJob | None, shared_container: str) -> None:
        self.plan, self.limit, self.shared_container = plan, limit, shared_container
        self.job, self.run_dir = os.environ.get("SLURM_JOB_ID", ""), Path(plan.run_dir)
        self.log = self.run_dir / run_files.LAUNCHER_LOG
        self.step: Step | None = None
        self.stopped_by: signal.Signals | None = None
        self.hung = self.hang_report_due = self.training_started = self.goodput_due = False
        if limit is not None:
            limit.on_reach = self.on_time_limit
        for number in STOP_SIGNALS:
            signal.signal(number, self.on_stop_signal)

    # ---- signals ---------------------------------------------------------------------------------------------
    def on_stop_signal(self, number: int, _frame: object) -> None:
        """SIGINT, SIGTERM or SIGHUP: the hang report, then every rank is stopped; srun.sh then exits 128+N."""
        if self.stopped_by:
            return
        self.stopped_by = signal.Signals(number)
        say(f"srun.sh: got {self.stopped_by.name}; sending SIGTERM to every rank")
        self.stop_ranks(f"srun.sh got {self.stopped_by.name}")

    def on_time_limit(self) -> None:
        """A batch job SRUNSH_SAVE_LEAD_S from its time limit: SIGTERM to every rank, on which Megatron Bridge saves a
        checkpoint and stops; before training, the health check runs to its verdict, and the job requeues untrained."""
        assert self.limit is not None  # a batch job's
        if not self.training_started:
            self.limit.say_untrained()
            return
        lead = self.limit.knobs["SRUNSH_SAVE_LEAD_S"]
        say(f"srun.sh: job {self.job} reaches its time limit in {lead}s: SIGTERM to every rank to save and stop")
        self.stop_ranks(f"the job's time limit is {lead}s away", to_save=True)

    def on_stall(self, why: str) -> None:
        """The hang watch found no completed step for too long: the report, then SIGTERM to every rank (exit 124)."""
        if self.stopped_by or self.hung:
            return
        self.hung = True
        self.stop_ranks(why)

    def exit_if_stopped(self) -> None:
        if self.stopped_by:
            raise SystemExit(128 + self.stopped_by)

    def stop_ranks(self, why: str, to_save: bool = False) -> None:
        """The hang report, once a launch and before any rank is signalled (WHY stopped them); SIGTERM to every rank."""
        if self.hang_report_due:
            self.hang_report_due = False
            step = "" if self.plan.local else launch_step(self.job, self.plan.step_name)
            target = ["--step", step] if step else ["--local"]
            if self.hung:
                target.append("--stalled")  # the hang watch's: a stall, not a stop of a job that may be progressing
            if step or self.plan.local:  # no step yet: no rank to ask
                # Whatever its status: a report that could not be written leaves the stop as it is.
                subprocess.run(
                    ["python3", f"{REPO}/launcher/hang/report.py", self.plan.run_dir, "--why", why, "--world-size",
                     str(self.plan.world_size), "--nodes", ",".join(self.plan.hosts), "--ranks-per-node",
                     str(self.plan.ranks_per_node), *target],
                    check=False,
                )  # fmt: skip
        if self.step is not None:
            self.step.stop(self.job, self.plan.step_name, to_save)

    # ---- the launch ------------------------------------------------------------------------------------------
    def run(self) -> int:
        plan = self.plan
        if plan.health:
            self.check_health()
        # No training once a batch job's time limit is near: from here on its USR1 stops the ranks.
        self.training_started = self.limit is None or not self.limit.reached
        status = self.train() if self.training_started else 0
        self.exit_if_stopped()
        if self.hung:
            status = 124  # the hang watch stopped the ranks, and the hang report said why
        elif status and plan.inprocess and inprocess_outcome(self.run_dir) == 0:
            status = 0  # training completed on the ranks that replaced a failed one
        elif status:
            first = report_failure(self.run_dir, self.step.log_start if self.step else 1, plan.local)
            status = status if first is None else first
        if plan.batch_job:
            hung = f"hung: see {plan.run_dir}/hang-report.txt" if self.hung else ""
            status = self.requeue(status, hung) or status
        return status

    def train(self) -> int:
        """The launch, watched for a hang; its status."""
        run_files.remove_tree(self.run_dir / run_files.HANG)  # an earlier launch's records: the ranks register afresh
        stalls: list[str] = []  # the hang watch's thread leaves why here; this one acts on it
        stop_watch = threading.Event()
        if self.plan.hang_timeout_s != "off":
            fixed = float(self.plan.hang_timeout_s) if self.plan.hang_timeout_s else None
            watching = (self.run_dir, fixed, stalls.append, stop_watch)
            threading.Thread(target=watch, args=watching, daemon=True).start()
        self.hang_report_due = self.goodput_due = True
        self.step = Step(command.launch_command(self.plan), self.log, self.plan)
        status = self.step.run(lambda: self.on_stall(stalls[0]) if stalls else None)
        self.hang_report_due = False
        stop_watch.set()
        return status

    def check_health(self) -> None:
        """Returns if all nodes passed and a launch follows; else exits (a batch job requeues without failed nodes)."""
        plan = self.plan
        say(
            f"# srun.sh: health check of {len(plan.hosts)} node(s) x {plan.ranks_per_node} rank(s), each part within"
            f" {plan.health_timeout_s}s (SRUNSH_HEALTH_TIMEOUT_S)"
        )
        result = self.run_dir / run_files.HEALTH_JSON
        result.unlink(missing_ok=True)
        report = ["python3", f"{REPO}/launcher/health/report.py", plan.run_dir, "--timeout", plan.health_timeout_s]
        report += ["--nodes", ",".join(plan.hosts), "--ranks-per-node", str(plan.ranks_per_node), "--"]
        self.step = Step([*report, *command.launch_command(plan, health=True)], self.log, plan)
        status = self.step.run()
        run_files.remove_rank_statuses(plan.run_dir)  # the check's: the launch's own failure report reads these
        self.exit_if_stopped()
        if not result.is_file() or not result.stat().st_size:
            say(f"srun.sh: the health check ended before it judged the nodes; the end of {self.log}:")
            sys.stderr.buffer.write(log_end(self.log))
            raise SystemExit(1)
        if plan.health_only or (status and not plan.batch_job):
            raise SystemExit(status)
        if not status:
            return
        failed = run_files.read_text(self.run_dir / run_files.FAILED_NODES).rstrip("\n")
        # The requeue's SIGTERM reaches this process: ignored from here on, since nothing is left to stop, and a
        # stop would spend the cluster's KillWait before the nodes are excluded.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if self.requeue(status, f"failed the health check{f' on {failed}' if failed else ''}") == 0 and failed:
            exclude(self.job, failed)
        raise SystemExit(status)

    def requeue(self, status: int, reason: str = "") -> int:
        """After a batch job's launch: requeue it when it stopped for its time limit, or failed with retries left.
        0 once it is requeued; otherwise the status to exit with."""
        assert self.limit is not None  # a batch job's
        history, job = self.run_dir / run_files.REQUEUES_LOG, self.job
        if self.limit.reached and self.training_started:
            reason = f"saved before the time limit (exit status {status})"
        elif self.limit.reached:
            reason = reason or "its time limit came before training started"
        elif status and not self.stopped_by:
            failures = sum(": failed " in line for line in run_files.read_text(history).splitlines())
            retries = int(self.limit.knobs["SRUNSH_MAX_RETRIES"])
            if failures >= retries:
                say(
                    f"srun.sh: job {job} failed, and is not requeued: it was requeued after {failures} failure(s)"
                    f" already (SRUNSH_MAX_RETRIES={retries})"
                )
                return status
            reason = reason or f"failed with exit status {status}"
        else:
            return status
        with open(history, "a") as file:
            restart = os.environ.get("SLURM_RESTART_COUNT") or 0
            file.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} job {job} restart {restart}: {reason}\n")
        say(f"srun.sh: {reason}: requeueing job {job}, which resumes run {self.plan.run_id} from its latest checkpoint")
        self.remove_shared_container()  # while the job's allocation is still there
        self.account(status, "requeued")  # before SLURM ends this job
        return 0 if subprocess.run(["scontrol", "requeue", job], check=False).returncode == 0 else status

    def account(self, status: int, ended: str = "") -> None:
        """The goodput line and RUN_DIR/goodput.json (launcher/host/goodput.py), once for a launch that trained."""
        if self.goodput_due:
            self.goodput_due = False
            stop = "stopped" if self.stopped_by else "hung" if self.hung else "failed" if status else "completed"
            goodput.account(self.run_dir, STARTED, ended or stop)

    def remove_shared_container(self) -> None:
        name, self.shared_container = self.shared_container, ""
        if name:
            container.remove(name, self.plan, self.log)


def header(plan: plans.LaunchPlan, resuming: bool, *lines: str) -> None:
    command.say_environment_knobs(plan, "# srun.sh: ", sys.stderr.buffer)
    how = "resuming run" if resuming else "new run"
    say(
        f"# srun.sh: {len(plan.hosts)} node(s) x {plan.ranks_per_node} rank(s), {how} {plan.run_id} in {plan.run_dir},"
        f" master {plan.master_addr}:{plan.master_port}; each rank runs:"
    )
    say(command.one_line(command.rank_command(plan)))
    for line in lines:
        if line:
            say(f"# srun.sh: {line}")


def launch(plan: plans.LaunchPlan, words: list[str], knobs: Knobs, limit: BatchJob | None) -> int:
    """The launch of PLAN (srun.sh's options) with WORDS (RECIPE.py and its overrides), from its checks to its exit
    status; its run folder is taken unless it is a dry run."""
    preflight(plan, words, knobs)
    resuming = resolve_job(plan, knobs)
    if plan.local or os.environ.get("SLURM_JOB_NODELIST"):  # else a dry run's nodes are placeholders
        shown_ranks(plan.console_ranks, plan.world_size)
    # Checked before the run's folder is taken; a port srun.sh derives is below 32768: only the knob's can be too high.
    restart = inprocess_plan(plan.overrides, len(plan.hosts), plan.ranks_per_node, int(knobs["MASTER_PORT"] or 0))
    plan.inprocess = plan.keep_work = restart.enabled
    plan.keep_work |= plan.batch_job
    plan.mtbf_s = saves.mtbf_s(plan.mtbf_s, len(plan.hosts))
    take_run(plan, knobs)
    command.export_rank_environment(plan)
    shared, container_line = container.plan_start(plan)
    if plan.dry_run:
        command.dry_run(plan)
        return 0
    run_files.remove_rank_statuses(plan.run_dir)
    Path(plan.run_dir, run_files.USAGE_ERROR).unlink(missing_ok=True)
    plans.write(plan, Path(plan.run_dir, run_files.LAUNCH_PLAN))
    header(plan, resuming, container_line, restart.header(), saves.line(plan))
    supervisor = Supervisor(plan, limit, shared)
    status = 1  # where run() raises: a stop by a signal (the supervisor knows it), or a defect
    try:
        status = supervisor.run()
        return status
    finally:
        supervisor.remove_shared_container()
        supervisor.account(status)
        trackers.say_uploads(plan.run_dir)


def main(argv: list[str]) -> int:
    """ARGV: srun.sh's knobs, NAME=VALUE, then -- and its own arguments."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as bash: a Ctrl-C before the launch ends this process quietly
    split = argv.index("--")
    knobs = dict(pair.split("=", 1) for pair in argv[:split])
    words, limit = argv[split + 1 :], None
    try:
        if words[:1] == ["--sbatch"]:
            return batch.submit(words[1:], knobs)
        if words[:1] == ["--batch-job"]:
            words, limit = words[1:], BatchJob(knobs)
        plan, words = parse_options(words, batch_job=limit is not None)
        return launch(plan, words, knobs, limit)
    except UsageError as error:
        say(f"srun.sh: {error}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
