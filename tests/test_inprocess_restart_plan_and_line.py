"""In-process restart, the two ends a user sees: a launch with no rank to train (inprocess_restart.active_world_size
zero) is refused before anything starts, and the restart line, registered through Megatron Bridge's own training
callbacks, names the step that completed after the restart. The rest of in-process restart's tests:
tests/test_inprocess_restart.py."""

import inspect
import logging
import os
import unicodedata
from types import SimpleNamespace

from hypothesis import example, given, settings
from hypothesis import strategies as st
from nvidia_resiliency_ext.inprocess.utils import log_exc
from nvidia_resiliency_ext.inprocess.wrap import HealthCheckPassed

from launcher.restart import log as restart_log
from tests.srun_world import _world

pytest_plugins = ["tests.srun_world"]

ON = "inprocess_restart.enabled=true"
# Zero as a user may spell it: with leading zeros, and in the decimal digits of any script (str.isdigit takes them all).
ZEROS = st.text(st.characters(categories=["Nd"]).map(lambda d: chr(ord(d) - unicodedata.decimal(d))), min_size=1)


@settings(max_examples=8, deadline=None)
@given(zero=ZEROS)
@example(zero="0")
def test_no_active_ranks_is_refused_before_anything_starts(tmp_path_factory, zero):
    world = _world(tmp_path_factory.mktemp("world"), dict(os.environ), None)
    active = f"inprocess_restart.active_world_size={zero}"
    result = world.srun_sh("--local", "recipe.py", ON, active, env={"SRUNSH_GPUS_PER_NODE": "2"})

    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"srun.sh: inprocess_restart.active_world_size={zero!r} is not a positive rank count:"
        " e.g. inprocess_restart.active_world_size=8"
    ]
    assert not world.calls()
    assert world.run_dirs() == []  # no run folder taken either


def steps_as_megatron_bridge_counts_them(callbacks, state, count: int) -> None:
    """COUNT training steps in the order of Megatron Bridge 0.6.2's train() loop: on_train_step_end fires, then
    train_state.step counts the step (the order is checked against train()'s source by the test below)."""
    from megatron.bridge.training.callbacks import CallbackContext

    for _ in range(count):
        callbacks.fire("on_train_step_end", CallbackContext(state=state, model=[]))
        state.train_state.step += 1


def nvrx_says(level: int, message: str) -> None:
    logging.getLogger(restart_log.NVRX_LOGGER).log(level, message)


@settings(max_examples=10, deadline=None)
@given(resumed=st.integers(0, 10**6), lost=st.integers(1, 50))
def test_the_restart_line_names_the_step_completed_after_the_restart_not_the_one_before(
    tmp_path_factory, resumed, lost
):
    """Training restarts from its checkpoint of step RESUMED after LOST more steps, and the line comes with the next
    step that completes: step RESUMED + 1. The records are those the real Wrapper logs on the rank that raised."""
    from megatron.bridge.training import train
    from megatron.bridge.training.callbacks import CallbackManager
    from megatron.bridge.training.config import CheckpointConfig
    from megatron.bridge.training.state import GlobalState

    loop = inspect.getsource(train.train)
    assert loop.index('"on_train_step_end"') < loop.index("global_state.train_state.step += 1")
    run_dir = tmp_path_factory.mktemp("run")
    os.environ["RANK"] = "0"
    nvrx = logging.getLogger(restart_log.NVRX_LOGGER)
    callbacks, state, before = CallbackManager(), GlobalState(), list(nvrx.handlers)
    # What the line reads of the config: where the persistent checkpoints are (none here).
    state.cfg = SimpleNamespace(train=None, checkpoint=CheckpointConfig(save=str(run_dir / "checkpoints")))
    restart_log.register(callbacks, run_dir)
    try:
        state.train_state.step = resumed
        steps_as_megatron_bridge_counts_them(callbacks, state, lost)
        nvrx_says(logging.ERROR, log_exc(0, RuntimeError(f"injected fault at step {resumed + lost + 1}"), "fn_ex"))
        nvrx_says(logging.INFO, log_exc(0, HealthCheckPassed(), "restart_ex"))
        state.train_state.step = resumed  # loaded from the checkpoint
        steps_as_megatron_bridge_counts_them(callbacks, state, 2)
    finally:
        for handler in set(nvrx.handlers) - set(before):
            nvrx.removeHandler(handler)

    (line,) = (run_dir / "restarts.log").read_text().splitlines()
    assert f"; step {resumed + 1} completed " in line, line
