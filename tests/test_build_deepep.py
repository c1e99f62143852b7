"""tools/build_deepep.sh refuses what cannot build, in one line, before compiling anything; run as the Dockerfile runs
it (the build itself needs 2-3 minutes of nvcc)."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

BUILD = REPO / "tools" / "build_deepep.sh"


def v1_tree(root: Path) -> Path:
    """The files by which the script tells DeepEP V1 (the Buffer API megatron-core 0.19.2 calls) from V2."""
    for name in ("setup.py", "deep_ep/buffer.py", "deep_ep/utils.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    return root


def v2_tree(root: Path) -> Path:
    for name in ("setup.py", "deep_ep/buffers/legacy.py", "deep_ep/utils/event.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).touch()
    return root


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def build(*args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHON": sys.executable, "TORCH_CUDA_ARCH_LIST": "9.0", **env}
    return subprocess.run(["bash", str(BUILD), *map(str, args)], env=environment, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def refused(done: subprocess.CompletedProcess, status: int, message: str) -> None:
    assert done.returncode == status, done.stdout + done.stderr
    assert done.stderr.splitlines() == [f"build_deepep.sh: {message}"], done.stderr
    assert done.stdout == ""


def test_without_a_source_tree_it_prints_its_usage(tmp_path: Path):
    refused(build(), 2, "usage: PYTHON=... TORCH_CUDA_ARCH_LIST=... bash tools/build_deepep.sh SRC_DIR")
    missing = tmp_path / "none"
    refused(build(missing), 2, f"SRC_DIR {missing} is not a directory: pass a checkout of deepseek-ai/DeepEP")


def test_deepep_v2_is_refused_as_megatron_core_cannot_call_it(tmp_path: Path):
    source = v2_tree(tmp_path / "DeepEP")
    refused(
        build(source),
        2,
        f"{source} is not DeepEP V1 (no deep_ep/buffer.py and deep_ep/utils.py), the API megatron-core 0.19.2 calls:"
        " check out DEEPEP_COMMIT of versions.txt",
    )


@pytest.mark.parametrize(
    ("arch", "message"),
    [
        ("", "TORCH_CUDA_ARCH_LIST is not set: say which GPUs to build for, e.g. TORCH_CUDA_ARCH_LIST=9.0"),
        ("sm_90", 'TORCH_CUDA_ARCH_LIST=sm_90 is not a list of compute capabilities like 9.0 or "9.0;10.0"'),
    ],
)
def test_the_gpu_architectures_must_be_named(tmp_path: Path, arch: str, message: str):
    refused(build(v1_tree(tmp_path), TORCH_CUDA_ARCH_LIST=arch), 2, message)


def test_a_python_without_torch_is_refused(tmp_path: Path):
    python = executable(tmp_path / "python3", "#!/usr/bin/env bash\nexit 1\n")
    refused(
        build(v1_tree(tmp_path / "DeepEP"), PYTHON=str(python)),
        1,
        f"{python} cannot import torch: DeepEP builds against the torch it will run with (PYTHON=...)",
    )


def test_an_nvcc_of_another_cuda_than_torchs_is_refused(tmp_path: Path):
    major = torch.version.cuda.split(".")[0]
    other = int(major) - 1
    cuda = tmp_path / "cuda"
    nvcc = f"#!/usr/bin/env bash\necho 'Cuda compilation tools, release {other}.8, V{other}.8.93'\n"
    executable(cuda / "bin" / "nvcc", nvcc)
    refused(
        build(v1_tree(tmp_path / "DeepEP"), CUDA_HOME=str(cuda)),
        1,
        f"nvcc in {cuda} is CUDA {other}, torch was built with CUDA {major}: set CUDA_HOME to a CUDA {major} toolkit",
    )
    refused(
        build(v1_tree(tmp_path / "DeepEP"), CUDA_HOME=str(tmp_path)),
        1,
        f"no nvcc in CUDA_HOME={tmp_path}: set CUDA_HOME to a CUDA {major} toolkit",
    )


def nccl_dir(root: Path, version: tuple[int, int, int], device_api: bool = True) -> Path:
    """An NCCL installation as the nvidia-nccl-cu13 wheel lays it out: include/ (nccl.h with its version, and
    nccl_device.h for the Device API) and lib/libnccl.so.2, without the unversioned libnccl.so."""
    major, minor, patch = version
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    defines = f"#define NCCL_MAJOR {major}\n#define NCCL_MINOR {minor}\n#define NCCL_PATCH {patch}\n"
    (root / "include" / "nccl.h").write_text(defines)
    if device_api:
        (root / "include" / "nccl_device.h").touch()
    (root / "lib" / "libnccl.so.2").touch()
    return root


def nccl_backend_tree(root: Path) -> Path:
    v1_tree(root)
    (root / "csrc" / "kernels").mkdir(parents=True)
    (root / "csrc" / "kernels" / "nccl_gin_backend.cu").touch()
    return root


def test_the_nccl_backend_needs_a_deepep_that_has_it(tmp_path: Path):
    source = v1_tree(tmp_path / "DeepEP")
    refused(
        build(source, NCCL_DIR=str(nccl_dir(tmp_path / "nccl", (2, 31, 2)))),
        2,
        f"{source} has no NCCL backend (csrc/kernels/nccl_gin_backend.cu): check out DEEPEP_COMMIT of versions.txt,"
        " or unset NCCL_DIR to build with NVSHMEM",
    )


def test_the_nccl_backend_needs_nccl_2_29_2_with_the_device_api(tmp_path: Path):
    source = nccl_backend_tree(tmp_path / "DeepEP")
    old = nccl_dir(tmp_path / "old", (2, 28, 9))
    refused(
        build(source, NCCL_DIR=str(old)),
        2,
        f"NCCL_DIR={old} holds NCCL 2.28.9; DeepEP's NCCL backend needs 2.29.2 or newer",
    )
    plain = nccl_dir(tmp_path / "plain", (2, 31, 2), device_api=False)
    refused(
        build(source, NCCL_DIR=str(plain)),
        2,
        f"NCCL_DIR={plain} lacks include/nccl.h, include/nccl_device.h or lib/libnccl.so.2: point it at an NCCL with"
        " the Device API (the nvidia-nccl-cu13 wheel's nvidia/nccl)",
    )
