"""The image build: static checks of the Dockerfile, and enroot.sh and the Makefile run as a user would.

Docker and enroot cannot run here, so the scripts run with PATH holding only a few system tools and the recording
stand-ins of tests/fixtures/image; each test checks the exact commands they received. The build context is the one
the docker CLI itself packs, caught by a stand-in daemon.
"""

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docker_context import checkout_files, docker_build_context
from tests.dockerfile_model import copy_sources_and_destination, image_pins, instructions, repo_tool

REPO = Path(__file__).resolve().parents[1]
STANDINS = Path(__file__).resolve().parent / "fixtures" / "image"
SYSTEM_TOOLS = ("bash", "make", "sed", "rm", "mkdir", "cat", "find")


def dockerfile_instructions(dockerfile: str | None = None) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile (or of the text given), as dockerfile-parse reads them."""
    text = (REPO / "Dockerfile").read_text() if dockerfile is None else dockerfile
    return [(instruction.name, instruction.value) for instruction in instructions(text)]


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
    skip = {".venv", ".git", ".devkit", ".deepep"}
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


def test_apt_trusts_only_signed_repositories():
    text = "\n".join(rest for _, rest in dockerfile_instructions())
    assert "--allow-unauthenticated" not in text
    assert "apt-key" not in text
    assert "[trusted=yes]" not in text


# --- what the image build downloads, parsed -----------------------------------------------------------------------
#
# Each RUN step is split into its shell commands as POSIX sh tokenizes them (shlex). A download passes only when the
# same step verifies it, with one of the idioms the Dockerfile uses, before anything else touches it:
#   FROM                   pinned by a *_DIGEST pin: image:tag@${PIN}
#   curl/wget to a file    `echo "${*_SHA512}  FILE" | sha512sum --check`, with the sum pinned in versions.txt; or
#                          `gpg --verify` (or the key's `gpg --import`), with the signer's fingerprint compared
#                          (grep of gpg's VALIDSIG status against a pinned fingerprint)
#   curl | gpg --dearmor   an apt key: the step lists its fingerprints and compares them with a *_FINGERPRINT pin
#   git clone              at a pinned tag (--branch "${PIN}"), or checked out at a *_COMMIT pin compared with HEAD
#   ADD URL                only with --checksum
# A download piped into anything else (a shell, tar) is never verified. A new kind of download needs its idiom here.

SEPARATORS = {"&&", "||", ";", "(", ")", "&", "|"}
KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}"}
REDIRECTIONS = {">", ">>", "<", ">&", "&>", ">|"}
ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
CHECKSUM_TOOLS = {"sha256sum", "sha512sum"}
FINGERPRINT = re.compile(r"^[0-9A-F]{40}$")


@dataclass
class Command:
    pipeline: int  # commands of one pipeline share this number
    words: list[str]  # without leading keywords and assignments; a redirection is one word: ">/tmp/x"

    @property
    def name(self) -> str:
        return self.words[0]

    def names(self, path: str) -> bool:
        """Whether an argument is path, or holds it as a whitespace-separated part (echo "SUM  path")."""
        return any(part == path or part.endswith("/" + path) for word in self.words[1:] for part in word.split())

    def uses(self, variable: str) -> bool:
        return any("${" + variable + "}" in word for word in self.words)


def shell_commands(run: str) -> tuple[list[Command], dict[str, str]]:
    """The commands of a RUN step in order, and the variables it assigns."""
    lexer = shlex.shlex(run, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, assigned, words, pipeline = [], {}, [], 0
    tokens = iter(lexer)
    for token in tokens:
        if token in SEPARATORS:
            if words:
                commands.append(Command(pipeline, words))
            words = []
            pipeline += token != "|"
        elif token in REDIRECTIONS:
            words.append(token + next(tokens, ""))
        elif not words and token in KEYWORDS:
            continue
        elif not words and (assignment := ASSIGNMENT.match(token)):
            assigned[assignment[1]] = assignment[2]
        else:
            words.append(token)
    if words:
        commands.append(Command(pipeline, words))
    return commands, assigned


def option_value(words: list[str], *options: str) -> str | None:
    for option, value in itertools.pairwise(words):
        if option in options:
            return value
    return None


def fetched(command: Command) -> tuple[str, str | None] | None:
    """(source, file written) of a curl or wget command; the file is None when the download goes to stdout.

    curl writes a file with -o FILE (also in a cluster: -fsSLo FILE), -O (the URL's name) or a redirection; wget with
    -O FILE ("-": stdout), and otherwise under the URL's name."""
    if command.name not in ("curl", "wget"):
        return None
    output_letter = "o" if command.name == "curl" else "O"
    sources: list[str] = []
    output, remote_name = None, command.name == "wget"
    words = iter(command.words[1:])
    for word in words:
        short = word.startswith("-") and not word.startswith("--")
        if word.startswith(">") and not word.startswith(">&"):
            output = word.lstrip(">")
        elif short and word.endswith(output_letter + "-"):
            output = "-"
        elif word in ("--output", "--output-document") or (short and word.endswith(output_letter)):
            output = next(words, None)
        elif command.name == "curl" and (word == "--remote-name" or (short and "O" in word)):
            remote_name = True
        elif word in ("-H", "--header", "-u", "--user", "--retry"):
            next(words, None)
        elif not word.startswith("-"):
            sources.append(word)
    source = sources[-1] if sources else "(no URL)"
    if output is None and remote_name:
        output = source.rsplit("/", 1)[-1]
    return source, None if output in (None, "-") else output


def signer_is_pinned(commands: list[Command], assigned: dict[str, str], pins: set[str]) -> bool:
    """Whether the step compares gpg's VALIDSIG status with a pinned fingerprint."""
    fingerprints = {name for name, value in assigned.items() if FINGERPRINT.match(value)}
    fingerprints |= {name for name in pins if name.endswith("_FINGERPRINT")}
    return any(
        command.name == "grep" and any("VALIDSIG" in word for word in command.words) and command.uses(name)
        for command in commands
        for name in fingerprints
    )


def file_verified(
    path: str, later: list[Command], commands: list[Command], assigned: dict[str, str], pins: set[str]
) -> bool:
    """Whether the first pipeline after the download that names path verifies it."""
    first = next((command for command in later if command.names(path)), None)
    if first is None:
        return False
    pipeline = [command for command in later if command.pipeline == first.pipeline]
    checksum_pins = [name for name in pins if name.endswith(("_SHA256", "_SHA512"))]
    checked = any(
        command.name in CHECKSUM_TOOLS and {"--check", "-c"} & set(command.words) for command in pipeline
    ) and any(command.uses(name) for command in pipeline for name in checksum_pins)
    signed = (
        first.name in ("gpg", "gpgv")
        and {"--verify", "--import"} & set(first.words)
        and signer_is_pinned(commands, assigned, pins)
    )
    return bool(checked or signed)


def key_verified(keyring: str, later: list[Command], pins: set[str]) -> bool:
    """Whether the step lists the keyring's fingerprints, then compares them with a *_FINGERPRINT pin."""
    first = next((command for command in later if command.names(keyring)), None)
    if first is None or first.name != "gpg":
        return False
    after = later[later.index(first) + 1 :]
    fingerprints = [name for name in pins if name.endswith("_FINGERPRINT")]
    return any(command.name in ("[", "test") and command.uses(name) for command in after for name in fingerprints)


def clone_pinned(clone: Command, later: list[Command], pins: set[str]) -> bool:
    """At a pinned tag (--branch "${PIN}"), or checked out at a *_COMMIT pin that the step compares with HEAD."""
    branch = option_value(clone.words, "--branch", "-b")
    if branch is not None:
        return branch in {"${" + name + "}" for name in pins}
    return any(commit_verified(name, later) for name in pins if name.endswith("_COMMIT"))


def commit_verified(name: str, later: list[Command]) -> bool:
    """Whether the step checks out the *_COMMIT pin name and compares HEAD with it."""
    checked_out = any(command.name == "git" and "checkout" in command.words and command.uses(name) for command in later)
    compared = any(
        command.name in ("[", "test") and command.uses(name) and any("rev-parse HEAD" in word for word in command.words)
        for command in later
    )
    return checked_out and compared


def fetch_pinned(fetch: Command, later: list[Command], pins: set[str]) -> bool:
    """A fetch by hash of a *_COMMIT pin, which the step then checks out and compares with HEAD."""
    commits = [name for name in pins if name.endswith("_COMMIT") and fetch.uses(name)]
    return any(commit_verified(name, later) for name in commits)


def git_download_problem(git: Command, earlier: list[Command], later: list[Command], pins: set[str]) -> str | None:
    """What is wrong with a git command that downloads (clone, fetch, submodule update), or None."""
    if "clone" in git.words and not clone_pinned(git, later, pins):
        return "not at a pinned tag or verified commit"
    if "fetch" in git.words and not fetch_pinned(git, later, pins):
        return "not a *_COMMIT pin checked out and compared with HEAD"
    if "submodule" in git.words and not any(command.name == "git" and "fetch" in command.words for command in earlier):
        return "submodules of a checkout whose commit the step did not verify"
    return None


def unverified_downloads(dockerfile: str, pins: set[str]) -> list[str]:
    """Every download of the image build that the build does not verify, as a line naming it."""
    found = []
    digests = {"@${" + name + "}" for name in pins if name.endswith("_DIGEST")}
    for instruction, rest in dockerfile_instructions(dockerfile):
        if instruction == "FROM" and not rest.split()[0].endswith(tuple(digests)):
            found.append(f"FROM {rest}: base image not pinned by a digest")
        if instruction == "ADD" and "://" in rest and "--checksum=" not in rest:
            found.append(f"ADD {rest}: no --checksum")
    runs = [rest for instruction, rest in dockerfile_instructions(dockerfile) if instruction == "RUN"]
    for step, run in enumerate(runs, start=1):
        commands, assigned = shell_commands(run)
        for index, command in enumerate(commands):
            later = commands[index + 1 :]
            if command.name == "git":
                problem = git_download_problem(command, commands[:index], later, pins)
                if problem is not None:
                    found.append(f"RUN {step}: {shlex.join(command.words)}: {problem}")
                continue
            download = fetched(command)
            if download is None:
                continue
            source, path = download
            if path is not None:
                if not file_verified(path, later, commands, assigned, pins):
                    found.append(f"RUN {step}: {source} saved as {path}: used before it is verified")
                continue
            consumer = later[0] if later and later[0].pipeline == command.pipeline else None
            keyring = option_value(consumer.words, "-o", "--output") if consumer is not None else None
            if consumer is None or consumer.name != "gpg" or "--dearmor" not in consumer.words or keyring is None:
                target = shlex.join(consumer.words) if consumer is not None else "stdout"
                found.append(f"RUN {step}: {source} piped into {target}: never verified")
            elif not key_verified(keyring, later[1:], pins):
                found.append(f"RUN {step}: {source}, the apt key {keyring}: fingerprint not compared with a pin")
    return found


def pin_names() -> set[str]:
    return {name for name, _ in image_pins()}


def test_every_download_of_the_image_build_is_verified():
    assert unverified_downloads((REPO / "Dockerfile").read_text(), pin_names()) == []


AFTER_FROM = {
    "script downloaded, then run": "RUN curl -fsSL -o /tmp/x.sh https://example.com/x.sh && bash /tmp/x.sh",
    "script piped into a shell": "RUN curl -fsSL https://example.com/x.sh | bash",
    "script from wget piped into a shell": "RUN wget -qO- https://example.com/x.sh | sh",
    "archive from wget, unpacked": "RUN wget -qO /tmp/x.tgz https://example.com/x.tgz && tar -xzf /tmp/x.tgz -C /opt",
    "archive from a redirection": "RUN curl -fsSL https://example.com/x.tgz >/tmp/x.tgz && tar -xzf /tmp/x.tgz",
    "stream unpacked": "RUN curl -fsSL https://example.com/x.tgz | tar -xz -C /opt",
    "checksum from the same server": "RUN curl -fsSLO https://example.com/x.tgz && curl -fsSLO"
    " https://example.com/x.tgz.sha256 && sha256sum --check x.tgz.sha256 && tar -xzf x.tgz",
    "checked after use": "RUN curl -fsSLo /tmp/x.tgz https://example.com/x.tgz && tar -xzf /tmp/x.tgz"
    ' && echo "${AWS_OFI_NCCL_SHA512}  /tmp/x.tgz" | sha512sum --check',
    "clone of the default branch": "RUN git clone https://example.com/tool.git /tmp/tool",
    "clone of a moving branch": "RUN git clone --branch main https://example.com/tool.git /tmp/tool",
    "fetch of a moving branch": "RUN git init /tmp/tool && git -C /tmp/tool fetch https://example.com/tool.git main",
    "ADD of a URL": "ADD https://example.com/x.tgz /tmp/x.tgz",
}

# Each verification of the Dockerfile, removed or weakened: (the text it replaces, the replacement).
WEAKENED = {
    "base image by tag only": (
        "-devel-ubuntu${UBUNTU_VERSION}@${CUDA_IMAGE_DIGEST}\nSHELL",
        "-devel-ubuntu${UBUNTU_VERSION}\nSHELL",
    ),
    "aws-ofi-nccl sha512 check dropped": (
        '    && echo "${AWS_OFI_NCCL_SHA512}  /tmp/${name}.tar.gz" | sha512sum --check --strict - \\\n',
        "",
    ),
    "EFA signer not compared": ('grep -E "^\\[GNUPG:\\] VALIDSIG', 'grep -E "^\\[GNUPG:\\] GOODSIG'),
    "Nsight key printed, not compared": (
        '    && if [ "${keys}" != "${NSYS_KEY_FINGERPRINT}" ]; then \\\n',
        '    && if [ -z "${keys}" ]; then \\\n',
    ),
    "DeepEP checked out, HEAD not compared": (
        'if [ "$(git -C /tmp/DeepEP rev-parse HEAD)" != "${DEEPEP_COMMIT}" ]',
        'if [ -z "$(git -C /tmp/DeepEP rev-parse HEAD)" ]',
    ),
}


# What the lines about each weakened verification name (for AFTER_FROM: example.com).
CAUGHT = {
    "base image by tag only": "FROM nvidia/cuda",
    "aws-ofi-nccl sha512 check dropped": "aws-ofi-nccl",
    "EFA signer not compared": "efa-installer.amazonaws.com",
    "Nsight key printed, not compared": "nvidia.pub",
    "DeepEP checked out, HEAD not compared": "deepseek-ai/DeepEP",
}


def mutated_dockerfile(name: str) -> str:
    dockerfile = (REPO / "Dockerfile").read_text()
    if name in AFTER_FROM:
        head, sep, tail = dockerfile.partition("\nSHELL ")
        return f"{head}\n{AFTER_FROM[name]}\n{sep.strip()} {tail}"
    old, new = WEAKENED[name]
    assert dockerfile.count(old) == 1, f"the Dockerfile no longer has: {old!r}"
    return dockerfile.replace(old, new)


@pytest.mark.parametrize("name", [*AFTER_FROM, *WEAKENED])
def test_an_unverified_download_fails_the_supply_chain_check(name: str):
    found = unverified_downloads(mutated_dockerfile(name), pin_names())
    assert found, f"{name}: not caught"
    assert all(CAUGHT.get(name, "example.com") in line for line in found), found


# Pins that name content: each must be a full hash, or the build trusts whatever the name resolves to today.
PIN_FORMATS = {
    "_DIGEST": r"sha256:[0-9a-f]{64}",
    "_FINGERPRINT": r"[0-9A-F]{40}",
    "_COMMIT": r"[0-9a-f]{40}",
    "_SHA512": r"[0-9a-f]{128}",
}


@pytest.mark.parametrize("name", sorted(name for name in pin_names() if name.endswith(tuple(PIN_FORMATS))))
def test_content_pins_are_full_hashes(name: str):
    value = dict(image_pins())[name]
    pattern = next(pattern for suffix, pattern in PIN_FORMATS.items() if name.endswith(suffix))
    assert re.fullmatch(pattern, value), f"versions.txt: {name}={value!r} is not {pattern}"


def context_copies(dockerfile: str | None = None) -> list[str]:
    """The build-context sources of the Dockerfile's COPY instructions (not those from another stage), in order."""
    copies = [rest for instruction, rest in dockerfile_instructions(dockerfile) if instruction == "COPY"]
    sources = [copy_sources_and_destination(rest) for rest in copies]
    return [source for paths, _, stage in sources if stage is None for source in paths]


def test_our_code_is_copied_in_the_last_layer_after_the_build_tools():
    steps = dockerfile_instructions()
    assert steps[-1] == ("COPY", ". /workspace/megatron")
    assert context_copies()[:-1] == [
        "tools/image/check_pins.sh",
        "versions.txt",
        "tools/install_python_stack.sh",
        "tools/fix_dataset_helpers.sh",
        "tools/build_deepep.sh",
        "tools/image/check_image.py",
    ]


def test_build_ends_by_checking_what_the_image_claims():
    last_run = [rest for instruction, rest in dockerfile_instructions() if instruction == "RUN"][-1]
    assert "python /opt/toolkit/tools/image/check_image.py /opt/toolkit/versions.txt" in " ".join(last_run.split())
    check_image = (REPO / "tools" / "image" / "check_image.py").read_text()
    for module in ("torch", "transformer_engine", "megatron.core", "megatron.bridge", "deep_ep", "viztracer"):
        assert f'"{module}"' in check_image


# --- the build context, as the docker CLI packs it ----------------------------------------------------------------

# What the image runs, besides the files the Dockerfile copies by name; `COPY .` copies the whole context.
RUNTIME = ("srun.sh", "entrypoint.py", "viztracer_plugin.py", "launcher/", "recipes/", "tools/prepare_data.py")
# What a run or a checkout leaves beside the toolkit: none of it may reach the Docker daemon, let alone the image.
LEFT_BY_RUNS = (
    "outputs/tiny_gpt_pretrain/123/launch.json",
    "outputs/tiny_gpt_pretrain/123/checkpoints/iter_0000010/__0_0.distcp",
    "nemo_experiments/default/checkpoints/iter_0000010/__0_0.distcp",
    "viztracer_output/pid7/trace_rank0.json",
    "nsys-megatron/rank0.nsys-rep",
    "megatron-lm+latest.sqsh",
    ".venv/bin/python",
    "launcher/__pycache__/outputs.cpython-312.pyc",
    ".git/HEAD",
)


@pytest.fixture
def checkout_after_a_run() -> Iterator[Path]:
    """A copy of this checkout, with what a run and the developer's tools leave in one."""
    with tempfile.TemporaryDirectory(prefix="ctx-") as root:
        work = Path(root)
        for name in [*checkout_files(), *LEFT_BY_RUNS]:
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            if (REPO / name).is_file():
                shutil.copy2(REPO / name, work / name)
            else:
                (work / name).write_text("left by a run\n")
        yield work


def test_build_context_holds_what_the_image_runs_and_nothing_a_run_left(checkout_after_a_run: Path):
    context = docker_build_context(checkout_after_a_run)
    named = {source for source in context_copies() if source != "."}
    runtime = {name for name in checkout_files() if name.startswith(RUNTIME) and "__pycache__" not in name.split("/")}
    needed = {"Dockerfile", ".dockerignore", *named, *runtime}
    assert sorted(set(context) - needed) == [], "sent to the Docker daemon, and copied into the image by COPY ."
    assert sorted(needed - set(context)) == [], "the image needs these"


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
    # Every pin set: these tests are about the Makefile; test_every_image_pin_has_a_value holds versions.txt to it.
    versions = sandbox.work / "versions.txt"
    versions.write_text(re.sub(r"^([A-Z][A-Z0-9_]*)=$", r"\1=stand-in", versions.read_text(), flags=re.MULTILINE))
    (sandbox.work / "tools").mkdir()
    for script in ("setup_test_env.sh", "install_python_stack.sh"):
        (sandbox.work / "tools" / script).touch()
    return sandbox


def test_make_build_passes_every_image_pin_as_build_arg(checkout):
    checkout.provide("docker", "enroot")
    result = checkout.run("make", "build")
    assert result.returncode == 0, result.stderr
    pins = image_pins(checkout.work / "versions.txt")
    build_args = [arg for name, value in pins for arg in ("--build-arg", f"{name}={value}")]
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


def test_make_build_takes_no_image_name_tag_or_output_dir_from_the_environment(checkout):
    """A CI job or shell that holds TAG, IMAGE_NAME or OUTPUT_DIR for itself builds the image srun.sh looks for."""
    checkout.provide("docker", "enroot")
    result = checkout.run("make", "build", IMAGE_NAME="ci/app", TAG="pr-123", OUTPUT_DIR="/nonexistent")
    assert result.returncode == 0, result.stderr
    assert checkout.calls()[0][5] == "megatron-lm:latest"
    assert checkout.calls()[1][3] == "./megatron-lm+latest.sqsh"


def test_make_build_refuses_an_image_pin_without_value(checkout):
    checkout.provide("docker", "enroot")
    versions = checkout.work / "versions.txt"
    versions.write_text(re.sub(r"^NCCL_TESTS_VERSION=.*$", "NCCL_TESTS_VERSION=", versions.read_text(), flags=re.M))
    result = checkout.run("make", "build")
    assert result.returncode != 0
    assert "[image] pin without a value: NCCL_TESTS_VERSION" in result.stderr
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


def aws_ofi_nccl_step(dockerfile: str) -> str:
    return next(rest for name, rest in dockerfile_instructions(dockerfile) if name == "RUN" and "./configure" in rest)


@pytest.mark.parametrize(
    ("dockerfile", "ok"),
    [(REPO / "Dockerfile", True), (STANDINS / "before-issue-25" / "Dockerfile", False)],
    ids=["today", "before-issue-25"],
)
def test_aws_ofi_nccl_is_built_with_gdrcopy_and_the_step_proves_it(dockerfile: Path, ok: bool):
    """Without GDRCopy, aws-ofi-nccl's GIN refuses to start (src/rdma/gin/nccl_ofi_gin_api.cpp); configure finds it
    only where it is told to look (m4/check_pkg_gdrcopy.m4), so the step must say where and check what configure
    found."""
    step = aws_ofi_nccl_step(dockerfile.read_text())
    built_with_gdrcopy = "--with-gdrcopy=/opt/gdrcopy" in step and "HAVE_GDRCOPY HAVE_DECL_GDR_PIN_BUFFER_V2" in step
    assert built_with_gdrcopy == ok
