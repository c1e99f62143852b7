"""In-process restart (nvidia-resiliency-ext 0.6.0, as Megatron Bridge 0.6.2 integrates it) through srun.sh, on CPU:
the launch plan, the rank's config and checks against the real config classes, the restart line from the real
Wrapper's log records, and the upstream defects that stand in the way.

The launches here run tests/fixtures/inprocess_python: a rank inside the real inprocess.Wrapper, with a stand-in
training function (see its docstring for what a CPU cannot run).
"""

import datetime
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.bridge.training.config import InProcessRestartConfig
from nvidia_resiliency_ext.inprocess import CallWrapper
from nvidia_resiliency_ext.inprocess.attribution import Interruption, InterruptionRecord
from nvidia_resiliency_ext.inprocess.monitor_thread import RankShouldRestart
from nvidia_resiliency_ext.inprocess.utils import log_exc
from nvidia_resiliency_ext.inprocess.wrap import HealthCheckPassed

import entrypoint
from launcher.errors import UsageError
from launcher.hang import progress
from launcher.restart import inprocess, plan
from launcher.restart import log as restart_log
from tests.conftest import REPO
from tests.srun_world import FIXTURES, SrunWorld

pytest_plugins = ["tests.srun_world"]

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")
ON = "inprocess_restart.enabled=true"
# Seconds a CPU test can wait: NVRx's defaults are minutes.
FAST = [
    "inprocess_restart.heartbeat_interval=1",
    "inprocess_restart.heartbeat_timeout=8",
    "inprocess_restart.soft_timeout=20",
    "inprocess_restart.hard_timeout=30",
    "inprocess_restart.barrier_timeout=40",
]


# ---- The launch plan (launching host, standard library only) ----------------------------------------------------


def test_off_unless_the_override_turns_it_on():
    assert not plan.plan([], 2, 8, 29500).enabled
    assert not plan.plan([ON, "~inprocess_restart"], 2, 8, 29500).enabled
    assert plan.plan([ON], 2, 8, 29500).header().startswith("in-process restart on: 16 of 16 rank(s) train")


@given(
    nodes=st.integers(1, 64),
    per_node=st.integers(1, 8),
    active=st.integers(1, 600),
    port=st.integers(1, 65535),
)
def test_plan_takes_whole_spare_nodes_and_ports_below_65536_and_refuses_the_rest(nodes, per_node, active, port):
    world = nodes * per_node
    arguments = [ON, f"inprocess_restart.active_world_size={active}"]
    works = active <= world and (world - active) % per_node == 0 and port + 2 <= 65535
    if works:
        result = plan.plan(arguments, nodes, per_node, port)
        assert result.spare_nodes * per_node == world - active
        assert f"{result.spare_nodes} spare node(s)" in result.header() or result.spare_nodes == 0
    else:
        with pytest.raises(plan.PlanError):
            plan.plan(arguments, nodes, per_node, port)


def test_dry_run_keeps_the_step_alive_only_with_in_process_restart_and_names_the_spares(srun_world: SrunWorld):
    env = {"SRUNSH_PYTHON": "python3"}
    today = srun_world.srun_sh("--no-container", "--dry-run", "recipe.py", env=env)
    on = srun_world.srun_sh(
        "--no-container", "--dry-run", "recipe.py", ON, "inprocess_restart.active_world_size=8", env=env
    )

    assert today.returncode == 0 and on.returncode == 0, today.stderr + on.stderr
    assert "--kill-on-bad-exit=1" in today.stdout and "--kill-on-bad-exit=0" not in today.stdout
    assert "--kill-on-bad-exit=0" in on.stdout


def test_spares_that_are_not_whole_nodes_are_refused_before_anything_starts(srun_world: SrunWorld):
    result = srun_world.srun_sh(
        "--local", "recipe.py", ON, "inprocess_restart.active_world_size=3", env={"SRUNSH_GPUS_PER_NODE": "2"}
    )

    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "srun.sh: inprocess_restart.active_world_size=3 is more than the job's 2 rank(s) (1 node(s) x 2):"
        " allocate more nodes or lower it"
    )
    assert not srun_world.calls()


# ---- The rank's config and checks (the real Megatron Bridge config) -------------------------------------------


def test_enabled_override_alone_creates_the_section_the_recipe_left_null():
    """Failed before launcher/restart/inprocess.py: "cannot set 'inprocess_restart.enabled': 'inprocess_restart' is
    null"."""
    cfg, _ = entrypoint.resolve(entrypoint.parse_args([TINY, ON, "nvrx_straggler.enabled=true"]))

    assert cfg.inprocess_restart == InProcessRestartConfig(enabled=True)
    assert cfg.nvrx_straggler.enabled


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ("inprocess_restart.soft_timeout=100", "soft_timeout=100 < hard_timeout=90 < barrier_timeout=120 do not hold"),
        ("inprocess_restart.heartbeat_interval=60", "heartbeat_interval=60 is not below heartbeat_timeout=60"),
    ],
)
def test_timeouts_that_nvrx_refuses_on_every_rank_are_refused_by_the_check(override, error):
    with pytest.raises(UsageError, match=error):
        entrypoint.resolve(entrypoint.parse_args([TINY, ON, override, "--world-size", "2"]))


def test_the_check_validates_the_ranks_that_train_not_the_spares():
    """tiny_gpt with tensor parallelism 2 trains on the 2 active ranks of 3 (a spare rank with granularity=rank);
    without the spare, 3 ranks cannot hold TP=2."""
    tp2 = [TINY, "model.tensor_model_parallel_size=2", "--world-size=3"]
    with pytest.raises(UsageError, match="for 3 ranks"):
        entrypoint.resolve(entrypoint.parse_args(tp2))
    spare = [ON, "inprocess_restart.granularity=rank", "inprocess_restart.active_world_size=2"]
    cfg, _ = entrypoint.resolve(entrypoint.parse_args([*tp2, *spare]))
    assert cfg.inprocess_restart.active_world_size == 2


def test_a_recipe_that_turns_it_on_under_a_launch_that_did_not_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SRUNSH_INPROCESS", "0")
    recipe = tmp_path / "own_recipe.py"
    recipe.write_text(
        "from megatron.bridge.training.config import InProcessRestartConfig\n"
        "from recipes.tiny_gpt_pretrain import configure as tiny\n\n\n"
        "def configure():\n"
        "    cfg = tiny()\n"
        "    cfg.inprocess_restart = InProcessRestartConfig(enabled=True)\n"
        "    return cfg\n"
    )
    with pytest.raises(UsageError, match=r"add inprocess_restart\.enabled=true to the command line"):
        entrypoint.resolve(entrypoint.parse_args([str(recipe)]))


# ---- The restart line, from what the real Wrapper logs --------------------------------------------------------


def nvrx_says(level: int, message: str) -> None:
    logging.getLogger(restart_log.NVRX_LOGGER).log(level, message)


def test_one_line_per_restart_names_the_rank_its_error_and_the_seconds_to_the_next_step(tmp_path, monkeypatch):
    handler = restart_log.install(tmp_path)
    try:
        monkeypatch.setenv("RANK", "3")
        nvrx_says(logging.ERROR, log_exc(3, RuntimeError("injected fault"), "fn_ex"))
        monkeypatch.setenv("RANK", "0")
        record = InterruptionRecord(3, Interruption.EXCEPTION)
        interrupted = RankShouldRestart(f"{record.interruption} affecting ranks {{3}}")
        nvrx_says(logging.WARNING, log_exc(0, interrupted, "term_ex"))
        assert progress.LAST.phase == "restarting"
        time.sleep(0.2)
        line = handler.step_completed(101)
    finally:
        logging.getLogger(restart_log.NVRX_LOGGER).removeHandler(handler)

    host = os.uname().nodename
    assert line is not None
    assert line.startswith("restart 1 at ")
    assert line.split(": ", 1)[1].startswith(
        f"rank(s) 3 EXCEPTION (rank 3 on {host}: RuntimeError('injected fault')); resumed from the local checkpoint"
        " of step 100 ("
    )
    assert "; step 101 completed" in line
    assert (tmp_path / "restarts.log").read_text() == line + "\n"
    assert handler.step_completed(102) is None


@settings(max_examples=40, deadline=None)
@given(last=st.integers(0, 500), back=st.integers(0, 60), persistent=st.booleans())
def test_the_restart_line_names_the_checkpoint_training_went_on_from_and_the_steps_trained_again(
    tmp_path_factory, last, back, persistent
):
    """NVRx's records as the real Wrapper logs them, after LAST completed steps; Megatron Bridge then loads the newest
    checkpoint, of step RESUMED, and the first step after the restart is RESUMED + 1."""
    run_dir = tmp_path_factory.mktemp("run")
    resumed = max(last - back, 0)
    if persistent:
        (run_dir / "checkpoints" / f"iter_{resumed:07d}").mkdir(parents=True)
    saved_last, progress.LAST.step = progress.LAST.step, last
    saved_rank, os.environ["RANK"] = os.environ.get("RANK"), "0"
    handler = restart_log.install(run_dir)
    try:
        nvrx_says(logging.INFO, log_exc(0, HealthCheckPassed(), "restart_ex"))
        line = handler.step_completed(resumed + 1, str(run_dir / "checkpoints"))
    finally:
        logging.getLogger(restart_log.NVRX_LOGGER).removeHandler(handler)
        progress.LAST.step = saved_last
        if saved_rank is None:
            del os.environ["RANK"]
        else:
            os.environ["RANK"] = saved_rank

    kind = "persistent" if persistent else "local"
    source = f"the {kind} checkpoint of step {resumed}" if resumed else "no checkpoint: from the start"
    assert f"; resumed from {source} ({last - resumed} step(s) trained again); step {resumed + 1} completed " in line


@pytest.fixture
def bridge_logging():
    """Megatron Bridge's own logging set-up, as _pretrain runs it (logger.filter_warnings on, its default): a filter
    that drops WARNING records on every logger there is, NVRx's among them. Undone afterwards."""
    from megatron.bridge.training.utils.log_utils import setup_logging, warning_filter

    root_level = logging.getLogger().level
    logging.getLogger(restart_log.NVRX_LOGGER)  # exists by then: entrypoint.py sets NVRx's logger up before pretrain
    setup_logging()
    yield
    for logger in [logging.getLogger(), *map(logging.getLogger, logging.root.manager.loggerDict)]:
        logger.removeFilter(warning_filter)
    logging.getLogger().setLevel(root_level)


def test_upstream_defect_megatron_bridge_drops_every_nvrx_warning(bridge_logging):
    seen: list[logging.LogRecord] = []
    catcher = logging.Handler()
    catcher.emit = seen.append
    logging.getLogger(restart_log.NVRX_LOGGER).addHandler(catcher)
    try:
        nvrx_says(logging.WARNING, "term_ex: RankShouldRestart('Interruption.EXCEPTION affecting ranks {0}')")
        nvrx_says(logging.ERROR, "fn_ex: RuntimeError('x')")
    finally:
        logging.getLogger(restart_log.NVRX_LOGGER).removeHandler(catcher)

    assert [record.levelno for record in seen] == [logging.ERROR]


def test_the_restart_line_survives_megatron_bridges_filter_of_nvrx_warnings(tmp_path, monkeypatch, bridge_logging):
    """On the H200 NVRx restarted in place, and no line came: Megatron Bridge drops NVRx's term_ex warning. The
    records, in the order and at the levels the Wrapper logged them there; the line names the rank that raised."""
    handler = restart_log.install(tmp_path)
    try:
        monkeypatch.setenv("RANK", "0")
        nvrx_says(logging.ERROR, log_exc(0, RuntimeError("injected fault at step 17"), "fn_ex"))
        interrupted = RankShouldRestart(
            f"{InterruptionRecord(0, Interruption.EXCEPTION).interruption} affecting ranks {{0}}"
        )
        nvrx_says(logging.WARNING, log_exc(0, interrupted, "term_ex"))
        nvrx_says(logging.INFO, log_exc(0, HealthCheckPassed(), "restart_ex"))
        assert progress.LAST.phase == "restarting"
        line = handler.step_completed(16)
    finally:
        logging.getLogger(restart_log.NVRX_LOGGER).removeHandler(handler)

    host = os.uname().nodename
    assert line is not None
    assert line.split(": ", 1)[1].startswith(
        f"rank(s) 0 EXCEPTION (rank 0 on {host}: RuntimeError('injected fault at step 17')); resumed from"
    )
    assert "; step 16 completed" in line


def test_a_restart_whose_cause_left_no_record_says_so_rather_than_naming_a_rank(tmp_path, monkeypatch, bridge_logging):
    """A rank that was killed leaves no error of its own; with NVRx's warning filtered nobody is named."""
    handler = restart_log.install(tmp_path)
    try:
        monkeypatch.setenv("RANK", "0")
        nvrx_says(logging.INFO, log_exc(0, HealthCheckPassed(), "restart_ex"))
        line = handler.step_completed(9)
    finally:
        logging.getLogger(restart_log.NVRX_LOGGER).removeHandler(handler)

    assert line is not None
    assert line.split(": ", 1)[1].startswith("rank(s) ? unknown interruption; resumed from ")
    assert "; step 9 completed" in line


# A rank's start, as entrypoint.py makes it, up to torch.distributed: what torch's NCCL dump-on-timeout switch is then.
DUMP_SWITCH = """
import os, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from launcher.hang import dumps as hang_dumps
hang_dumps.install(Path(sys.argv[1]), 0, in_process_restart=sys.argv[2] == "on")
print(os.environ.get("TORCH_NCCL_DUMP_ON_TIMEOUT"))
"""


@settings(max_examples=12, deadline=None)
@given(
    restart=st.booleans(),
    users=st.one_of(st.none(), st.sampled_from(["0", "1", "true", "False"])),
    unrelated=st.dictionaries(
        st.sampled_from(["NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "LANG", "TERM"]),
        st.sampled_from(["WARN", "3", "1", "C.UTF-8", "xterm"]),
    ),
)
def test_with_in_process_restart_torch_does_not_dump_on_an_abort_unless_the_user_asked(
    tmp_path_factory, restart, users, unrelated
):
    """On the H200 the restart waited past NVRx's hard timeout with torch's dump on (its heartbeat monitor sleeps
    480 s after the dump, and the aborted group's destructor joins it), and took 8 s with it off."""
    env = {k: v for k, v in os.environ.items() if k != "TORCH_NCCL_DUMP_ON_TIMEOUT"} | unrelated
    if users is not None:
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = users
    program = DUMP_SWITCH.format(repo=str(REPO))
    run_dir = tmp_path_factory.mktemp("run")
    done = subprocess.run(
        [sys.executable, "-c", program, str(run_dir), "on" if restart else "off"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip

    expected = users if users is not None else ("0" if restart else "1")
    assert done.stdout.strip() == expected


def test_the_hang_watch_gives_a_restart_the_start_up_limit():
    from launcher.hang.watch import START_LIMIT_S, StallClock

    clock = StallClock(None, 0.0)
    for step, now in enumerate([10.0, 11.0, 12.0], start=1):
        clock.observe({"step": step, "phase": "training"}, now)
    assert clock.limit() == 300.0
    assert clock.observe({"step": 3, "phase": "restarting"}, 13.0) is None
    assert clock.limit() == START_LIMIT_S
    assert clock.observe(None, 13.0 + START_LIMIT_S - 1) is None


# ---- Through srun.sh --local: the real Wrapper restarts a rank that raised, in place -----------------------------


def inprocess_world(world: SrunWorld) -> SrunWorld:
    world.env["SRUNSH_PYTHON"] = str(FIXTURES / "inprocess_python")
    world.env["PATH"] = f"{Path(os.sys.executable).parent}:{world.env['PATH']}"
    return world


def test_local_rank_that_raises_restarts_in_place_and_the_launch_says_so_once(srun_world: SrunWorld):
    world = inprocess_world(srun_world)
    env = {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_RAISE": "1@3", "FAKE_STEPS": "5"}
    result = world.srun_sh(
        "--local", "recipe.py", ON, "inprocess_restart.granularity=rank", *FAST, env=env, timeout=180
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert "# srun.sh: in-process restart on: 2 of 2 rank(s) train, no spare;" in result.stderr
    lines = [line for line in result.stdout.splitlines() if "entrypoint.py: restart" in line]
    assert len(lines) == 1, result.stdout[-3000:]
    assert "rank(s) 1 EXCEPTION (rank 1 on " in lines[0] and "RuntimeError('injected fault at step 3')" in lines[0]
    run_dir = world.run_dirs()[0]
    assert (run_dir / "restarts.log").read_text() == lines[0].removeprefix("0: entrypoint.py: ") + "\n"
    for rank in (0, 1):  # one process each, which lived through the restart and ended well
        assert (run_dir / "logs" / f"rank-{rank}.status").read_text().split()[0] == "0"
        assert "iteration 1: rank" in (run_dir / "logs" / f"rank-{rank}.log").read_text()
    # The goodput line: the fault, and the steps before it that the restart (from step 1) trained again.
    (attempt,) = json.loads((run_dir / "goodput.json").read_text())["attempts"]
    assert attempt["ended"] == "completed" and attempt["steps"] == [1, 5] and len(attempt["faults"]) == 1
    assert attempt["faults"][0]["retrained_steps"] in (1, 2)  # rank 0 records step 2 unless the raise came first
    assert " 1 fault(s) " in result.stdout.splitlines()[-1]


def test_local_rank_that_fails_every_iteration_ends_the_launch_as_today_when_nvrx_gives_up(srun_world: SrunWorld):
    world = inprocess_world(srun_world)
    env = {"SRUNSH_GPUS_PER_NODE": "2", "FAKE_RAISE_ALWAYS": "1@3", "FAKE_STEPS": "4"}
    limit = "inprocess_restart.max_iterations=2"
    result = world.srun_sh(
        "--local", "recipe.py", ON, "inprocess_restart.granularity=rank", limit, *FAST, env=env, timeout=180
    )

    assert result.returncode != 0
    report = [line for line in result.stderr.splitlines() if line.startswith("srun.sh: rank")]
    assert len(report) == 1 and "failed first, with exit status 1" in report[0], result.stderr[-3000:]
    # max_iterations=2: iteration 0 fails at step 3, iteration 1 completes steps 1 and 2 and fails too, and NVRx gives
    # up. Rank 0 writes the restart's line when step 1 completes; rank 1 can raise at step 3 only after step 2's
    # all-reduce, which rank 0 joins after writing it (a raise at step 2 raced the line: NVRx interrupted rank 0)
    restarts = (world.run_dirs()[0] / "restarts.log").read_text().splitlines()
    assert len(restarts) == 1 and "step 1 completed" in restarts[0]


# ---- Upstream defects (Megatron Bridge 0.6.2 with nvidia-resiliency-ext 0.6.0): these pass while they last -----


def bridge_wrapper(config: InProcessRestartConfig, monkeypatch):
    """Megatron Bridge's own inprocess_restart() around a function; the Wrapper it built and the function it wraps."""
    from megatron.bridge.training.inprocess_restart import inprocess_restart
    from megatron.bridge.training.state import GlobalState

    monkeypatch.setenv("MASTER_PORT", "29500")

    def train(state, forward_step_func, callback_manager=None, store=None, inprocess_call_wrapper=None):
        return inprocess_call_wrapper

    wrapped = inprocess_restart(train, config, GlobalState())
    (wrapper,) = [cell.cell_contents for cell in wrapped.__closure__ if type(cell.cell_contents).__name__ == "Wrapper"]
    return wrapper, wrapped.__wrapped__


def test_upstream_defect_pretrain_never_gets_the_call_wrapper(monkeypatch):
    """NVRx passes its CallWrapper only to a parameter annotated CallWrapper; Megatron Bridge's _adapter(*args,
    **kwargs) has none, so _pretrain always gets inprocess_call_wrapper=None: no per-iteration PrefixStore for the
    process group's rendezvous, and the failure path (logger.exception, process-group clean-up) runs as if there
    were no restart. Upstream needs: `def _adapter(*args, inprocess_call_wrapper: CallWrapper | None = None, **kw)`.
    Ours: entrypoint.py does not arm launcher/restart/exit_after_failure.py under in-process restart (its timer,
    started by that logger.exception, would end a rank that is restarting)."""
    from nvidia_resiliency_ext.inprocess.param_utils import substitute_param_value

    _, adapter = bridge_wrapper(InProcessRestartConfig(enabled=True, granularity="rank"), monkeypatch)
    marker = object()
    args, kwargs = substitute_param_value(adapter, ("state", "forward"), {"store": None}, {CallWrapper: marker})
    assert marker not in args and marker not in kwargs.values()


def test_ours_gives_pretrain_the_call_wrapper(monkeypatch):
    """With launcher/restart/inprocess.py's fix, NVRx's own parameter substitution finds the adapter's parameter, and
    the adapter hands the CallWrapper to the training function: _pretrain knows it restarts (upstream's code
    unchanged)."""
    from megatron.bridge.training import inprocess_restart as bridge
    from nvidia_resiliency_ext.inprocess.param_utils import substitute_param_value

    monkeypatch.setattr(bridge, "inprocess_restart", bridge.inprocess_restart)  # put back after the test
    inprocess.pass_the_call_wrapper()
    _, adapter = bridge_wrapper(InProcessRestartConfig(enabled=True, granularity="rank"), monkeypatch)
    marker = object()
    args, kwargs = substitute_param_value(adapter, ("state", "forward"), {"store": None}, {CallWrapper: marker})

    assert kwargs["inprocess_call_wrapper"] is marker
    assert adapter(*args, **kwargs) is marker  # what the training function got


def test_upstream_defect_max_iterations_is_never_given_to_nvrx(monkeypatch):
    """InProcessRestartConfig.max_iterations is documented, but inprocess_restart() builds RetryController with
    min_world_size only: NVRx restarts without a bound. Upstream needs RetryController(max_iterations=...)."""
    wrapper, _ = bridge_wrapper(InProcessRestartConfig(enabled=True, granularity="rank", max_iterations=2), monkeypatch)
    (controller,) = [i for i in wrapper.initialize.instances if type(i).__name__ == "RetryController"]
    assert controller.max_iterations is None


def test_upstream_defect_the_node_layer_is_sized_by_the_visible_gpus_not_the_ranks_a_node_runs(monkeypatch):
    """granularity=node sizes NVRx's per-node layer by torch.cuda.device_count(): 0 on a host without GPUs, and
    more than the ranks a node runs under SRUNSH_GPUS_PER_NODE below its GPUs. Ours: the rank's check requires one
    rank per visible GPU with granularity=node (launcher/restart/inprocess.py). Upstream needs LOCAL_WORLD_SIZE
    there."""
    wrapper, _ = bridge_wrapper(InProcessRestartConfig(enabled=True, granularity="node"), monkeypatch)
    node_layer = wrapper.rank_assignment.layers[1]
    assert (node_layer.min_ranks, node_layer.max_ranks) == (0, 0)


def test_upstream_needs_cuda_to_finalize_a_restart():
    """NVRx 0.6.0's ThreadedFinalize, which Megatron Bridge always uses, raises without CUDA: on a CPU host the real
    integration gives up at the first restart (why the launches here use tests/fixtures/inprocess_python)."""
    from nvidia_resiliency_ext.inprocess.finalize import ThreadedFinalize

    with pytest.raises(RuntimeError, match="CUDA is not available"):
        ThreadedFinalize(timeout=datetime.timedelta(seconds=1), fn=lambda: None)(SimpleNamespace(rank=0))


# ---- On the two-node test SLURM ---------------------------------------------------------------------------------

TWO_BY_TWO = ("--nodes=2", "--gpus-per-node=2")


def test_rank_raising_on_node2_restarts_training_in_place_on_both_nodes(slurm_world: SrunWorld):
    world = inprocess_world(slurm_world)
    env = {"FAKE_RAISE": "3@3", "FAKE_STEPS": "5"}
    result, steps = world.in_allocation("--no-container", "recipe.py", ON, *FAST, salloc=TWO_BY_TWO, env=env)

    assert result.returncode == 0, result.stderr[-3000:]
    assert steps == 1
    assert "in-process restart on: 4 of 4 rank(s) train, no spare;" in result.stderr
    lines = [line for line in result.stdout.splitlines() if "entrypoint.py: restart" in line]
    assert len(lines) == 1 and "rank(s) 3 EXCEPTION (rank 3 on node2: RuntimeError(" in lines[0], result.stdout
    run_dir = world.run_dirs()[0]
    for rank in range(4):  # each rank one process, which lived through the restart
        assert (run_dir / "logs" / f"rank-{rank}.status").read_text().split()[0] == "0"
        assert "iteration 1: rank" in (run_dir / "logs" / f"rank-{rank}.log").read_text()


def test_rank_killed_on_node1_is_replaced_by_the_spare_on_node2_and_training_completes(slurm_world: SrunWorld):
    """Rank 0 hosts the stores of Megatron Bridge (MASTER_PORT+1) and NVRx (MASTER_PORT+2): a fault there is never
    survived, so the rank killed here is rank 1, and its spare is rank 3 (granularity=rank: two nodes cannot have a
    whole spare node and a surviving rank 0 besides)."""
    world = inprocess_world(slurm_world)
    spare = ["inprocess_restart.granularity=rank", "inprocess_restart.active_world_size=3"]
    env = {"FAKE_KILL": "1@3", "FAKE_STEPS": "5"}
    result, _ = world.in_allocation("--no-container", "recipe.py", ON, *spare, *FAST, salloc=TWO_BY_TWO, env=env)

    assert result.returncode == 0, result.stderr[-3000:]
    assert "in-process restart on: 3 of 4 rank(s) train, 1 spare rank(s);" in result.stderr
    run_dir = world.run_dirs()[0]
    assert result.stderr.splitlines()[-1] == (
        "srun.sh: training completed after in-process restart; rank(s) 1 on node1 (exit status 137) ended and were"
        f" replaced ({run_dir}/restarts.log)"
    )
    assert "iteration 1: rank 1 of 3 on node2" in (run_dir / "logs" / "rank-3.log").read_text()
    (line,) = [line for line in result.stdout.splitlines() if "entrypoint.py: restart" in line]
    assert ": rank(s) 1 TERMINATED" in line, line  # the killed rank first, not the peers whose collectives failed


# ---- Straggler detection: Megatron Bridge's own manager, fed a real nvidia-resiliency-ext report ----------------


def test_a_straggler_is_named_with_rank_and_host_and_every_score_goes_to_the_run_log(tmp_path, capsys):
    import inspect

    import nvidia_resiliency_ext.attribution.straggler as nvrx_straggler
    from megatron.bridge.training.config import NVRxStragglerDetectionConfig
    from megatron.bridge.training.nvrx_straggler import NVRxStragglerDetectionManager

    from launcher.restart import straggler

    config = NVRxStragglerDetectionConfig(enabled=True, stop_if_detected=True)
    straggler.install(config, tmp_path)
    hosts = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    individual = {0: 0.99, 1: 0.98, 2: 0.97, 3: 0.45}  # rank 3's GPU slowed down against its own history
    relative = {0: 1.0, 1: 0.98, 2: 0.97, 3: 0.9}
    report = nvrx_straggler.Report(relative, {}, individual, {}, hosts, {}, {}, 0.1, True, 0)
    manager = NVRxStragglerDetectionManager(config)
    try:
        assert manager._handle_straggler_report(report)
        assert straggler.STOPPING in inspect.getsource(NVRxStragglerDetectionManager.check_stragglers)
        manager.logger.error(straggler.STOPPING)
    finally:
        logging.getLogger(config.logger_name).handlers.clear()

    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("entrypoint.py:")]
    assert lines == [
        f"entrypoint.py: straggler (individual score below threshold): rank 3 on node2 ({tmp_path}/stragglers.log)",
        "entrypoint.py: training stops (nvrx_straggler.stop_if_detected=true): straggler(s) rank 3 on node2",
    ]
    log = (tmp_path / "stragglers.log").read_text()
    assert "Rank=3 Node=node2 Score=0.45" in log and "Rank=0 Node=node1 Score=1.00" in log
