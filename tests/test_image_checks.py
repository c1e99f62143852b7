"""The image's build-time checks, run here: tools/image/check_image.py against the test environment's torch and NCCL
wheel and against NET plugins and GDRCopy libraries compiled for the test, and the Nsight Systems key step of the
Dockerfile itself, with real gpg and a stand-in download that holds two keys."""

import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from tests.dockerfile_model import instructions

REPO = Path(__file__).resolve().parents[1]
CHECK_IMAGE = REPO / "tools" / "image" / "check_image.py"
BEFORE = REPO / "tests" / "fixtures" / "image" / "before-issue-25"


def run_check(code: str, **env: str) -> subprocess.CompletedProcess:
    """Call check_image's functions in a fresh interpreter of the test environment, as the build's last step does."""
    program = f"import sys; sys.path.insert(0, {str(CHECK_IMAGE.parent)!r}); import check_image as c\n{code}"
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=False,
    )


def test_nccl_check_passes_for_the_wheel_torch_loads():
    installed = metadata.version("nvidia-nccl-cu13")
    result = run_check(f"print(c.check_nccl({installed!r}))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == installed


def test_nccl_check_names_the_pin_torch_does_not_run():
    result = run_check("c.check_nccl('2.99.1')")
    assert result.returncode != 0
    assert "ImageCheckError: nvidia-nccl-cu13" in result.stderr
    assert "is installed, not the pinned 2.99.1" in result.stderr


def test_nccl_pin_is_read_from_versions_txt():
    result = run_check(f"print(c.pinned_version(c.Path({str(REPO / 'versions.txt')!r}), 'python', 'nvidia-nccl-cu13'))")
    assert result.stdout.strip() == "2.31.2", result.stderr


def test_cudnn_check_passes_for_the_wheel_torch_and_transformer_engine_load():
    pinned = "c.pinned_version(c.Path(sys.argv[1]), 'python', 'nvidia-cudnn-cu13')"
    result = run_check(f"sys.argv[1:] = [{str(REPO / 'versions.txt')!r}]; print(c.check_cudnn({pinned}))")
    assert result.returncode == 0, result.stderr
    assert metadata.version("nvidia-cudnn-cu13").startswith(result.stdout.strip() + ".")


def test_cudnn_check_names_a_second_cudnn_that_transformer_engine_prefers(tmp_path: Path):
    """Transformer Engine takes CUDNN_PATH (then CUDA_HOME, the loader's path) before the wheel."""
    wheel = Path(metadata.distribution("nvidia-cudnn-cu13").locate_file("nvidia/cudnn/lib/libcudnn.so.9"))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcudnn.so.9").write_bytes(wheel.read_bytes())
    installed = metadata.version("nvidia-cudnn-cu13")

    result = run_check(f"c.check_cudnn({installed!r})", CUDNN_PATH=str(tmp_path))

    assert result.returncode != 0
    assert f"ImageCheckError: this process maps cuDNN from ['{tmp_path}/lib/libcudnn.so.9']" in result.stderr


# --- pip keeps the image's NCCL ---------------------------------------------------------------------------------

CONSTRAINTS = "/opt/toolkit/pip-constraints.txt"


@pytest.fixture(scope="module")
def torchs_nccl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder that offers pip nvidia-nccl-cu13 2.28.9, the release that torch 2.11.0 requires, as PyPI does: a wheel
    of that name and version with nothing in it (pip's dry run reads only its metadata)."""
    folder = tmp_path_factory.mktemp("index")
    info = "nvidia_nccl_cu13-2.28.9.dist-info"
    with zipfile.ZipFile(folder / "nvidia_nccl_cu13-2.28.9-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 2.28.9\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return folder


def image_constraints(tmp_path: Path, dockerfile: str) -> Path:
    """The pip constraints file as the Dockerfile's own command writes it from versions.txt, /opt/toolkit moved here."""
    step = next(step.value for step in instructions(dockerfile) if step.name == "RUN" and CONSTRAINTS in step.value)
    (command,) = [part.strip() for part in step.split("&&") if CONSTRAINTS in part]
    (tmp_path / "versions.txt").write_text((REPO / "versions.txt").read_text())
    subprocess.run(["bash", "-c", command.replace("/opt/toolkit/", f"{tmp_path}/")], check=True, timeout=30)
    return tmp_path / "pip-constraints.txt"


def pip_check(constraints: Path, index: Path) -> subprocess.CompletedProcess:
    """check_pip_keeps_nccl against the test environment (torch 2.11.0 and the pinned NCCL wheel, installed as in the
    image with --no-deps), pip offline with `index` for PyPI."""
    installed = metadata.version("nvidia-nccl-cu13")
    return run_check(
        f"c.check_pip_keeps_nccl({installed!r})",
        PIP_CONSTRAINT=str(constraints),
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(index),
    )


def test_pip_keeps_the_nccl_under_the_constraints_the_image_sets(tmp_path: Path, torchs_nccl: Path):
    constraints = image_constraints(tmp_path, (REPO / "Dockerfile").read_text())
    assert f"nvidia-nccl-cu13=={metadata.version('nvidia-nccl-cu13')}" in constraints.read_text().splitlines()
    result = pip_check(constraints, torchs_nccl)
    assert result.returncode == 0, result.stderr


def test_pip_check_names_the_nccl_that_a_later_install_would_put_back(tmp_path: Path, torchs_nccl: Path):
    """The image before issue 35 set no constraints: pip would install torch's own NCCL pin over the image's."""
    (tmp_path / "none.txt").write_text("")
    result = pip_check(tmp_path / "none.txt", torchs_nccl)
    assert result.returncode == 1
    installed = metadata.version("nvidia-nccl-cu13")
    assert f"would replace nvidia-nccl-cu13 {installed} by 2.28.9: PIP_CONSTRAINT" in result.stderr


def test_the_image_check_runs_under_the_pip_constraints():
    final = [step for step in instructions((REPO / "Dockerfile").read_text()) if step.stage == 1]
    kinds = [
        "writes" if step.name == "RUN" and f">{CONSTRAINTS}" in step.value
        else "env" if step.name == "ENV" and step.value == f"PIP_CONSTRAINT={CONSTRAINTS}"
        else "check" if step.name == "RUN" and "check_image.py" in step.value
        else None
        for step in final
    ]  # fmt: skip
    assert [kind for kind in kinds if kind] == ["writes", "env", "check"]


def test_check_image_usage_error_exits_2():
    result = subprocess.run([sys.executable, str(CHECK_IMAGE)], capture_output=True, text=True, check=False)
    assert (result.returncode, result.stderr.strip()) == (2, "usage: check_image.py VERSIONS_TXT")


# --- the NET plugin and GDRCopy, as compiled stand-ins ----------------------------------------------------------

PLUGINS = {
    "aws-ofi-nccl with GIN and GDRCopy": 'int ncclGinPlugin_v13 = 1; const char *m = "Could not load libgdrapi.so";',
    "without GIN": 'const char *m = "Could not load libgdrapi.so";',
    "without GDRCopy": 'int ncclGinPlugin_v13 = 1; const char *m = "GDRCopy support not available at compile time";',
}


def compile_library(directory: Path, name: str, source: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "lib.c").write_text(source + "\n")
    library = directory / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(directory / "lib.c")], check=True)
    return library


def loader_cache(tmp_path: Path, *folders: Path) -> Path:
    """A loader cache of the given folders (and the system's), as ldconfig builds it; no links are changed."""
    (tmp_path / "ld.so.conf").write_text("".join(f"{folder}\n" for folder in folders))
    cache = tmp_path / "ld.so.cache"
    subprocess.run(["ldconfig", "-X", "-f", str(tmp_path / "ld.so.conf"), "-C", str(cache)], check=True)
    return cache


def check_plugin(tmp_path: Path, *folders: Path) -> subprocess.CompletedProcess:
    cache = loader_cache(tmp_path, *folders)
    return run_check("print(c.check_net_plugin())", LD_SO_CACHE=str(cache), LD_LIBRARY_PATH=str(folders[0]))


def test_net_plugin_check_passes_for_aws_ofi_nccl_with_gin_and_gdrcopy(tmp_path: Path):
    plugin = compile_library(tmp_path / "ofi", "libnccl-net.so", PLUGINS["aws-ofi-nccl with GIN and GDRCopy"])
    result = check_plugin(tmp_path, plugin.parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(plugin)


@pytest.mark.parametrize(
    ("build", "message"),
    [("without GIN", "exports no ncclGinPlugin_v13"), ("without GDRCopy", "was built without GDRCopy")],
)
def test_net_plugin_check_refuses_a_plugin_whose_gin_cannot_start(tmp_path: Path, build: str, message: str):
    plugin = compile_library(tmp_path / "ofi", "libnccl-net.so", PLUGINS[build])
    result = check_plugin(tmp_path, plugin.parent)
    assert result.returncode != 0
    assert message in result.stderr


def test_net_plugin_check_refuses_a_second_plugin_on_the_loader_path(tmp_path: Path):
    ours = compile_library(tmp_path / "ofi", "libnccl-net.so", PLUGINS["aws-ofi-nccl with GIN and GDRCopy"])
    bundled = compile_library(tmp_path / "bundled", "libnccl-net.so", PLUGINS["without GDRCopy"])
    result = check_plugin(tmp_path, ours.parent, bundled.parent)
    assert result.returncode != 0
    assert "the loader knows 2 libnccl-net.so" in result.stderr


@pytest.mark.parametrize(("version", "ok"), [((2, 5), True), ((2, 6), True), ((2, 4), False)])
def test_gdrcopy_check_needs_2_5(tmp_path: Path, version: tuple[int, int], ok: bool):
    source = f"void gdr_runtime_get_version(int *a, int *b) {{ *a = {version[0]}; *b = {version[1]}; }}"
    library = compile_library(tmp_path / "gdrcopy", "libgdrapi.so", source)
    result = run_check("print(c.check_gdrcopy())", LD_LIBRARY_PATH=str(library.parent))
    assert (result.returncode == 0) == ok, result.stderr
    if not ok:
        assert "GIN needs 2.5 or newer" in result.stderr


def test_gdrcopy_check_names_a_missing_library(tmp_path: Path):
    result = run_check("c.check_gdrcopy()", LD_LIBRARY_PATH=str(tmp_path))
    assert result.returncode != 0
    assert "cannot open libgdrapi.so" in result.stderr


# --- the Nsight Systems key step, run ----------------------------------------------------------------------------


def gpg(home: Path, *args: str) -> str:
    result = subprocess.run(
        ["gpg", "--batch", "--homedir", str(home), *args], capture_output=True, text=True, check=True, timeout=60
    )
    return result.stdout


@pytest.fixture(scope="module")
def two_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """An armored nvidia.pub that holds two keys, and their fingerprints."""
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    for user in ("first@example.com", "second@example.com"):
        gpg(home, "--passphrase", "", "--quick-gen-key", user, "ed25519", "sign", "never")
    listing = gpg(home, "--with-colons", "--list-keys")
    fingerprints = [line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")]
    armored = home / "nvidia.pub"
    armored.write_text(gpg(home, "--armor", "--export"))
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], check=False)
    return armored, fingerprints[:2]


def nsight_step(dockerfile: str) -> str:
    return next(
        step.value for step in instructions(dockerfile) if step.name == "RUN" and "nvidia-devtools" in step.value
    )


def run_nsight_step(tmp_path: Path, dockerfile: str, nvidia_pub: Path, pin: str) -> subprocess.CompletedProcess:
    """The Dockerfile's Nsight step under bash, its two output folders moved under tmp_path, with stand-ins for the
    download (curl prints nvidia.pub), apt-get and nsys; gpg, awk and the rest are the real ones."""
    bin_dir, keyrings, sources = tmp_path / "bin", tmp_path / "keyrings", tmp_path / "sources"
    for folder in (bin_dir, keyrings, sources):
        folder.mkdir()
    (bin_dir / "curl").write_text(f'#!/bin/sh\ncat "{nvidia_pub}"\n')
    (bin_dir / "apt-get").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "nsys").write_text("#!/bin/sh\necho 'NVIDIA Nsight Systems version 2026.4.1'\n")
    for standin in bin_dir.iterdir():
        standin.chmod(0o755)
    step = nsight_step(dockerfile).replace("/usr/share/keyrings/", f"{keyrings}/")
    step = step.replace("/etc/apt/sources.list.d/", f"{sources}/")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "GNUPGHOME": str(tmp_path / "home-gnupg"),
        "NSYS_VERSION": "2026.4.1",
        "NSYS_KEY_FINGERPRINT": pin,
    }
    (tmp_path / "home-gnupg").mkdir(mode=0o700)
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", step], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def keyring_fingerprints(keyring: Path) -> list[str]:
    listing = subprocess.run(
        ["gpg", "--show-keys", "--with-colons", str(keyring)], capture_output=True, text=True, check=True
    ).stdout
    lines = listing.splitlines()
    return [lines[i + 1].split(":")[9] for i, line in enumerate(lines) if line.startswith("pub:")]


def test_nsight_step_trusts_only_the_pinned_key_of_several(tmp_path: Path, two_keys):
    nvidia_pub, (_, second) = two_keys
    result = run_nsight_step(tmp_path, (REPO / "Dockerfile").read_text(), nvidia_pub, second)
    assert result.returncode == 0, result.stderr
    assert keyring_fingerprints(tmp_path / "keyrings" / "nvidia-devtools.gpg") == [second]
    assert "signed-by=" in (tmp_path / "sources" / "nvidia-devtools.list").read_text()


def test_nsight_step_stops_when_the_pinned_key_is_not_offered(tmp_path: Path, two_keys):
    nvidia_pub, _ = two_keys
    result = run_nsight_step(tmp_path, (REPO / "Dockerfile").read_text(), nvidia_pub, "0" * 40)
    assert result.returncode == 1
    assert f"does not hold the pinned key {'0' * 40}" in result.stderr
    assert not (tmp_path / "sources" / "nvidia-devtools.list").exists()


def test_the_nsight_step_before_issue_25_broke_on_a_second_key(tmp_path: Path, two_keys):
    nvidia_pub, (first, _) = two_keys
    result = run_nsight_step(tmp_path, (BEFORE / "Dockerfile").read_text(), nvidia_pub, first)
    assert result.returncode == 1
    assert "not the pinned key" in result.stderr


def test_deepep_check_refuses_a_deepep_that_megatron_core_cannot_use():
    """The test environment has no DeepEP: megatron-core sees it as it sees V2 (no deep_ep.utils.EventOverlap)."""
    done = run_check("c.check_deepep()")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("check_image.ImageCheckError: megatron-core cannot use")


def test_deepep_nccl_backend_is_told_by_the_libraries_its_extension_needs(tmp_path: Path):
    """An extension built with NCCL_DIR needs libnccl.so.2; one built with NVSHMEM does not."""
    (tmp_path / "nccl.c").write_text("int ncclGetVersion(int *v) { *v = 23102; return 0; }\n")
    (tmp_path / "ext.c").write_text(
        "int ncclGetVersion(int *v);\nint call(void) { int v; return ncclGetVersion(&v); }\n"
    )
    (tmp_path / "plain.c").write_text("int call(void) { return 0; }\n")
    cc = ["gcc", "-shared", "-fPIC"]
    subprocess.run([*cc, "-Wl,-soname,libnccl.so.2", "-o", tmp_path / "libnccl.so.2", tmp_path / "nccl.c"], check=True)
    subprocess.run([*cc, "-o", tmp_path / "with_nccl.so", tmp_path / "ext.c", tmp_path / "libnccl.so.2"], check=True)
    subprocess.run([*cc, "-o", tmp_path / "without.so", tmp_path / "plain.c"], check=True)

    done = run_check(f"print(c.links_nccl(c.Path({str(tmp_path / 'with_nccl.so')!r})),"
                     f" c.links_nccl(c.Path({str(tmp_path / 'without.so')!r})))")  # fmt: skip
    assert done.stdout.split() == ["True", "False"], done.stderr
