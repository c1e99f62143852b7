"""The image build's closure, checked without a daemon: every file a step runs from the build context was copied
before it and survives .dockerignore (the docker CLI's own context packing); no ARG shares a name with an ENV of the
base image (which would override it in every RUN step); every command a step runs, or a build it starts runs by name,
is installed by an earlier step or by the base image.

The Dockerfile is read by dockerfile-parse and its shell by shfmt's syntax tree. What the base image and each package,
installer and upstream build provide or need is data, with its sources: tests/fixtures/image/base-image.toml and
provides.toml. tests/fixtures/image/before-issue-25 holds the Dockerfile and .dockerignore that issue 25 found broken,
to show that each of its closure defects is caught.
"""

import fnmatch
import posixpath
import shlex
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.docker_context import checkout_files, packed_context
from tests.dockerfile_model import (
    Call,
    Instruction,
    calls,
    copy_sources_and_destination,
    function_names,
    image_pins,
    instructions,
    is_computed,
    self_located,
    shell_tree,
    words,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "image"
BASE = tomllib.loads((FIXTURES / "base-image.toml").read_text())
PROVIDES = tomllib.loads((FIXTURES / "provides.toml").read_text())
BEFORE = FIXTURES / "before-issue-25"
BUILTINS = {
    ".", ":", "[", "[[", "cd", "command", "compgen", "declare", "echo", "eval", "exec", "exit", "export", "false",
    "local", "mapfile", "printf", "pwd", "read", "readarray", "return", "set", "shift", "shopt", "source", "test",
    "trap", "true", "type", "unset", "wait",
}  # fmt: skip
WRAPPERS = {"xargs", "timeout", "env"}  # run the command named among their arguments
SOURCE_SUFFIXES = (".git", ".tar.gz", ".tgz", ".tar.xz")


@dataclass
class Stage:
    """What a build stage holds at a point: the commands on disk by folder, the environment, the copied files."""

    provided: dict[str, set[str]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    copied: dict[str, str] = field(default_factory=dict)  # path in the image -> path in the build context
    args: set[str] = field(default_factory=set)

    @classmethod
    def from_base(cls) -> "Stage":
        return cls({folder: set(names) for folder, names in BASE["commands"].items()}, dict(BASE["env"]))

    def has(self, command: str) -> bool:
        return any(command in self.provided.get(folder, set()) for folder in self.env["PATH"].split(":"))

    def provide(self, folder: str, commands: list[str]) -> None:
        self.provided.setdefault(folder.rstrip("/") or "/", set()).update(commands)


@dataclass
class Closure:
    context: set[str]
    pins: dict[str, str]
    problems: list[str] = field(default_factory=list)

    def check(self, steps: list[Instruction]) -> list[str]:
        stage = None
        for step in steps:
            if step.name == "FROM":
                stage = self.from_image(step)
            elif stage is not None and step.name == "ARG":
                self.arg(step, stage)
            elif stage is not None and step.name == "ENV":
                self.env(step, stage)
            elif stage is not None and step.name in ("COPY", "ADD"):
                self.copy(step, stage)
            elif stage is not None and step.name == "RUN":
                self.run(step, stage)
        return self.problems

    def from_image(self, step: Instruction) -> Stage:
        image = step.value.split()[0].split("@")[0]
        rendered = image.replace("${CUDA_VERSION}", self.pins["CUDA_VERSION"])
        rendered = rendered.replace("${UBUNTU_VERSION}", self.pins["UBUNTU_VERSION"])
        if rendered != BASE["image"]:
            self.problems.append(f"line {step.line}: FROM {image}: no data for this base image in base-image.toml")
        return Stage.from_base()

    def arg(self, step: Instruction, stage: Stage) -> None:
        name = step.value.split("=", 1)[0].strip()
        if name in stage.env:
            self.problems.append(
                f"line {step.line}: ARG {name}: the base image sets ENV {name}={stage.env[name]!r}, which overrides"
                " the ARG in every RUN step: give the pin another name"
            )
        stage.args.add(name)

    def env(self, step: Instruction, stage: Stage) -> None:
        for pair in shlex.split(step.value):
            name, _, value = pair.partition("=")
            for known, current in stage.env.items():
                value = value.replace("${" + known + "}", current)
            stage.env[name] = value

    def copy(self, step: Instruction, stage: Stage) -> None:
        sources, destination, from_stage = copy_sources_and_destination(step.value)
        if from_stage is not None:
            return
        for written in sources:
            source = written.rstrip("/")
            in_context = (
                source == "." or source in self.context or any(f.startswith(source + "/") for f in self.context)
            )
            if not in_context:
                self.problems.append(f"line {step.line}: COPY {source}: not in the build context (.dockerignore)")
            directory = destination.endswith("/") or len(sources) > 1 or source == "."
            target = posixpath.join(destination, posixpath.basename(source)) if directory else destination
            if source == ".":
                stage.copied.update({posixpath.join(destination, name): name for name in self.context})
            else:
                stage.copied[target] = source

    def values(self, stage: Stage) -> dict[str, str]:
        """What a RUN step's variables hold: the pins declared as ARG, unless an ENV of the same name wins."""
        return {**{name: self.pins[name] for name in stage.args if name in self.pins}, **stage.env}

    def run(self, step: Instruction, stage: Stage) -> None:
        tree = shell_tree(step.value)
        self.commands(f"line {step.line}", calls(tree, self.values(stage)), function_names(tree), stage)

    def commands(self, where: str, found: list[Call], functions: set[str], stage: Stage) -> None:
        for call in found:
            command = run_command(call.words)
            if command is None or command in BUILTINS or command in functions or is_computed(command):
                pass
            elif command.startswith("/"):
                if command not in stage.copied and command.startswith("/opt/toolkit/"):
                    self.problems.append(f"{where}: runs {command}, which no earlier COPY put there")
            elif "/" not in command and not stage.has(command):
                self.problems.append(f"{where}: `{command}` is not installed by an earlier step or the base image")
            self.effects(where, call, stage)

    def effects(self, where: str, call: Call, stage: Stage) -> None:
        """What a command adds to the stage, and the files and builds it needs."""
        name, args = call.name, call.words[1:]
        if name == "apt-get" and "install" in args:
            self.apt_install(
                where, [arg for arg in args[args.index("install") + 1 :] if not arg.startswith("-")], stage
            )
        elif name.startswith("python") and args[:2] == ["-m", "venv"]:
            stage.provide(posixpath.join(args[2], "bin"), PROVIDES["installers"]["venv"]["bin"])
        elif posixpath.basename(name) == "efa_installer.sh":
            for folder, commands in PROVIDES["installers"]["efa_installer.sh"].items():
                stage.provide(folder, commands)
        elif name == "ln" and "-s" in args:
            link = args[-1]
            stage.provide(posixpath.dirname(link), [posixpath.basename(link)])
        elif name in ("bash", "sh") and args and args[0].startswith("/"):
            self.script(where, args[0], stage)
        elif name.startswith("python") and args and args[0].endswith(".py") and args[0].startswith("/opt/toolkit/"):
            if args[0] not in stage.copied:
                self.problems.append(f"{where}: runs {args[0]}, which no earlier COPY put there")
        for source in downloaded_sources(call):
            self.build_needs(where, source, stage)

    def apt_install(self, where: str, packages: list[str], stage: Stage) -> None:
        for package in packages:
            entry = next(
                (commands for glob, commands in PROVIDES["apt"].items() if fnmatch.fnmatch(package, glob)), None
            )
            if entry is None:
                self.problems.append(f"{where}: apt package {package} has no entry in provides.toml [apt]")
            else:
                stage.provide("/usr/bin", entry)

    def build_needs(self, where: str, source: str, stage: Stage) -> None:
        build = next((entry for prefix, entry in PROVIDES["builds"].items() if source.startswith(prefix)), None)
        if build is None:
            self.problems.append(f"{where}: builds {source}, which has no entry in provides.toml [builds]")
            return
        for command in build["needs"]:
            if not stage.has(command):
                self.problems.append(
                    f"{where}: the build of {source} runs `{command}` ({build['source']}), which no earlier step"
                    " or the base image installs"
                )

    def script(self, where: str, path: str, stage: Stage) -> None:
        """A shell script the step runs from the build context: copied before, its commands installed, and each repo
        file it names relative to its own root (e.g. "$root/tools/x.sh") copied beside it."""
        source = stage.copied.get(path)
        if source is None:
            if path.startswith("/opt/toolkit/"):
                self.problems.append(f"{where}: runs {path}, which no earlier COPY put there")
            return
        root = path[: -len(source)] if path.endswith(source) else posixpath.dirname(path) + "/"
        tree = shell_tree((REPO / source).read_text())
        roots = self_located(tree)
        for word in words(tree, {}):
            named = repo_file_named(word, roots)
            if named is not None and root + named not in stage.copied:
                self.problems.append(f"{where}: {source} uses {named}, which is not copied beside it ({root}{named})")
            elif named is not None and named.endswith(".sh") and named != source:
                self.script(f"{where} ({source})", root + named, stage)
        self.commands(f"{where} ({source})", calls(tree, {}), function_names(tree), stage)


def run_command(args: list[str]) -> str | None:
    """The command a simple command runs: its first word, or the one a wrapper (xargs, timeout, env) runs."""
    index = 0
    while index < len(args) and args[index] in WRAPPERS:
        wrapper, index = args[index], index + 1
        while index < len(args) and (args[index].startswith("-") or (wrapper == "env" and "=" in args[index])):
            index += 1
        if wrapper == "timeout":
            index += 1  # the duration
    return args[index] if index < len(args) else None


def downloaded_sources(call: Call) -> list[str]:
    """The upstream sources a command downloads to build: git clone/fetch URLs and source tarballs of curl/wget."""
    if call.name == "git" and ({"clone", "fetch"} & set(call.words)):
        return [word for word in call.words if "://" in word]
    if call.name in ("curl", "wget"):
        return [word for word in call.words if "://" in word and word.endswith(SOURCE_SUFFIXES)]
    return []


@cache
def repo_files() -> frozenset[str]:
    return frozenset(checkout_files())


def repo_file_named(word: str, roots: set[str]) -> str | None:
    """The repository file a script word names relative to the checkout root the script computes from its own
    location ("$root/tools/x.sh" where root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)), if any."""
    variable, separator, named = word.partition("}/")
    if not separator or variable.removeprefix("${") not in roots:
        return None
    return named if named in repo_files() else None


def closure_problems(dockerfile: str, dockerignore: str) -> list[str]:
    context = set(packed_context(dockerfile, dockerignore))
    return Closure(context, dict(image_pins())).check(instructions(dockerfile))


@cache
def problems_before_issue_25() -> tuple[str, ...]:
    return tuple(closure_problems((BEFORE / "Dockerfile").read_text(), (BEFORE / "dockerignore").read_text()))


def test_the_image_build_is_closed():
    assert closure_problems((REPO / "Dockerfile").read_text(), (REPO / ".dockerignore").read_text()) == []


def test_base_image_data_is_for_the_pinned_tag():
    pins = dict(image_pins())
    assert BASE["image"] == f"nvidia/cuda:{pins['CUDA_VERSION']}-devel-ubuntu{pins['UBUNTU_VERSION']}"


# Each closure defect issue 25 found in the Dockerfile of the time, and the words of the line that must name it.
BEFORE_ISSUE_25 = {
    "1: install_python_stack.sh runs a helper that was never copied": (
        "tools/install_python_stack.sh uses tools/fix_dataset_helpers.sh, which is not copied beside it"
    ),
    "2: the base image's ENV NCCL_VERSION overrides ARG NCCL_VERSION": "ARG NCCL_VERSION: the base image sets ENV",
    "5: NCCL's build needs python3, which nothing installed": "https://github.com/NVIDIA/nccl.git runs `python3`",
}


@pytest.mark.parametrize("defect", BEFORE_ISSUE_25)
def test_the_build_closure_check_catches_what_issue_25_found(defect: str):
    assert any(BEFORE_ISSUE_25[defect] in line for line in problems_before_issue_25()), problems_before_issue_25()


def current_dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def replaced_once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the Dockerfile no longer has: {old!r}"
    return text.replace(old, new)


# Mutations of today's Dockerfile and .dockerignore, and the words of the line that must name each.
MUTATIONS = {
    "helper dropped from the COPY": (
        ("Dockerfile", " tools/fix_dataset_helpers.sh /opt/toolkit/tools/", " /opt/toolkit/tools/"),
        "uses tools/fix_dataset_helpers.sh, which is not copied",
    ),
    "helper kept out of the context": (
        (".dockerignore", "!tools/fix_dataset_helpers.sh\n", ""),
        "COPY tools/fix_dataset_helpers.sh: not in the build context",
    ),
    "pin named like a base ENV": (
        ("Dockerfile", "ARG NCCL_TESTS_VERSION\nRUN gencode", "ARG NCCL_TESTS_VERSION\nARG NCCL_VERSION\nRUN gencode"),
        "ARG NCCL_VERSION: the base image sets ENV NCCL_VERSION='2.28.3-1'",
    ),
    "command nothing installs": (
        ("Dockerfile", "&& touch /pins-checked", "&& jq . /dev/null && touch /pins-checked"),
        "`jq` is not installed by an earlier step",
    ),
    "venv no longer on PATH": (
        ("Dockerfile", "ENV PATH=/opt/venv/bin:", "ENV PATH="),
        "`python` is not installed by an earlier step",
    ),
}  # fmt: skip


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_build_closure_check_catches_a_broken_step(mutation: str):
    (file, old, new), expected = MUTATIONS[mutation]
    dockerfile, dockerignore = current_dockerfile(), (REPO / ".dockerignore").read_text()
    if file == "Dockerfile":
        dockerfile = replaced_once(dockerfile, old, new)
    else:
        dockerignore = replaced_once(dockerignore, old, new)
    problems = closure_problems(dockerfile, dockerignore)
    assert any(expected in line for line in problems), problems


def efa_installer_options(dockerfile: str) -> list[str]:
    found = []
    for step in instructions(dockerfile):
        if step.name == "RUN" and "efa_installer.sh" in step.value:
            for call in calls(shell_tree(step.value), {}):
                if call.name.endswith("efa_installer.sh"):
                    found += call.words[1:]
    return found


def test_efa_installer_gets_only_options_it_documents():
    documented = set(PROVIDES["efa_installer"]["options"])
    assert efa_installer_options(current_dockerfile())
    assert [option for option in efa_installer_options(current_dockerfile()) if option not in documented] == []


def test_efa_installer_option_check_catches_the_undocumented_skip_plugin():
    documented = set(PROVIDES["efa_installer"]["options"])
    before = efa_installer_options((BEFORE / "Dockerfile").read_text())
    assert [option for option in before if option not in documented] == ["--skip-plugin"]
