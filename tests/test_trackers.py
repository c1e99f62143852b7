"""Experiment trackers (launcher/trackers.py): W&B and MLflow, turned on by an override, are checked before any rank
trains (on the launching host where it runs the ranks' Python), log offline into the run's folder unless the user
chose otherwise, get their keys from the environment and leave them out of every file of the run; the launch's end
prints the command that uploads or shows what they wrote. TensorBoard's events stay where README says."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml

import entrypoint
from launcher import trackers
from launcher.errors import UsageError
from tests.conftest import REPO
from tests.srun_world import SrunWorld

pytest_plugins = ["tests.srun_world"]

TINY = str(REPO / "recipes" / "tiny_gpt_pretrain.py")
# Keys and tokens a user of the trackers exports, and an environment's other common variables, credentials among them.
SECRETS = {
    "WANDB_API_KEY": "wandb-key-5f1c0ffee0ddba11",
    "MLFLOW_TRACKING_TOKEN": "mlflow-token-9e8d7c6b5a",
    "MLFLOW_TRACKING_USERNAME": "mlflow-user-alice",
    "MLFLOW_TRACKING_PASSWORD": "mlflow-pass-hunter2",
    "AWS_SECRET_ACCESS_KEY": "aws-secret-wJalrXUtnFEMI",
    "GITHUB_TOKEN": "ghp-token-0123456789abcdef",
    "HF_TOKEN": "hf-token-abcdefghijkl",
    "HTTPS_PROXY": "http://proxyuser:proxy-pass-s3cr3t@proxy.example.com:3128",
}
COMMON = {"LANG": "C.UTF-8", "TERM": "xterm-256color", "EDITOR": "vim", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1"}


def resolve(*argv: str):
    cfg, _ = entrypoint.resolve(entrypoint.parse_args([TINY, *argv, "--world-size", "1"]))
    return cfg


@pytest.fixture(scope="module")
def python_without_trackers(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python whose environment holds every package of this one but wandb and mlflow: the image of a user who built
    it before versions.txt pinned them."""
    env = tmp_path_factory.mktemp("no-trackers")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    ours = Path(sysconfig.get_paths()["purelib"])
    theirs = Path(subprocess.run(
        [env / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip())  # fmt: skip
    for entry in ours.iterdir():
        if not entry.name.lower().startswith(("wandb", "mlflow")):
            (theirs / entry.name).symlink_to(entry)
    return str(env / "bin" / "python")


def test_a_tracker_turned_on_logs_offline_into_the_run_folder_named_after_the_run(output_root: Path, monkeypatch):
    for name in ("WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)
    cfg = resolve("logger.wandb_project=team-x", "logger.mlflow_experiment=exp-y")
    run_dir = output_root / "tiny_gpt_pretrain" / "test-run"
    assert (cfg.logger.wandb_project, cfg.logger.wandb_exp_name) == ("team-x", "test-run")
    assert cfg.logger.wandb_save_dir == str(run_dir)  # W&B writes RUN_DIR/wandb/
    assert (cfg.logger.mlflow_experiment, cfg.logger.mlflow_run_name) == ("exp-y", "test-run")
    assert cfg.logger.mlflow_tracking_uri == f"file:{run_dir}/mlruns"
    assert cfg.logger.mlflow_log_artifacts is False  # no copy of each checkpoint beside the checkpoints
    assert cfg.env_vars["WANDB_MODE"] == "offline" and cfg.env_vars["MLFLOW_ALLOW_FILE_STORE"] == "true"
    assert cfg.logger.tensorboard_dir == str(run_dir / "tb_logs")


def test_the_users_own_tracker_settings_win(output_root: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    cfg = resolve("logger.wandb_project=x", "logger.mlflow_experiment=y", "logger.mlflow_run_name=mine")
    assert cfg.env_vars["WANDB_MODE"] == "online"
    assert cfg.logger.wandb_save_dir == str(tmp_path / "wandb-home")
    assert cfg.logger.mlflow_tracking_uri is None  # MLflow reads MLFLOW_TRACKING_URI itself
    assert (cfg.logger.mlflow_run_name, cfg.logger.mlflow_log_artifacts) == ("mine", True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    given = resolve("logger.mlflow_experiment=y", "logger.mlflow_log_artifacts=true")
    assert given.logger.mlflow_log_artifacts is True
    assert resolve("logger.wandb_project=x", "+env_vars.WANDB_MODE=disabled").env_vars["WANDB_MODE"] == "disabled"
    elsewhere = resolve("logger.mlflow_experiment=y", f"logger.mlflow_tracking_uri=file:{tmp_path}/store")
    assert (elsewhere.logger.mlflow_tracking_uri, elsewhere.logger.mlflow_log_artifacts) == (
        f"file:{tmp_path}/store",
        True,
    )


@pytest.mark.parametrize(
    ("override", "switch"),
    [
        ("logger.wandb_exp_name=run-7", "wandb_project"),
        ("logger.wandb_entity=my-team", "wandb_project"),
        ("logger.wandb_save_dir=/tmp/w", "wandb_project"),
        ("logger.mlflow_run_name=run-7", "mlflow_experiment"),
        ("logger.mlflow_tracking_uri=http://127.0.0.1:5000", "mlflow_experiment"),
        ("logger.mlflow_tags={team: x}", "mlflow_experiment"),
    ],
)
def test_a_tracker_field_without_its_tracker_is_refused(output_root: Path, override: str, switch: str):
    field = override.split("=", 1)[0]
    with pytest.raises(UsageError) as refused:
        resolve(override)
    assert str(refused.value) == f"{field} is set, but nothing is logged without logger.{switch}: set it too"


@pytest.mark.parametrize(
    ("switch", "package", "image"), [("wandb_project", "wandb", ""), ("mlflow_experiment", "mlflow", "/fsx/old.sqsh")]
)
def test_a_tracker_the_ranks_python_cannot_import_is_refused_before_training(
    python_without_trackers: str, tmp_path: Path, switch: str, package: str, image: str
):
    in_image = {"RUN_DIR": str(tmp_path / "run"), "SRUNSH_SQSH": image} if image else {}
    result = subprocess.run(
        [python_without_trackers, str(REPO / "entrypoint.py"), TINY, f"logger.{switch}=x", "--check"],
        capture_output=True, text=True, timeout=300, check=False, cwd=tmp_path,
        env={**os.environ, "OUTPUT_ROOT": str(tmp_path / "outputs"), **in_image},
    )  # fmt: skip
    if image:
        fix = f"the image {image} lacks it: rebuild it with 'make build', or point SRUNSH_SQSH at an image that has it"
    else:
        fix = (
            f"install it with PYTHON={python_without_trackers} bash tools/install_python_stack.sh, or set SRUNSH_PYTHON"
        )
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"entrypoint.py: error: logger.{switch} needs {package}, which {python_without_trackers} cannot import: {fix}\n"
    )


@pytest.mark.parametrize("options", [("--local",), ("--dry-run", "--no-container")])
def test_srun_sh_refuses_a_tracker_the_ranks_python_cannot_import_before_anything_starts(
    srun_world: SrunWorld, python_without_trackers: str, options: tuple[str, ...]
):
    result = srun_world.srun_sh(
        *options, TINY, "train.train_iters=3", "logger.mlflow_experiment=exp", "logger.wandb_project=proj",
        env={"SRUNSH_PYTHON": python_without_trackers},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        f"srun.sh: logger.wandb_project needs wandb, which SRUNSH_PYTHON={python_without_trackers} cannot import:"
        f" install it with PYTHON={python_without_trackers} bash tools/install_python_stack.sh (versions.txt pins it)\n"
    )
    assert result.stdout == "" and not (srun_world.dir / "outputs").exists()


def test_srun_sh_takes_a_tracker_the_ranks_python_imports_and_one_turned_off(
    srun_world: SrunWorld, python_without_trackers: str
):
    for python, tracker in (
        (sys.executable, "logger.wandb_project=proj"),
        (python_without_trackers, "logger.wandb_project=null"),
    ):
        result = srun_world.srun_sh("--dry-run", "--no-container", TINY, tracker, env={"SRUNSH_PYTHON": python})
        assert result.returncode == 0, result.stderr


def test_keys_reach_the_ranks_through_the_environment_and_no_file_of_the_run(srun_world: SrunWorld):
    env = {**COMMON, **SECRETS, "SRUNSH_GPUS_PER_NODE": "2", "SRUNSH_HANG_TIMEOUT_S": "off"}
    result = srun_world.srun_sh("--local", "recipe.py", "logger.wandb_project=x", "logger.mlflow_experiment=y", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    records = srun_world.records()
    assert sorted(records) == [0, 1]
    for record in records.values():
        assert {name: record["env"].get(name) for name in SECRETS} == SECRETS
    secrets = [*SECRETS.values(), "proxy-pass-s3cr3t"]
    (run_dir,) = srun_world.run_dirs()
    written = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    assert {"launch-plan.json", "launcher.log", "rank-0.log"} <= {path.name for path in written}
    for secret in secrets:
        assert not [path for path, data in written.items() if secret.encode() in data], secret
        assert secret not in result.stdout + result.stderr


def test_the_run_record_holds_no_key(output_root: Path, monkeypatch: pytest.MonkeyPatch):
    for name, value in {**COMMON, **SECRETS}.items():
        monkeypatch.setenv(name, value)
    uri = "logger.mlflow_tracking_uri='https://bob:mlflow-url-pa55@mlflow.example.com/api?token=mlflow-url-t0k3n'"
    argv = [TINY, "logger.wandb_project=x", "logger.mlflow_experiment=y", uri]
    monkeypatch.setattr(sys, "argv", ["entrypoint.py", *argv])
    cfg = resolve(*argv[1:])
    run_dir = output_root / "tiny_gpt_pretrain" / "test-run"
    entrypoint.outputs.save_run_record(cfg, run_dir)
    text = (run_dir / "config.yaml").read_text() + (run_dir / "launch.json").read_text()
    for secret in [*SECRETS.values(), "proxy-pass-s3cr3t", "mlflow-url-pa55", "mlflow-url-t0k3n"]:
        assert secret not in text
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["logger"]["mlflow_tracking_uri"] == "https://REDACTED@mlflow.example.com/api?REDACTED"
    assert config["logger"]["wandb_project"] == "x"
    assert not set(SECRETS) & set(json.loads((run_dir / "launch.json").read_text())["environment"])


def offline_runs(run_dir: Path) -> None:
    """What W&B and MLflow write offline into RUN_DIR, made by themselves as Megatron Bridge's last rank calls them."""
    program = f"""
import mlflow, wandb
wandb.init(dir={str(run_dir)!r}, project="x", name="r")
wandb.log({{"loss": 1.0}}, step=1)
wandb.finish()
mlflow.set_tracking_uri({f"file:{run_dir}/mlruns"!r})
mlflow.set_experiment("y")
with mlflow.start_run(run_name="r"):
    mlflow.log_metrics({{"loss": 1.0}}, step=1)
"""
    env = {**os.environ, "WANDB_MODE": "offline", "MLFLOW_ALLOW_FILE_STORE": "true", "WANDB_SILENT": "true"}
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=300, capture_output=True)


def test_the_printed_commands_name_what_the_trackers_wrote(tmp_path: Path, capfd: pytest.CaptureFixture[str]):
    run_dir = tmp_path / "outputs with space" / "it's-a-run"
    run_dir.mkdir(parents=True)
    offline_runs(run_dir)
    trackers.say_uploads(str(run_dir))
    wandb_line, mlflow_line = capfd.readouterr().err.splitlines()
    upload = wandb_line.split(": ", 2)[2]
    assert upload.startswith("wandb sync ")
    # The command as a shell runs it, with wandb standing in for itself: it is handed each offline run's folder.
    handed = subprocess.run(["bash", "-c", f"wandb() {{ printf '%s\\n' \"$@\"; }}; {upload}"],
                            capture_output=True, text=True, check=True).stdout.splitlines()  # fmt: skip
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert handed == ["sync", *map(str, runs)] and runs
    view = mlflow_line.split("view it: ", 1)[1]
    store = subprocess.run(["bash", "-c", f"mlflow() {{ printf '%s\\n' \"$@\"; }}; {view}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()[-1]  # fmt: skip
    assert store == f"file:{run_dir}/mlruns"
    assert trackers.say_uploads(str(tmp_path)) is None and capfd.readouterr().err == ""


@pytest.mark.parametrize("fail", [False, True])
def test_every_end_of_a_launch_prints_what_uploads_the_offline_records(srun_world: SrunWorld, fail: bool):
    run_dir = srun_world.dir / "outputs" / "recipe" / "earlier-run"
    (run_dir / "wandb" / "offline-run-20261201_101500-abc123").mkdir(parents=True)
    (run_dir / "mlruns").mkdir()
    env = {"SRUNSH_RUN_ID": "earlier-run", "SRUNSH_GPUS_PER_NODE": "1", "FAKE_FAIL_RANK": "0" if fail else ""}
    result = srun_world.srun_sh("--local", "recipe.py", env=env)
    assert result.returncode == (1 if fail else 0), result.stderr[-3000:]
    assert result.stderr.splitlines()[-2:] == [
        f"srun.sh: W&B logged offline; upload from a host with internet: wandb sync {run_dir}/wandb/offline-run-*",
        f"srun.sh: MLflow logged to {run_dir}/mlruns; view it: MLFLOW_ALLOW_FILE_STORE=true mlflow server"
        f" --backend-store-uri file:{run_dir}/mlruns",
    ]


def test_readme_and_help_name_the_trackers_and_where_they_write(srun_world: SrunWorld):
    shown = srun_world.srun_sh("--help").stdout
    readme = (REPO / "README.md").read_text()
    for text in (shown, readme):
        for name in ("logger.wandb_project=NAME", "logger.mlflow_experiment=NAME", "tb_logs", "WANDB_API_KEY"):
            assert name in text, name
        assert "WANDB_MODE" in text and "MLFLOW_TRACKING_URI" in text and "wandb sync" in text
    assert "`tensorboard --logdir outputs/<recipe>`" in readme
