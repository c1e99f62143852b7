"""The image build: static checks of the Dockerfile, and enroot.sh and the Makefile run as a user would.

Docker and enroot cannot run here, so the scripts run with PATH holding only a few system tools and the recording
stand-ins of tests/fixtures/image; each test checks the exact commands they received.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).resolve().parent / "fixtures" / "image"
SYSTEM_TOOLS = ("bash", "make", "sed", "rm", "mkdir", "cat", "find")
PIN_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def image_pins(versions: Path = REPO / "versions.txt") -> list[tuple[str, str]]:
    """The NAME=VALUE lines of the [image] section, in file order."""
    pins, section = [], None
    for line in versions.read_text().splitlines():
        if line.startswith("["):
            section = line.strip()
        elif section == "[image]" and (match := PIN_LINE.match(line)):
            pins.append((match[1], match[2]))
    return pins


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [tuple(line.split(None, 1)) for line in lines if line and not line.startswith("#")]


def repo_tool(name: str) -> str:
    for candidate in (Path(sys.executable).parent / name, REPO / ".venv" / "bin" / name):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: run `bash tools/setup_test_env.sh` to create the test environment")
    return found


class Sandbox:
    """A temporary world: a bin folder that PATH points at, a log of stand-in calls, a work folder."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.work = root / "work"
        self.log = root / "calls.jsonl"
        self.bin.mkdir()
        self.work.mkdir()
        self.log.touch()
        (self.bin / "python3").symlink_to(sys.executable)
        for tool in SYSTEM_TOOLS:
            (self.bin / tool).symlink_to(shutil.which(tool))
        self.env = {"PATH": str(self.bin), "HOME": str(root), "LC_ALL": "C.UTF-8", "IMAGE_STANDIN_LOG": str(self.log)}

    def provide(self, *standins: str) -> None:
        for name in standins:
            (self.bin / name).symlink_to(STANDINS / name)

    def copy_from_repo(self, *names: str) -> None:
        for name in names:
            shutil.copy2(REPO / name, self.work / name)

    def run(self, *argv: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            argv, cwd=self.work, env={**self.env, **env}, capture_output=True, text=True, timeout=60, check=False
        )

    def enroot_sh(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return self.run("bash", str(REPO / "enroot.sh"), *args, **env)

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def sandbox():
    with tempfile.TemporaryDirectory(prefix="image-test-") as root:
        box = Sandbox(Path(root))
        (box.work / "Dockerfile").write_text("FROM scratch\n")
        yield box


# --- the Dockerfile, read statically ----------------------------------------------------------------------------


def test_dockerfile_passes_hadolint():
    result = subprocess.run(
        [repo_tool("hadolint"), "Dockerfile"], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def shell_scripts() -> list[Path]:
    skip = {".venv", ".git", ".devkit"}
    return sorted(p for p in REPO.rglob("*.sh") if not skip & set(p.relative_to(REPO).parts))


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda p: str(p.relative_to(REPO)))
def test_shell_script_passes_shellcheck(script):
    result = subprocess.run([repo_tool("shellcheck"), str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_image_pin_is_a_dockerfile_arg_without_default():
    args = [rest for instruction, rest in dockerfile_instructions() if instruction == "ARG"]
    assert not [arg for arg in args if "=" in arg], "an ARG with a default would hide a pin missing from make build"
    assert set(args) == {name for name, _ in image_pins()}


def test_every_image_pin_has_a_value():
    assert image_pins(), "versions.txt has no [image] section"
    assert [name for name, value in image_pins() if not value] == []


def test_dockerfile_trusts_only_signed_or_checksummed_downloads():
    text = "\n".join(rest for _, rest in dockerfile_instructions())
    assert "--allow-unauthenticated" not in text
    assert "apt-key" not in text
    assert "[trusted=yes]" not in text
    assert "signed-by=" in text
    assert "sha512sum --check" in text
    assert "--verify" in text


def test_git_sources_are_checked_out_at_pinned_refs():
    runs = [rest for instruction, rest in dockerfile_instructions() if instruction == "RUN"]
    steps = [step.strip() for run in runs for step in run.split("&&")]
    clones = [i for i, step in enumerate(steps) if step.startswith("git clone")]
    assert len(clones) == 4  # GDRCopy, NCCL, nccl-tests, DeepEP
    for i in clones:
        pinned_clone = re.search(r'--branch "\$\{[A-Z_]+\}"', steps[i])
        pinned_checkout = re.search(r'checkout --detach "\$\{[A-Z_]+\}"', steps[i + 1])
        assert pinned_clone or pinned_checkout, f"unpinned git source: {steps[i]}"


def test_our_code_is_copied_in_the_last_layer_after_the_python_stack():
    instructions = dockerfile_instructions()
    assert instructions[-1] == ("COPY", ". /workspace/megatron")
    copies = [rest for instruction, rest in instructions[:-1] if instruction == "COPY"]
    assert copies == [
        "versions.txt /opt/toolkit/versions.txt",
        "tools/install_python_stack.sh /opt/toolkit/tools/install_python_stack.sh",
    ]


def test_build_checks_imports_of_the_whole_stack():
    last_run = [rest for instruction, rest in dockerfile_instructions() if instruction == "RUN"][-1]
    for module in ("torch", "transformer_engine", "megatron.core", "megatron.bridge", "deep_ep", "viztracer"):
        assert module in last_run


def test_build_context_leaves_out_squash_files_and_the_venv():
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert {"*.sqsh", ".venv", ".git"} <= set(ignored)


# --- enroot.sh --------------------------------------------------------------------------------------------------


def test_enroot_builds_then_imports_default_sqsh(sandbox):
    sandbox.provide("docker", "enroot")
    result = sandbox.enroot_sh()
    assert result.returncode == 0, result.stderr
    assert sandbox.calls() == [
        ["docker", "build", "-f", "Dockerfile", "-t", "megatron-lm:latest", "."],
        ["enroot", "import", "-o", "./megatron-lm+latest.sqsh", "dockerd://megatron-lm:latest"],
    ]
    assert (sandbox.work / "megatron-lm+latest.sqsh").is_file()


def test_enroot_names_sqsh_after_image_and_tag(sandbox):
    sandbox.provide("docker", "enroot")
    (sandbox.work / "out").mkdir()
    result = sandbox.enroot_sh("-n", "team/megatron:v1", "-o", "out/", "-f", "Dockerfile", "-i", ".")
    assert result.returncode == 0, result.stderr
    assert sandbox.calls()[1] == ["enroot", "import", "-o", "out/team+megatron+v1.sqsh", "dockerd://team/megatron:v1"]
    assert (sandbox.work / "out" / "team+megatron+v1.sqsh").is_file()


def test_enroot_keeps_registry_port_out_of_the_tag(sandbox):
    sandbox.provide("docker", "enroot")
    result = sandbox.enroot_sh("--image", "registry:5000/megatron")
    assert result.returncode == 0, result.stderr
    assert sandbox.calls()[0][5] == "registry:5000/megatron:latest"


def test_enroot_forwards_arguments_after_double_dash_to_docker_build(sandbox):
    sandbox.provide("docker", "enroot")
    result = sandbox.enroot_sh("-n", "m:t", "--", "--build-arg", "A=1", "--label", "note=two words")
    assert result.returncode == 0, result.stderr
    build_args = ["--build-arg", "A=1", "--label", "note=two words"]
    assert sandbox.calls()[0] == ["docker", "build", "-f", "Dockerfile", "-t", "m:t", *build_args, "."]


def test_enroot_replaces_stale_sqsh(sandbox):
    sandbox.provide("docker", "enroot")
    stale = sandbox.work / "megatron-lm+latest.sqsh"
    stale.write_text("old build\n")
    result = sandbox.enroot_sh()
    assert result.returncode == 0, result.stderr
    assert stale.read_text() == "squashfs stand-in for dockerd://megatron-lm:latest\n"
    assert "removing stale ./megatron-lm+latest.sqsh" in result.stdout


def test_enroot_fails_clearly_when_docker_is_missing(sandbox):
    sandbox.provide("enroot")
    result = sandbox.enroot_sh()
    assert result.returncode != 0
    assert result.stderr.strip() == "enroot.sh: docker not found on PATH: build on a host with Docker installed"
    assert sandbox.calls() == []


def test_enroot_fails_before_building_when_enroot_is_missing(sandbox):
    sandbox.provide("docker")
    result = sandbox.enroot_sh()
    assert result.returncode != 0
    assert result.stderr.strip().startswith("enroot.sh: enroot not found on PATH")
    assert len(result.stderr.strip().splitlines()) == 1
    assert sandbox.calls() == []


def test_enroot_stops_when_docker_build_fails(sandbox):
    sandbox.provide("docker", "enroot")
    previous = sandbox.work / "megatron-lm+latest.sqsh"
    previous.write_text("last good build\n")
    result = sandbox.enroot_sh(STANDIN_DOCKER_BUILD_EXIT="3")
    assert result.returncode != 0
    assert "docker build of megatron-lm:latest failed" in result.stderr
    assert [call[0] for call in sandbox.calls()] == ["docker"]
    assert previous.read_text() == "last good build\n"


def test_enroot_fails_when_import_fails(sandbox):
    sandbox.provide("docker", "enroot")
    result = sandbox.enroot_sh(STANDIN_ENROOT_IMPORT_EXIT="1")
    assert result.returncode != 0
    assert "enroot import of megatron-lm:latest failed" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [["--bogus"], ["-n"], ["-o", ""], ["positional"]],
    ids=["unknown-option", "option-without-value", "empty-value", "positional-argument"],
)
def test_enroot_rejects_bad_arguments_before_running_anything(sandbox, argv):
    sandbox.provide("docker", "enroot")
    result = sandbox.enroot_sh(*argv)
    assert result.returncode == 2
    assert result.stderr.startswith("enroot.sh: ")
    assert "usage:" in result.stderr
    assert sandbox.calls() == []


def test_enroot_rejects_missing_output_directory(sandbox):
    sandbox.provide("docker", "enroot")
    result = sandbox.enroot_sh("-o", "no/such/dir")
    assert result.returncode != 0
    assert result.stderr.strip() == "enroot.sh: output directory 'no/such/dir' does not exist"
    assert sandbox.calls() == []


def test_enroot_help_exits_zero_without_running_anything(sandbox):
    sandbox.provide("docker", "enroot")
    result = sandbox.enroot_sh("-h")
    assert result.returncode == 0
    assert result.stdout.startswith("usage:")
    assert sandbox.calls() == []


# --- the Makefile -----------------------------------------------------------------------------------------------


@pytest.fixture
def checkout(sandbox):
    """The sandbox's work folder as a checkout: the files the Makefile reads, and empty setup scripts."""
    sandbox.copy_from_repo("Makefile", "enroot.sh", "versions.txt", "Dockerfile")
    (sandbox.work / "tools").mkdir()
    for script in ("setup_test_env.sh", "install_python_stack.sh"):
        (sandbox.work / "tools" / script).touch()
    return sandbox


def test_make_build_passes_every_image_pin_as_build_arg(checkout):
    checkout.provide("docker", "enroot")
    result = checkout.run("make", "build")
    assert result.returncode == 0, result.stderr
    build_args = [arg for name, value in image_pins() for arg in ("--build-arg", f"{name}={value}")]
    assert checkout.calls() == [
        ["docker", "build", "-f", "Dockerfile", "-t", "megatron-lm:latest", *build_args, "."],
        ["enroot", "import", "-o", "./megatron-lm+latest.sqsh", "dockerd://megatron-lm:latest"],
    ]


def test_make_sqsh_honours_image_name_tag_and_output_dir(checkout):
    checkout.provide("docker", "enroot")
    (checkout.work / "images").mkdir()
    result = checkout.run("make", "sqsh", "IMAGE_NAME=team/megatron", "TAG=v2", "OUTPUT_DIR=images")
    assert result.returncode == 0, result.stderr
    assert checkout.calls()[0][5] == "team/megatron:v2"
    assert checkout.calls()[1][3] == "images/team+megatron+v2.sqsh"
    assert (checkout.work / "images" / "team+megatron+v2.sqsh").is_file()


def test_make_build_refuses_an_image_pin_without_value(checkout):
    checkout.provide("docker", "enroot")
    versions = checkout.work / "versions.txt"
    versions.write_text(re.sub(r"^NCCL_VERSION=.*$", "NCCL_VERSION=", versions.read_text(), flags=re.M))
    result = checkout.run("make", "build")
    assert result.returncode != 0
    assert "[image] pin without a value: NCCL_VERSION" in result.stderr
    assert checkout.calls() == []


def test_make_build_fails_when_docker_build_fails(checkout):
    checkout.provide("docker", "enroot")
    result = checkout.run("make", "build", STANDIN_DOCKER_BUILD_EXIT="1")
    assert result.returncode != 0
    assert [call[0] for call in checkout.calls()] == ["docker"]


def test_make_clean_removes_image_and_squash_file(checkout):
    checkout.provide("docker")
    sqsh = checkout.work / "megatron-lm+v3.sqsh"
    sqsh.write_text("image\n")
    result = checkout.run("make", "clean", "TAG=v3")
    assert result.returncode == 0, result.stderr
    assert checkout.calls() == [["docker", "rmi", "-f", "megatron-lm:v3"]]
    assert not sqsh.exists()


def test_make_clean_works_without_docker(checkout):
    sqsh = checkout.work / "megatron-lm+latest.sqsh"
    sqsh.write_text("image\n")
    result = checkout.run("make", "clean")
    assert result.returncode == 0, result.stderr
    assert not sqsh.exists()


def test_make_test_sets_up_the_venv_lints_then_runs_pytest_in_it(checkout):
    result = checkout.run("make", "--dry-run", "test")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "bash tools/setup_test_env.sh"
    assert lines[-1] == ". .venv/bin/activate && pytest"
    assert [line.split()[0] for line in lines[1:-1]] == [
        ".venv/bin/ruff",
        ".venv/bin/ruff",
        ".venv/bin/shellcheck",
        ".venv/bin/hadolint",
    ]


def test_make_lint_runs_ruff_shellcheck_and_hadolint_once_the_venv_exists(checkout):
    (checkout.work / ".venv").mkdir()
    stamp = checkout.work / ".venv" / ".installed"
    stamp.touch()
    newest = max(p.stat().st_mtime for p in checkout.work.rglob("*") if p.is_file())
    os.utime(stamp, (newest + 1, newest + 1))
    result = checkout.run("make", "--dry-run", "lint")
    assert result.returncode == 0, result.stderr
    commands = result.stdout.splitlines()
    assert commands[:2] == [".venv/bin/ruff check .", ".venv/bin/ruff format --check ."]
    assert commands[2].startswith(".venv/bin/shellcheck ") and "./enroot.sh" in commands[2].split()
    assert commands[3] == ".venv/bin/hadolint Dockerfile"
