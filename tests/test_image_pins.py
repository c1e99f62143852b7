"""The image's pins: looked up upstream in the build's first minutes (tools/image/check_pins.sh, run here against a
local git repository and an HTTP server on 127.0.0.1), recorded with their evidence in docs/image.md, and mutually
compatible by the requirements their projects document."""

import gzip
import http.server
import re
import subprocess
import threading
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from tests.dockerfile_model import calls, image_pins, instructions, is_computed, shell_tree

REPO = Path(__file__).resolve().parents[1]
CHECK_PINS = REPO / "tools" / "image" / "check_pins.sh"
BEFORE = REPO / "tests" / "fixtures" / "image" / "before-issue-25"


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A stand-in upstream: a git repository with a tag and two commits, and an HTTP server with a release asset and
    a flat apt repository."""
    root = tmp_path_factory.mktemp("upstream")
    repo = root / "tool"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    for name in ("one", "two"):
        (repo / name).write_text(name)
        git("add", name, cwd=repo)
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", name, cwd=repo)
    git("tag", "v1.0", "HEAD~1", cwd=repo)
    git("config", "uploadpack.allowReachableSHA1InWant", "true", cwd=repo)  # as GitHub serves a commit by its hash
    site = root / "site"
    (site / "apt").mkdir(parents=True)
    (site / "tool-1.0.tar.gz").write_bytes(b"release")
    (site / "apt" / "Packages.gz").write_bytes(gzip.compress(b"Package: tool-cli-1.0\nVersion: 1.0.1\n\n"))
    handler = lambda *args: http.server.SimpleHTTPRequestHandler(*args, directory=str(site))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.RequestHandlerClass.log_message = lambda *args: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield {
        "repo": f"file://{repo}",
        "head": git("rev-parse", "HEAD", cwd=repo),
        "http": f"http://127.0.0.1:{server.server_address[1]}",
    }
    server.shutdown()


def check_pins(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CHECK_PINS), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_pins_that_exist_upstream_pass_silently(upstream):
    result = check_pins(
        "set", "CUDA_ARCHS", "9.0",
        "git-tag", "TOOL_VERSION", "v1.0", upstream["repo"],
        "git-commit", "TOOL_COMMIT", upstream["head"], upstream["repo"],
        "url", "TOOL_VERSION", "1.0", f"{upstream['http']}/tool-1.0.tar.gz",
        "apt", "CLI_VERSION", "1.0", f"{upstream['http']}/apt", "tool-cli-1.0",
    )  # fmt: skip
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("check", "line"),
    [
        (["git-tag", "TOOL_VERSION", "v9.9", "{repo}"], "pin TOOL_VERSION=v9.9: no tag v9.9 in {repo}"),
        (
            ["git-commit", "TOOL_COMMIT", "4580d731d359e0a99465342442d25fa2512859cc", "{repo}"],
            "pin TOOL_COMMIT=4580d731d359e0a99465342442d25fa2512859cc: commit 4580d731d359e0a99465342442d25fa2512859cc"
            " not found in {repo}",
        ),
        (
            ["git-commit", "TOOL_COMMIT", "4580d73", "{repo}"],
            "pin TOOL_COMMIT=4580d73: not a full 40-digit commit hash",
        ),
        (["url", "TOOL_VERSION", "9.9", "{http}/tool-9.9.tar.gz"], "pin TOOL_VERSION=9.9: no {http}/tool-9.9.tar.gz"),
        (
            ["apt", "CLI_VERSION", "9.9", "{http}/apt", "tool-cli-9.9"],
            "pin CLI_VERSION=9.9: no package tool-cli-9.9 in {http}/apt",
        ),
        (["set", "CUDA_ARCHS", ""], "pin CUDA_ARCHS=: empty: pass the [image] pins of versions.txt (make build does)"),
    ],
    ids=["missing-tag", "missing-commit", "short-hash", "missing-asset", "missing-package", "empty-pin"],
)
def test_a_pin_missing_upstream_stops_the_build_with_one_line_naming_it(upstream, check, line):
    result = check_pins(*(arg.format(**upstream) for arg in check))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [line.format(**upstream)]


def test_every_missing_pin_gets_its_own_line(upstream):
    result = check_pins(
        "git-tag", "A_VERSION", "v9", upstream["repo"],
        "git-tag", "B_VERSION", "v1.0", upstream["repo"],
        "url", "C_VERSION", "9", f"{upstream['http']}/nothing.tar.gz",
    )  # fmt: skip
    assert result.returncode == 1
    assert [line.split(":")[0] for line in result.stderr.splitlines()] == ["pin A_VERSION=v9", "pin C_VERSION=9"]


class SignedRedirects(http.server.SimpleHTTPRequestHandler):
    """A release host as GitHub's: /download/NAME redirects to a signed URL of the file, which serves GET and refuses
    HEAD (the signature covers one method), as such URLs have refused the HEAD requests of pin checks."""

    def do_GET(self):
        if self.path.startswith("/download/"):
            self.send_response(302)
            self.send_header("Location", "/signed/" + self.path.removeprefix("/download/") + "?signature=get-only")
            self.end_headers()
        else:
            self.path = self.path.removeprefix("/signed").split("?")[0]
            super().do_GET()

    def do_HEAD(self):
        if self.path.startswith("/download/"):
            self.do_GET()
        else:
            self.send_error(403, "SignatureDoesNotMatch")

    def log_message(self, *args):
        pass


@pytest.fixture
def signed_host(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "tool-1.0.tar.gz").write_bytes(b"release asset")
    handler = lambda *args: SignedRedirects(*args, directory=str(tmp_path))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_release_asset_behind_a_signed_redirect_that_refuses_head_passes(signed_host):
    head = subprocess.run(["curl", "-fsIL", "-o", "/dev/null", f"{signed_host}/download/tool-1.0.tar.gz"], check=False)
    assert head.returncode == 22, "the stand-in host must refuse HEAD as the signed URLs do"
    result = check_pins("url", "TOOL_VERSION", "1.0", f"{signed_host}/download/tool-1.0.tar.gz")
    assert (result.returncode, result.stderr) == (0, "")
    missing = check_pins("url", "TOOL_VERSION", "9.9", f"{signed_host}/download/tool-9.9.tar.gz")
    assert missing.stderr.splitlines() == [f"pin TOOL_VERSION=9.9: no {signed_host}/download/tool-9.9.tar.gz"]


@pytest.mark.parametrize("args", [[], ["tag", "X", "1", "u"], ["git-tag", "X", "1"]], ids=["none", "kind", "arity"])
def test_check_pins_rejects_a_malformed_call(args):
    result = check_pins(*args)
    assert result.returncode == 2
    assert result.stderr.startswith("check_pins.sh: ")


# --- the Dockerfile runs it first, on every pin it downloads -------------------------------------------------------


def preflight_pins(dockerfile: str) -> dict[str, str]:
    """Pin -> kind of each check that the Dockerfile's check_pins.sh step makes."""
    found: dict[str, str] = {}
    for step in instructions(dockerfile):
        if step.name == "RUN" and "check_pins.sh" in step.value:
            for call in calls(shell_tree(step.value), {}):
                if call.name == "bash" and call.words[1].endswith("check_pins.sh"):
                    found |= checks_of(call.words[2:])
    return found


def checks_of(args: list[str]) -> dict[str, str]:
    arity = {"set": 3, "git-tag": 4, "git-commit": 4, "url": 4, "apt": 5}
    found, index = {}, 0
    while index < len(args):
        found[args[index + 1]] = args[index]
        index += arity[args[index]]
    return found


def downloaded_pins(dockerfile: str) -> set[str]:
    """The pins (ARGs) that name what a step of the image (not the pin stage) downloads: in curl and git URLs and
    refs, and in the packages it installs from an apt repository it adds (the Ubuntu archive's are the base's)."""
    steps = instructions(dockerfile)
    pins, found = {step.value.split("=")[0] for step in steps if step.name == "ARG"}, set()
    for step in steps:
        if step.name != "RUN" or "check_pins.sh" in step.value:
            continue
        for call in calls(shell_tree(step.value), {}):
            git_ref = call.name == "git" and {"clone", "fetch", "checkout"} & set(call.words)
            downloads = call.name in ("curl", "wget") or git_ref
            installs = call.name == "apt-get" and "install" in call.words and "sources.list.d" in step.value
            if downloads or installs:
                found |= {pin for pin in pins for word in call.words if "${" + pin + "}" in word}
    return found


def test_the_build_checks_every_pin_first():
    dockerfile = (REPO / "Dockerfile").read_text()
    steps = instructions(dockerfile)
    main_stage = [step for step in steps if step.stage == 1]
    first_copy = next(step for step in main_stage if step.name in ("COPY", "RUN"))
    assert first_copy.name == "COPY" and first_copy.value.startswith("--from=pins "), "the image must wait for it"
    checked = preflight_pins(dockerfile)
    from_pins = {"CUDA_VERSION", "UBUNTU_VERSION", "CUDA_IMAGE_DIGEST"}  # FROM fails at once on its own
    assert sorted({name for name, _ in image_pins()} - from_pins - set(checked)) == []
    assert sorted(pin for pin in downloaded_pins(dockerfile) if checked.get(pin, "set") == "set") == []


def test_the_first_step_check_catches_the_build_that_checked_nothing():
    dockerfile = (BEFORE / "Dockerfile").read_text()
    assert preflight_pins(dockerfile) == {}
    assert {"DEEPEP_COMMIT", "AWS_OFI_NCCL_VERSION", "NCCL_VERSION"} <= downloaded_pins(dockerfile)


# --- evidence and compatibility ----------------------------------------------------------------------------------

PIN_ROW = re.compile(r"^\| `([A-Z][A-Z0-9_]*)` \| `([^`]*)` \| (.+) \|$")


def recorded_pins() -> dict[str, tuple[str, str]]:
    """Pin -> (value, evidence) of the pin table in docs/image.md."""
    rows = (PIN_ROW.match(line) for line in (REPO / "docs" / "image.md").read_text().splitlines())
    return {row[1]: (row[2], row[3]) for row in rows if row}


def unrecorded(pins: dict[str, str]) -> list[str]:
    """The pins whose value has no row with evidence in docs/image.md: each was checked upstream when recorded."""
    recorded = recorded_pins()
    missing = [f"{name}={value}" for name, value in pins.items() if recorded.get(name, ("",))[0] != value]
    return missing + [f"{name}: no evidence" for name, (_, evidence) in recorded.items() if len(evidence) < 20]


def test_every_image_pin_is_recorded_with_its_evidence():
    assert unrecorded(dict(image_pins())) == [], "check the value upstream and record it in docs/image.md"
    assert sorted(set(recorded_pins()) - {name for name, _ in image_pins()}) == [], "rows for pins no longer pinned"


def test_a_pin_changed_without_recorded_evidence_is_caught():
    missing = unrecorded(dict(image_pins(BEFORE / "versions.txt")))
    assert "DEEPEP_COMMIT=4580d731d359e0a99465342442d25fa2512859cc" in missing
    assert "NCCL_VERSION=v2.29.3-1" in missing


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def python_pin(package: str, versions: Path = REPO / "versions.txt") -> str:
    match = re.search(rf"^{re.escape(package)}==(\S+)$", versions.read_text(), flags=re.M)
    assert match, f"no {package} pin"
    return match[1]


# What each component's project documents that it needs of the others (docs/image.md cites each).
REQUIREMENTS = {
    "aws-ofi-nccl >= 1.21.0 (first release with GIN)": lambda pins, nccl: (
        version(pins["AWS_OFI_NCCL_VERSION"]) >= (1, 21, 0)
    ),
    "NCCL >= 2.31.2 (aws-ofi-nccl GIN)": lambda pins, nccl: version(nccl) >= (2, 31, 2),
    "NCCL >= 2.29.2 (DeepEP's NCCL backend, README-NCCL.md)": lambda pins, nccl: version(nccl) >= (2, 29, 2),
    "GDRCopy >= 2.5 (aws-ofi-nccl GIN)": lambda pins, nccl: version(pins["GDRCOPY_VERSION"]) >= (2, 5),
    "EFA installer >= 1.49.0 (aws-ofi-nccl >= 1.20: no broadcast hang)": lambda pins, nccl: (
        version(pins["EFA_INSTALLER_VERSION"]) >= (1, 49, 0)
    ),
}


def test_the_stack_meets_its_documented_requirements():
    pins, nccl = dict(image_pins()), python_pin("nvidia-nccl-cu13")
    assert [name for name, met in REQUIREMENTS.items() if not met(pins, nccl)] == []


def test_the_requirement_check_catches_the_stack_before_issue_25():
    before = BEFORE / "versions.txt"
    pins = dict(image_pins(before))
    nccl = pins["NCCL_VERSION"].lstrip("v").rsplit("-", 1)[0]
    assert [name for name, met in REQUIREMENTS.items() if not met(pins, nccl)] == [
        "aws-ofi-nccl >= 1.21.0 (first release with GIN)",
        "NCCL >= 2.31.2 (aws-ofi-nccl GIN)",
        "EFA installer >= 1.49.0 (aws-ofi-nccl >= 1.20: no broadcast hang)",
    ]


def test_one_nvshmem_and_one_nccl_the_wheels_of_the_stack():
    """NVSHMEM and NCCL come from the [python] wheels (DeepEP links NVSHMEM's, torch loads NCCL's): no second copy
    from apt or a source build."""
    for dockerfile, expected in (((REPO / "Dockerfile").read_text(), []), ((BEFORE / "Dockerfile").read_text(), None)):
        installs = []
        for step in instructions(dockerfile):
            if step.name == "RUN":
                for call in calls(shell_tree(step.value), dict(image_pins())):
                    rendered = " ".join(call.words)
                    if ("apt-get" in call.words and "install" in call.words and "nvshmem" in rendered) or (
                        call.name == "git" and "NVIDIA/nccl.git" in rendered
                    ):
                        installs.append(rendered if not is_computed(rendered) else call.words[0])
        if expected is None:
            assert installs, "the Dockerfile before issue 25 installed NVSHMEM from apt and built NCCL"
        else:
            assert installs == expected


# --- NCCL_GIN_TYPE against the image's NCCL ---------------------------------------------------------------------


def gin_types(header: Path) -> dict[int, str]:
    """Value -> name of the GIN types of an nccl_device/core.h (its enum ncclGinType_t), as NCCL_GIN_TYPE takes them."""
    enum = re.search(r"typedef enum \{(.*?)\} ncclGinType_t;", header.read_text(), flags=re.S)
    assert enum, f"{header} defines no ncclGinType_t"
    return {int(value): name for name, value in re.findall(r"\bNCCL_GIN_TYPE_(\w+) = (\d+)", enum[1])}


def gin_values_named(text: str) -> list[tuple[int, str | None]]:
    """Each GIN type value that the NCCL_GIN_TYPE row of docs/network.md speaks of, with the enum name it gives it:
    "`N` is `NCCL_GIN_TYPE_X`" or "`N` (`NCCL_GIN_TYPE_X`)"; None where it names none."""
    (row,) = [line for line in text.splitlines() if line.startswith("| `NCCL_GIN_TYPE` |")]
    why = row.split(" | ")[2]
    found = re.finditer(r"`(\d+)`(?: is `NCCL_GIN_TYPE_(\w+)`| \(`NCCL_GIN_TYPE_(\w+)`\))?", why)
    return [(int(match[1]), match[2] or match[3]) for match in found]


def test_the_gin_types_srun_sh_exports_and_documents_are_those_of_the_images_nccl():
    """The test environment holds the image's NCCL wheel (the same [python] pin); its header is the evidence."""
    assert metadata.version("nvidia-nccl-cu13") == python_pin("nvidia-nccl-cu13")
    header = Path(str(metadata.distribution("nvidia-nccl-cu13").locate_file("nvidia/nccl/include/nccl_device/core.h")))
    types = gin_types(header)
    assert (types[2], types[3], types[5]) == ("PROXY", "GDAKI", "EFA_GDA")
    exported = re.search(r"NCCL_GIN_TYPE=\$\{NCCL_GIN_TYPE:-(\d+)\}", (REPO / "srun.sh").read_text())
    assert exported and types[int(exported[1])] == "PROXY", "srun.sh must export the proxy type aws-ofi-nccl supports"
    named = gin_values_named((REPO / "docs" / "network.md").read_text())
    assert {value for value, _ in named} >= {2, 3, 5}
    assert [(value, name) for value, name in named if name != types.get(value)] == []


def test_the_gin_type_check_catches_the_row_before_issue_35():
    before = (  # docs/network.md's row before issue 35, which took 3 for EFA's device-initiated GIN
        "| `NCCL_GIN_TYPE` | `2` | DeepEP's GPU-initiated networking through NCCL's proxy GIN (aws-ofi-nccl 1.21's GIN"
        " path); `3`, device-initiated GIN over EFA, is NCCL 2.31's newer path |"
    )
    assert gin_values_named(before) == [(3, None)]
