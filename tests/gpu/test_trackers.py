"""Experiment trackers on one GPU with no network (issue 68): `logger.wandb_project=x` and `logger.mlflow_experiment=x`
each train the tiny recipe through `srun.sh --local`, log offline into RUN_DIR, the launch's end prints the command
that uploads (W&B) or shows (MLflow) the record, and no file of the run nor its console holds the key or token that
the environment gave the ranks. TensorBoard's events are in RUN_DIR/tb_logs, as README says.

The GPU host needs wandb and mlflow-skinny at their versions.txt pins, importable by the ranks and by this test."""

import math
import secrets
from pathlib import Path

import pytest

from tests.gpu.conftest import Run, tail

pytestmark = pytest.mark.gpu

TINY = "tiny_gpt_pretrain.py"
STEPS = 5
# Values the code never saw: keys and tokens as a user exports them, and a proxy that refuses every connection, so
# that an attempt to reach the internet fails instead of going unnoticed on a host that has a route.
CREDENTIALS = {
    "WANDB_API_KEY": f"wandb-key-{secrets.token_hex(20)}",
    "MLFLOW_TRACKING_TOKEN": f"mlflow-token-{secrets.token_hex(12)}",
    "MLFLOW_TRACKING_USERNAME": f"mlflow-user-{secrets.token_hex(6)}",
    "MLFLOW_TRACKING_PASSWORD": f"mlflow-pass-{secrets.token_hex(12)}",
}
REFUSED = "http://127.0.0.1:9"
NO_NETWORK = {"HTTPS_PROXY": REFUSED, "HTTP_PROXY": REFUSED, "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_OFFLINE": "1"}
CHOICES = ("WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "https_proxy", "http_proxy")


def train_with(launch, monkeypatch: pytest.MonkeyPatch, tracker: str) -> Run:
    for name in CHOICES:  # the defaults under test, whatever this host's environment chose
        monkeypatch.delenv(name, raising=False)
    overrides = (f"train.train_iters={STEPS}", "validation.eval_interval=100", tracker)
    return launch(TINY, *overrides, gpus=1, env={**CREDENTIALS, **NO_NETWORK})


def assert_no_credential_kept(run: Run) -> None:
    assert run.run_dir is not None
    files = [path for path in run.run_dir.rglob("*") if path.is_file() and not path.is_symlink()]
    for name, value in CREDENTIALS.items():
        assert value not in run.log, name
        assert not [path for path in files if value.encode() in path.read_bytes()], name


def assert_tensorboard_events(run_dir: Path) -> None:
    assert list((run_dir / "tb_logs").glob("events.out.tfevents.*")), sorted(run_dir.iterdir())


def test_wandb_logs_offline_into_the_run_folder_and_the_launch_prints_its_upload(launch, record, monkeypatch):
    run = train_with(launch, monkeypatch, "logger.wandb_project=x")
    record(run, gpus=1, tracker="wandb offline")
    assert run.returncode == 0, tail(run)
    assert len(run.losses) == STEPS and all(math.isfinite(loss) for loss in run.losses.values())
    (offline,) = (run.run_dir / "wandb").glob("offline-run-*")
    (events,) = offline.glob("run-*.wandb")
    assert b"lm loss" in events.read_bytes()  # the training's metrics, as W&B recorded them for a later upload
    upload = f"wandb sync {run.run_dir}/wandb/offline-run-*"
    assert f"srun.sh: W&B logged offline; upload from a host with internet: {upload}" in run.log.splitlines()
    assert not (run.run_dir / "mlruns").exists()
    assert_tensorboard_events(run.run_dir)
    assert_no_credential_kept(run)


def test_mlflow_logs_to_a_file_store_in_the_run_folder_and_the_launch_prints_how_to_view_it(
    launch, record, monkeypatch
):
    run = train_with(launch, monkeypatch, "logger.mlflow_experiment=x")
    record(run, gpus=1, tracker="mlflow file store")
    assert run.returncode == 0, tail(run)
    mlruns = run.run_dir / "mlruns"
    view = f"MLFLOW_ALLOW_FILE_STORE=true mlflow server --backend-store-uri file:{mlruns}"
    assert f"srun.sh: MLflow logged to {mlruns}; view it: {view}" in run.log.splitlines()
    # Read back with MLflow's own client, as its server reads the store.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{mlruns}")
    (logged,) = client.search_runs([client.get_experiment_by_name("x").experiment_id])
    assert (logged.info.run_name, logged.info.status) == (run.run_dir.name, "FINISHED")
    losses = {metric.step: metric.value for metric in client.get_metric_history(logged.info.run_id, "lm loss")}
    assert STEPS in losses and all(math.isfinite(loss) for loss in losses.values()), losses
    assert not list(mlruns.rglob("artifacts/*/iter_*"))  # no copy of a checkpoint beside the checkpoints
    assert not (run.run_dir / "wandb").exists()
    assert_tensorboard_events(run.run_dir)
    assert_no_credential_kept(run)
