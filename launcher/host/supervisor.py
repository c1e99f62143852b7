"""The launch's one process on the launching host: srun.sh hands it the knobs and its arguments, and it checks them,
settles the launch plan, and runs the launch to its end.

    python3 launcher/host/supervisor.py NAME=VALUE... -- [--sbatch SBATCH_OPTION... -- | --batch-job] [options] ...

It passes SIGINT, SIGTERM and SIGHUP on to every rank as SIGTERM after the hang report, watches for a hang (a
thread), runs the health check first where asked, reports the rank that failed first, and requeues a batch job.
Standard library only: the launching host may have no training stack. Every problem it finds in the input is one
line on stderr, exit 2, before anything starts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

if not __package__:  # run as a script (srun.sh): the repository, two folders up, holds the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher import run_files
from launcher.errors import UsageError
from launcher.hang.watch import watch
from launcher.health.exclude_nodes import exclude
from launcher.host import batch, command, container
from launcher.host import plan as plans
from launcher.host.batch import BatchJob, say
from launcher.host.first_failure import log_end
from launcher.host.first_failure import report as report_failure
from launcher.host.job import resolve_job
from launcher.host.preflight import REPO, Knobs, parse_options, preflight
from launcher.host.slurm import launch_step
from launcher.host.steps import Step
from launcher.restart.plan import PlanError
from launcher.restart.plan import outcome as inprocess_outcome
from launcher.restart.plan import plan as inprocess_plan

HANG_REPORT = REPO / "launcher" / "hang" / "report.py"
HEALTH_REPORT = REPO / "launcher" / "health" / "report.py"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Supervisor:
    """One launch, from its header to its exit status."""

    def __init__(self, plan: plans.LaunchPlan, limit: BatchJob | None, shared_container: str) -> None:
        self.plan, self.limit, self.shared_container = plan, limit, shared_container
        self.log = run_files.at(plan.run_dir, run_files.LAUNCHER_LOG)
        self.step: Step | None = None
        self.stopped_by = ""
        self.hung = False
        self.hang_report_due = False
        self.training_started = False
        if limit is not None:
            limit.on_reach = self.on_time_limit

    # ---- signals ---------------------------------------------------------------------------------------------
    def trap_stop_signals(self) -> None:
        for number in STOP_SIGNALS:
            signal.signal(number, self.on_stop_signal)

    def on_stop_signal(self, number: int, _frame: object) -> None:
        """SIGINT, SIGTERM or SIGHUP: the hang report, then every rank is stopped; srun.sh then exits 128+N."""
        if self.stopped_by:
            return
        self.stopped_by = signal.Signals(number).name.removeprefix("SIG")
        say(f"srun.sh: got SIG{self.stopped_by}; sending SIGTERM to every rank")
        self.collect_hang_report(f"srun.sh got SIG{self.stopped_by}")
        self.stop_ranks()

    def on_time_limit(self) -> None:
        """A batch job SRUNSH_SAVE_LEAD_S from its time limit: every rank gets SIGTERM, on which Megatron Bridge saves
        a checkpoint and stops; before training, the health check runs to its verdict and the job then requeues
        itself untrained."""
        assert self.limit is not None  # a batch job's
        if not self.training_started:
            self.limit.say_untrained()
            return
        lead, job_id = self.limit.knobs["SRUNSH_SAVE_LEAD_S"], os.environ.get("SLURM_JOB_ID", "")
        say(f"srun.sh: job {job_id} reaches its time limit in {lead}s: SIGTERM to every rank to save and stop")
        self.collect_hang_report(f"the job's time limit is {lead}s away")
        self.stop_ranks(to_save=True)

    def stop_ranks(self, to_save: bool = False) -> None:
        if self.step is not None:
            self.step.stop(os.environ.get("SLURM_JOB_ID", ""), self.plan.step_name, to_save)

    # ---- the hang report -------------------------------------------------------------------------------------
    def collect_hang_report(self, why: str) -> None:
        """The hang report, once per launch, before any rank is signalled to stop. WHY says what stopped it."""
        if not self.hang_report_due:
            return
        self.hang_report_due = False
        target = ["--local"]
        if not self.plan.local:
            step = launch_step(os.environ.get("SLURM_JOB_ID", ""), self.plan.step_name)
            if not step:
                return  # no step yet: no rank to ask
            target = ["--step", step]
        if self.hung:
            target.append("--stalled")  # the hang watch's: a stall, not a stop of a job that may be progressing
        # Whatever its status: a report that could not be written leaves the stop as it is.
        subprocess.run(
            ["python3", str(HANG_REPORT), self.plan.run_dir, "--why", why, "--world-size",
             str(self.plan.world_size), "--nodes", ",".join(self.plan.hosts), "--ranks-per-node",
             str(self.plan.ranks_per_node), *target],
            check=False,
        )  # fmt: skip

    def on_stall(self) -> None:
        """The hang watch found no completed step for too long: the report, then SIGTERM to every rank (exit 124)."""
        if self.stopped_by or self.hung:
            return
        self.hung = True
        why = Path(run_files.at(self.plan.run_dir, run_files.STALLED)).read_text(errors="surrogateescape").rstrip("\n")
        self.collect_hang_report(why)
        self.stop_ranks()

    # ---- the launch ------------------------------------------------------------------------------------------
    def launch_watched(self, launch: list[str]) -> int:
        """The launch, watched for a hang; its status."""
        # An earlier launch's records: the ranks register afresh.
        run_files.remove_tree(run_files.at(self.plan.run_dir, run_files.HANG))
        stalled, stop_watch = threading.Event(), threading.Event()
        if self.plan.hang_timeout_s != "off":
            fixed = float(self.plan.hang_timeout_s) if self.plan.hang_timeout_s else None
            threading.Thread(
                target=watch, args=(Path(self.plan.run_dir), fixed, lambda _why: stalled.set(), stop_watch), daemon=True
            ).start()
        self.hang_report_due = True
        self.step = Step(launch, self.log, self.plan.local)
        status = self.step.run(stalled, self.on_stall)
        self.hang_report_due = False
        stop_watch.set()
        return status

    def check_health(self, health_launch: list[str]) -> None:
        """Returns only when every node passed and a launch follows; otherwise exits (a batch job first requeues
        itself without the nodes that failed)."""
        plan = self.plan
        say(
            f"# srun.sh: health check of {len(plan.hosts)} node(s) x {plan.ranks_per_node} rank(s), each part within"
            f" {plan.health_timeout_s}s (SRUNSH_HEALTH_TIMEOUT_S)"
        )
        result = Path(run_files.at(plan.run_dir, run_files.HEALTH_JSON))
        result.unlink(missing_ok=True)
        report = ["python3", str(HEALTH_REPORT), plan.run_dir, "--timeout", plan.health_timeout_s, "--nodes"]
        report += [",".join(plan.hosts), "--ranks-per-node", str(plan.ranks_per_node), "--", *health_launch]
        self.step = Step(report, self.log, plan.local)
        status = self.step.run()
        run_files.remove_rank_statuses(plan.run_dir)  # the check's: the launch's own failure report reads these
        self.exit_if_stopped()
        if not result.is_file() or not result.stat().st_size:
            say(f"srun.sh: the health check ended before it judged the nodes; the end of {self.log}:")
            sys.stderr.buffer.write(log_end(Path(self.log)))
            raise SystemExit(1)
        if plan.health_only or (status and not plan.batch_job):
            raise SystemExit(status)
        if not status:
            return
        failed = run_files.read_text(run_files.at(plan.run_dir, run_files.FAILED_NODES)).rstrip("\n")
        # The requeue's SIGTERM reaches this process: ignored from here on, since nothing is left to stop, and a
        # stop would spend the cluster's KillWait before the nodes are excluded.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        requeued = self.requeue(status, f"failed the health check{f' on {failed}' if failed else ''}")
        if requeued:
            raise SystemExit(requeued)
        if failed:
            exclude(os.environ["SLURM_JOB_ID"], failed)
        raise SystemExit(status)

    def exit_if_stopped(self) -> None:
        if self.stopped_by:
            raise SystemExit(128 + signal.Signals[f"SIG{self.stopped_by}"].value)

    def requeue(self, status: int, reason: str = "") -> int:
        """After a batch job's launch: requeue it when it stopped for its time limit, or failed with retries left.
        0 once it is requeued; otherwise the status to exit with."""
        assert self.limit is not None  # a batch job's
        history, job = run_files.at(self.plan.run_dir, run_files.REQUEUES_LOG), os.environ.get("SLURM_JOB_ID", "")
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
        if subprocess.run(["scontrol", "requeue", job], check=False).returncode:
            return status
        return 0

    def remove_shared_container(self) -> None:
        name, self.shared_container = self.shared_container, ""
        if name:
            container.remove(name, self.plan, self.log)

    def run(self) -> int:
        plan = self.plan
        if plan.health:
            self.check_health(command.launch_command(plan, command.rank_command(plan, health=True)))
        status = 0
        # No training once a batch job's time limit is near: from here on its USR1 stops the ranks.
        self.training_started = self.limit is None or not self.limit.reached
        if self.training_started:
            status = self.launch_watched(command.launch_command(plan, command.rank_command(plan)))
        self.exit_if_stopped()
        if self.hung:
            status = 124  # the hang watch stopped the ranks, and the hang report said why
        elif status and plan.inprocess and inprocess_outcome(Path(plan.run_dir)) == 0:
            status = 0  # training completed on the ranks that replaced a failed one
        elif status:
            first = report_failure(Path(plan.run_dir), self.step.log_start if self.step else 1, plan.local)
            status = status if first is None else first
        if plan.batch_job:
            hung = f"hung: see {plan.run_dir}/hang-report.txt" if self.hung else ""
            status = self.requeue(status, hung) or status
        return status


def header(plan: plans.LaunchPlan, resuming: bool, container_line: str, inprocess_line: str) -> None:
    command.say_environment_knobs(plan, "# srun.sh: ", sys.stderr.buffer)
    how = "resuming run" if resuming else "new run"
    say(
        f"# srun.sh: {len(plan.hosts)} node(s) x {plan.ranks_per_node} rank(s), {how} {plan.run_id} in {plan.run_dir},"
        f" master {plan.master_addr}:{plan.master_port}; each rank runs:"
    )
    say(command.one_line(command.rank_command(plan)))
    for line in (container_line, inprocess_line):
        if line:
            say(f"# srun.sh: {line}")


def plan_inprocess(plan: plans.LaunchPlan) -> str:
    """In-process restart's setting into PLAN; the header's line on it."""
    try:
        restart = inprocess_plan(plan.overrides, len(plan.hosts), plan.ranks_per_node, int(plan.master_port))
    except PlanError as error:
        raise UsageError(str(error)) from None
    plan.inprocess = restart.enabled
    return restart.header()


def launch(plan: plans.LaunchPlan, words: list[str], knobs: Knobs, limit: BatchJob | None) -> int:
    """The launch of PLAN (srun.sh's options) with WORDS (RECIPE.py and its overrides), from its checks to its exit
    status; its run folder is taken unless it is a dry run."""
    preflight(plan, words, knobs)
    resuming = resolve_job(plan, knobs)
    inprocess_line = plan_inprocess(plan)
    command.export_rank_environment(plan)
    shared, container_line = container.plan_start(plan)
    if plan.dry_run:
        sys.stdout.buffer.write(os.fsencode(command.dry_run_text(plan)))
        sys.stdout.flush()
        command.say_environment_knobs(plan, "", None)
        return 0
    run_files.remove_rank_statuses(plan.run_dir)
    Path(run_files.at(plan.run_dir, run_files.USAGE_ERROR)).unlink(missing_ok=True)
    plans.write(plan, run_files.at(plan.run_dir, run_files.LAUNCH_PLAN))
    header(plan, resuming, container_line, inprocess_line)
    supervisor = Supervisor(plan, limit, shared)
    supervisor.trap_stop_signals()
    try:
        return supervisor.run()
    finally:
        supervisor.remove_shared_container()


def main(argv: list[str]) -> int:
    """ARGV: srun.sh's knobs, NAME=VALUE, then -- and its own arguments."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as bash: a Ctrl-C before the launch ends this process quietly
    split = argv.index("--")
    knobs = {"MASTER_ADDR": "", "MASTER_PORT": "", **dict(pair.split("=", 1) for pair in argv[:split])}
    words, limit = argv[split + 1 :], None
    try:
        if words[:1] == ["--sbatch"]:
            return batch.submit(words[1:], knobs)
        if words[:1] == ["--batch-job"]:
            words, limit = words[1:], batch.trap_time_limit(knobs)
        plan, words = parse_options(words, batch_job=limit is not None)
        return launch(plan, words, knobs, limit)
    except UsageError as error:
        sys.stderr.buffer.write(os.fsencode(f"srun.sh: {error}\n"))
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
