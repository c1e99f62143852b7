"""The image build's last step: prove that the image holds what it claims, or stop the build with one line saying what
is wrong.

    python tools/image/check_image.py VERSIONS_TXT

- NCCL: every process loads one NCCL, the nvidia-nccl-cu13 wheel at its [python] pin. torch finds it through its
  RPATH, everything else through the loader (the image registers the wheel's folder), and no other libnccl.so is on
  the loader's path.
- aws-ofi-nccl: the NET plugin that NCCL loads by its default name (libnccl-net.so, NCCL's src/plugin/net.cc) is the
  only one on the loader's path, exports the GIN plugin table that NCCL looks up in it (ncclGinPlugin_v13,
  src/plugin/gin/gin_v13.cc), and was compiled with GDRCopy, whose library (2.5 or newer, aws-ofi-nccl's GIN
  requirement) the loader finds.
- pip keeps that NCCL: torch 2.11.0 requires nvidia-nccl-cu13==2.28.9 (too old for GIN), so a `pip install` that
  resolves torch's dependencies would put that one back. The image's PIP_CONSTRAINT pins the wheel, and pip's own
  dry run of `pip install torch==<installed>` must then either refuse (a conflict with that constraint) or leave the
  NCCL as it is.
- The Python stack imports, DeepEP included; their versions are printed.
- cuDNN: torch and Transformer Engine run the nvidia-cudnn-cu13 wheel at its [python] pin, every library of it, and
  no other cuDNN is mapped.
- megatron-core's flex dispatcher can use DeepEP (its fused_a2a imports DeepEP V1's API), and DeepEP was built with
  its NCCL (GIN) backend: its extension links libnccl.so.2, which it does only when built with NCCL_DIR.

There is no GPU during the build: the step puts CUDA's driver stub first on LD_LIBRARY_PATH.
"""

import ctypes
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import psutil

NCCL_WHEEL = "nvidia-nccl-cu13"
CUDNN_WHEEL = "nvidia-cudnn-cu13"
NET_PLUGIN = "libnccl-net.so"
GIN_TABLE = "ncclGinPlugin_v13"
# aws-ofi-nccl's src/nccl_ofi_gdrcopy.cpp: the first string exists only when GDRCopy was found at configure time, the
# second only when it was not.
WITH_GDRCOPY = b"Could not load libgdrapi.so"
WITHOUT_GDRCOPY = b"GDRCopy support not available at compile time"
GDRCOPY_LIBRARY = "libgdrapi.so"
GDRCOPY_MINIMUM = (2, 5)
STACK = ("torch", "transformer_engine", "megatron.core", "megatron.bridge", "deep_ep", "viztracer")
DISTRIBUTIONS = ("torch", "transformer_engine", "megatron-core", "megatron-bridge", "deep_ep", "viztracer", NCCL_WHEEL)


class ImageCheckError(Exception):
    """What the image does not hold, as one line."""


def pinned_version(versions: Path, section: str, package: str) -> str:
    """The version that versions.txt pins for package in [section]."""
    current = None
    for line in versions.read_text().splitlines():
        if line.startswith("["):
            current = line.strip()
        elif current == f"[{section}]" and line.lower().startswith(f"{package.lower()}=="):
            return line.split("==", 1)[1].strip()
    raise ImageCheckError(f"{versions}: no {package} pin in [{section}]")


def mapped_libraries(pattern: str) -> set[str]:
    """Paths of the shared libraries this process has mapped whose file name matches pattern."""
    paths = {Path(mapped.path) for mapped in psutil.Process().memory_maps()}
    return {str(path.resolve()) for path in paths if re.fullmatch(pattern, path.name)}


def loader_paths(soname: str) -> list[str]:
    """Every path the loader's cache (ldconfig -p; LD_SO_CACHE names another cache file) knows for soname."""
    cache = ["-C", os.environ["LD_SO_CACHE"]] if "LD_SO_CACHE" in os.environ else []
    listing = subprocess.run(["ldconfig", "-p", *cache], capture_output=True, text=True, check=True).stdout
    return [line.rsplit("=> ", 1)[1] for line in listing.splitlines() if line.strip().startswith(soname + " ")]


def wheel_file(distribution: str, name: str) -> str:
    files = [f for f in metadata.files(distribution) or [] if Path(str(f)).name == name]
    if not files:
        raise ImageCheckError(f"the {distribution} wheel ships no {name}")
    return str(Path(str(files[0].locate())).resolve())


def check_installed(distribution: str, expected: str) -> None:
    installed = metadata.version(distribution)
    if installed != expected:
        raise ImageCheckError(f"{distribution} {installed} is installed, not the pinned {expected}")


def check_nccl(expected: str) -> str:
    """torch runs the pinned wheel's NCCL and no other NCCL is mapped; returns its version."""
    import torch

    check_installed(NCCL_WHEEL, expected)
    torch.cuda.nccl.version()  # makes sure torch's NCCL is loaded
    wheel = wheel_file(NCCL_WHEEL, "libnccl.so.2")
    mapped = mapped_libraries(r"libnccl\.so(\.\d+)*")
    if mapped != {wheel}:
        raise ImageCheckError(f"this process maps NCCL from {sorted(mapped)}, not only the wheel's {wheel}")
    loaded = runtime_version(wheel)
    if loaded != expected:
        raise ImageCheckError(f"torch runs NCCL {loaded}, not the pinned {NCCL_WHEEL} {expected}")
    return loaded


def runtime_version(library: str) -> str:
    """The version the loaded NCCL reports (ncclGetVersion); torch.cuda.nccl.version() is the one torch was built
    with, which --no-deps lets differ (torch 2.11.0 was built with 2.28.9)."""
    code = ctypes.c_int()
    ctypes.CDLL(library).ncclGetVersion(ctypes.byref(code))
    return f"{code.value // 10000}.{code.value // 100 % 100}.{code.value % 100}"


def check_pip_keeps_nccl(expected: str) -> None:
    """What `pip install torch==<installed>` would do to the NCCL wheel, asked of pip itself (--dry-run): it must
    either refuse, its conflict naming the pinned NCCL as a constraint, or install no other NCCL."""
    torch = f"torch=={metadata.version('torch')}"
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--report", str(report), torch]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        planned = json.loads(report.read_text())["install"] if result.returncode == 0 else []
    if result.returncode and f"(constraint) {NCCL_WHEEL}=={expected}" not in result.stdout:  # pip's conflict report
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ImageCheckError(f"pip could not tell what `pip install {torch}` would install: {last}")
    versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in planned}
    if versions.get(NCCL_WHEEL, expected) != expected:
        raise ImageCheckError(
            f"a later `pip install {torch}` would replace {NCCL_WHEEL} {expected} by {versions[NCCL_WHEEL]}:"
            f" PIP_CONSTRAINT ({os.environ.get('PIP_CONSTRAINT', 'unset')}) must pin {NCCL_WHEEL}=={expected}"
        )


def check_cudnn(expected: str) -> str:
    """torch and Transformer Engine run the pinned cuDNN wheel and map no other cuDNN; returns its version.
    Transformer Engine looks in CUDNN_PATH, CUDA_HOME and the loader's path before the wheel, and once one copy's
    sub-libraries are loaded every libcudnn.so.9 of the process uses them."""
    import torch
    import transformer_engine.pytorch  # noqa: F401  (loads its cuDNN)

    check_installed(CUDNN_WHEEL, expected)
    folder = Path(wheel_file(CUDNN_WHEEL, "libcudnn.so.9")).parent
    stray = sorted(path for path in mapped_libraries(r"libcudnn.*\.so(\.\d+)*") if Path(path).parent != folder)
    if stray:
        raise ImageCheckError(f"this process maps cuDNN from {stray}, not only from the {CUDNN_WHEEL} wheel's {folder}")
    runtime = ".".join(str(part) for part in torch._C._cudnn.getRuntimeVersion())
    if not expected.startswith(f"{runtime}."):
        raise ImageCheckError(f"torch runs cuDNN {runtime}, not the pinned {CUDNN_WHEEL} {expected}")
    return runtime


def check_loader_nccl() -> None:
    """A process that loads libnccl.so.2 by name (nccl-tests, the net plugin's tools) gets the wheel's NCCL."""
    wheel = wheel_file(NCCL_WHEEL, "libnccl.so.2")
    found = sorted({str(Path(path).resolve()) for path in loader_paths("libnccl.so.2")})
    if found != [wheel]:
        raise ImageCheckError(f"the loader finds libnccl.so.2 at {found or 'no path'}, not only at the wheel's {wheel}")


def check_net_plugin() -> Path:
    """The one NET plugin NCCL loads by default is aws-ofi-nccl with GIN and GDRCopy; returns its path."""
    known = sorted({str(Path(path).resolve()) for path in loader_paths(NET_PLUGIN)})
    if len(known) != 1:
        raise ImageCheckError(f"the loader knows {len(known)} {NET_PLUGIN} ({', '.join(known) or 'none'}), not one")
    plugin = ctypes.CDLL(NET_PLUGIN)
    path = Path(known[0])
    if str(path) not in mapped_libraries(r"libnccl-net.*\.so.*"):
        raise ImageCheckError(f"dlopen({NET_PLUGIN}) loads another file than the loader's {path} (LD_LIBRARY_PATH)")
    if not hasattr(plugin, GIN_TABLE):
        raise ImageCheckError(f"{path} exports no {GIN_TABLE}: it was built without GIN, which NCCL looks up there")
    binary = path.read_bytes()
    if WITHOUT_GDRCOPY in binary or WITH_GDRCOPY not in binary:
        raise ImageCheckError(f"{path} was built without GDRCopy: its GIN refuses to start (configure --with-gdrcopy)")
    return path


def check_gdrcopy() -> tuple[int, int]:
    """The GDRCopy library that aws-ofi-nccl opens by name is found and is new enough; returns its version."""
    try:
        library = ctypes.CDLL(GDRCOPY_LIBRARY)
    except OSError as error:
        raise ImageCheckError(
            f"the loader cannot open {GDRCOPY_LIBRARY} (aws-ofi-nccl's GIN needs it): {error}"
        ) from None
    major, minor = ctypes.c_int(), ctypes.c_int()
    library.gdr_runtime_get_version(ctypes.byref(major), ctypes.byref(minor))
    version = (major.value, minor.value)
    if version < GDRCOPY_MINIMUM:
        raise ImageCheckError(f"{GDRCOPY_LIBRARY} is GDRCopy {major.value}.{minor.value}; GIN needs 2.5 or newer")
    return version


def links_nccl(library: Path) -> bool:
    """Whether a shared library names libnccl.so.2 among the libraries it needs (its ELF dynamic section)."""
    dynamic = subprocess.run(["readelf", "--dynamic", str(library)], capture_output=True, text=True, check=True).stdout
    return "[libnccl.so.2]" in dynamic


def check_deepep() -> None:
    from megatron.core.transformer.moe import fused_a2a

    if not fused_a2a.HAVE_DEEP_EP:
        raise ImageCheckError(
            "megatron-core cannot use the installed DeepEP (fused_a2a.HAVE_DEEP_EP is False: it imports"
            " deep_ep.utils.EventOverlap, DeepEP V1's API): DEEPEP_COMMIT must be a DeepEP V1 commit"
        )
    extension = Path(importlib.import_module("deep_ep_cpp").__file__)
    if not links_nccl(extension):
        raise ImageCheckError(f"{extension} links no NCCL: DeepEP was built without its NCCL (GIN) backend (NCCL_DIR)")


def check_stack() -> None:
    for module in STACK:
        importlib.import_module(module)
    from megatron.core.datasets import helpers_cpp  # noqa: F401  (the wheel's prebuilt dataset helper)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: check_image.py VERSIONS_TXT", file=sys.stderr)
        return 2
    try:
        nccl = check_nccl(pinned_version(Path(argv[0]), "python", NCCL_WHEEL))
        check_loader_nccl()
        check_pip_keeps_nccl(nccl)
        plugin = check_net_plugin()
        gdrcopy = check_gdrcopy()
        check_stack()
        cudnn = check_cudnn(pinned_version(Path(argv[0]), "python", CUDNN_WHEEL))
        check_deepep()
        check_nccl(nccl)  # DeepEP and TE loaded no second NCCL
    except ImageCheckError as error:
        print(f"check_image.py: {error}", file=sys.stderr)
        return 1
    for distribution in DISTRIBUTIONS:
        print(f"{distribution}=={metadata.version(distribution)}")
    print(f"pip keeps {NCCL_WHEEL} {nccl} (PIP_CONSTRAINT={os.environ.get('PIP_CONSTRAINT', 'unset')})")
    print(f"NCCL {nccl} from the {NCCL_WHEEL} wheel; NET plugin {plugin} (GIN, GDRCopy {gdrcopy[0]}.{gdrcopy[1]})")
    print(f"cuDNN {cudnn} from the {CUDNN_WHEEL} wheel")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
