"""The Dockerfile and the shell inside it, read by real parsers: instructions by dockerfile-parse, shell by shfmt's
syntax tree (mvdan/sh, `shfmt --to-json`). Shared by the image tests; no daemon, nothing is run."""

import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from dockerfile_parse import DockerfileParser

REPO = Path(__file__).resolve().parents[1]
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


def repo_tool(name: str) -> str:
    """A tool of the test environment (.venv/bin), or of PATH."""
    for candidate in (Path(sys.executable).parent / name, REPO / ".venv" / "bin" / name):
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found: run `bash tools/setup_test_env.sh` to create the test environment")
    return found


@dataclass(frozen=True)
class Instruction:
    name: str  # FROM, RUN, COPY... in upper case
    value: str  # the arguments, continuation lines joined
    line: int  # 1-based line of the instruction
    stage: int  # index of the FROM it belongs to; -1 before the first FROM


def instructions(dockerfile: str) -> list[Instruction]:
    """The instructions of a Dockerfile's text in order, comments dropped."""
    parser = DockerfileParser(fileobj=io.BytesIO(dockerfile.encode()))
    found, stage = [], -1
    for item in parser.structure:
        name = item["instruction"].upper()
        if name == "COMMENT":
            continue
        stage += name == "FROM"
        found.append(Instruction(name, item["value"], item["startline"] + 1, stage))
    return found


def read_instructions(path: Path = REPO / "Dockerfile") -> list[Instruction]:
    return instructions(path.read_text())


def copy_sources_and_destination(value: str) -> tuple[list[str], str, str | None]:
    """(sources, destination, --from stage) of a COPY or ADD instruction's arguments (shell form)."""
    words = value.split()
    options = [word for word in words if word.startswith("--")]
    paths = [word for word in words if not word.startswith("--")]
    source_stage = next((option.split("=", 1)[1] for option in options if option.startswith("--from=")), None)
    return paths[:-1], paths[-1], source_stage


# --- shell ------------------------------------------------------------------------------------------------------


def shell_tree(script: str) -> dict:
    """shfmt's syntax tree of a bash script (the RUN steps run under bash -o pipefail, the Dockerfile's SHELL)."""
    result = subprocess.run(
        [repo_tool("shfmt"), "--language-dialect", "bash", "--to-json"],
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ValueError(f"shfmt cannot parse the script: {result.stderr.strip()}")
    return json.loads(result.stdout)


def nodes(tree: object, kind: str) -> Iterator[dict]:
    """Every node of the given Type in the tree, outer before inner."""
    if isinstance(tree, dict):
        if tree.get("Type") == kind:
            yield tree
        for value in tree.values():
            yield from nodes(value, kind)
    elif isinstance(tree, list):
        for value in tree:
            yield from nodes(value, kind)


def word_text(word: dict, values: Mapping[str, str]) -> str:
    """A word as the shell would see it, with ${NAME} replaced where values knows NAME; an unknown variable stays
    ${NAME}, a command substitution becomes $(...)."""
    return "".join(part_text(part, values) for part in word.get("Parts", []))


def part_text(part: dict, values: Mapping[str, str]) -> str:
    kind = part.get("Type")
    if kind in ("Lit", "SglQuoted"):
        return part.get("Value", "")
    if kind == "DblQuoted":
        return "".join(part_text(inner, values) for inner in part.get("Parts", []))
    if kind == "ParamExp":
        name = part["Param"]["Value"]
        plain = not any(key in part for key in ("Exp", "Repl", "Slice", "Index", "Length", "Excl", "Names"))
        return values[name] if plain and name in values else "${" + name + "}"
    return "$(...)"


def is_computed(text: str) -> bool:
    """Whether a word's text still holds something only known when the step runs."""
    return "${" in text or "$(" in text


@dataclass(frozen=True)
class Call:
    offset: int  # position in the script, for ordering
    words: list[str]  # the command and its arguments, as word_text renders them

    @property
    def name(self) -> str:
        return self.words[0]


def calls(tree: dict, values: Mapping[str, str]) -> list[Call]:
    """Every simple command of the script, in source order, with the literal assignments before it folded into
    values (so `name=x-${PIN}; curl .../${name}` renders the URL)."""
    known = dict(values)
    found = []
    for node in sorted(nodes(tree, "CallExpr"), key=lambda node: node["Pos"]["Offset"]):
        for assign in node.get("Assigns", []):
            if "Value" in assign:
                text = word_text(assign["Value"], known)
                if not is_computed(text):
                    known[assign["Name"]["Value"]] = text
        if node.get("Args"):
            found.append(Call(node["Pos"]["Offset"], [word_text(word, known) for word in node["Args"]]))
    return found


def function_names(tree: dict) -> set[str]:
    return {node["Name"]["Value"] for node in nodes(tree, "FuncDecl")}


def words(tree: dict, values: Mapping[str, str]) -> Iterator[str]:
    """Every word of the script (arguments and assigned values), rendered."""
    for node in nodes(tree, "CallExpr"):
        for word in node.get("Args", []):
            yield word_text(word, values)
        for assign in node.get("Assigns", []):
            if "Value" in assign:
                yield word_text(assign["Value"], values)
    for node in nodes(tree, "DeclClause"):
        for assign in node.get("Args", []):
            if "Value" in assign:
                yield word_text(assign["Value"], values)


def self_located(tree: dict) -> set[str]:
    """The variables a script sets from its own location (${BASH_SOURCE[0]} or $0), such as root=$(cd .. && pwd)."""
    found = set()
    for node in [*nodes(tree, "CallExpr"), *nodes(tree, "DeclClause")]:
        for assign in node.get("Assigns", []) + node.get("Args", []):
            if "Name" in assign and "Value" in assign:
                params = {part["Param"]["Value"] for part in nodes(assign["Value"], "ParamExp")}
                if params & {"BASH_SOURCE", "0"}:
                    found.add(assign["Name"]["Value"])
    return found
