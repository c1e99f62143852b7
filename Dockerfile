# The image every rank runs in: CUDA + EFA + NCCL (Device API) + aws-ofi-nccl (GIN) + DeepEP (NCCL GIN backend)
# + the pinned Megatron Bridge stack. Build it with `make build`, which passes every [image] pin of versions.txt as a
# --build-arg; none of the ARGs below has a default, and each step stops with a clear message if its pin is missing.
#
# Layers go from what changes least to what changes most; our own Python code is the last layer, so editing it
# rebuilds only that layer. Each ARG is declared right before the first step that uses it, so bumping one pin
# rebuilds from that step on.

# The tag names the base image; the digest pins its content, since NVIDIA rebuilds a tag (security updates) and a
# digest is the one reference that cannot change.
ARG CUDA_VERSION
ARG UBUNTU_VERSION
ARG CUDA_IMAGE_DIGEST
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION}@${CUDA_IMAGE_DIGEST}

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive

# Build tools and Python. Package versions come with the Ubuntu release the base image tag pins; Ubuntu replaces
# them with security updates, so pinning each one would break the build instead of making it reproducible.
# cuda-compat is removed, as in the reference design, so the host driver's libcuda (mounted by enroot) is the only
# one the loader can find: the hosts must run a driver for CUDA 13 (R580 or newer).
ARG PYTHON_VERSION
# hadolint ignore=DL3008
RUN : "${PYTHON_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        autoconf automake build-essential ca-certificates check curl git gnupg hwloc iproute2 kmod libhwloc-dev \
        libsubunit-dev libtool ninja-build openssh-client pkg-config \
        "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-dev" "python${PYTHON_VERSION}-venv" \
    && { dpkg-query -W -f='${Package}\n' 'cuda-compat-*' 2>/dev/null || true; } | xargs -r apt-get purge -y \
    && rm -rf /var/lib/apt/lists/*

# Nsight Systems CLI from NVIDIA's devtools apt repository, trusted through its own keyring (signed-by), not apt-key.
# The keyring must hold exactly the key pinned by NSYS_KEY_FINGERPRINT: downloaded from the repository it vouches for,
# it proves nothing until compared.
ARG NSYS_VERSION
ARG NSYS_KEY_FINGERPRINT
# hadolint ignore=DL3008
RUN : "${NSYS_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && : "${NSYS_KEY_FINGERPRINT:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && ubuntu="ubuntu$(. /etc/os-release && echo "${VERSION_ID}" | tr -d .)" \
    && repo="https://developer.download.nvidia.com/devtools/repos/${ubuntu}/$(dpkg --print-architecture)" \
    && curl -fsSL "${repo}/nvidia.pub" | gpg --dearmor -o /usr/share/keyrings/nvidia-devtools.gpg \
    && keys=$(gpg --show-keys --with-colons /usr/share/keyrings/nvidia-devtools.gpg \
        | awk -F: '$1 == "pub" { primary = 1 } $1 == "fpr" && primary { print $10; primary = 0 }') \
    && if [ "${keys}" != "${NSYS_KEY_FINGERPRINT}" ]; then \
        echo "${repo}/nvidia.pub holds ${keys:-no key}, not the pinned key ${NSYS_KEY_FINGERPRINT}" >&2; exit 1; \
    fi \
    && echo "deb [signed-by=/usr/share/keyrings/nvidia-devtools.gpg] ${repo} /" \
        >/etc/apt/sources.list.d/nvidia-devtools.list \
    && apt-get update \
    && apt-get install -y --no-install-recommends "nsight-systems-cli-${NSYS_VERSION}" \
    && rm -rf /var/lib/apt/lists/* \
    && if ! command -v nsys >/dev/null; then \
        ln -s "/opt/nvidia/nsight-systems-cli/${NSYS_VERSION}/bin/nsys" /usr/local/bin/nsys; \
    fi \
    && nsys --version

# NVSHMEM from the CUDA apt repository that the base image already trusts (cuda-archive-keyring, signed-by).
ARG CUDA_VERSION
ARG NVSHMEM_VERSION
RUN : "${NVSHMEM_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && : "${CUDA_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && cuda_major="${CUDA_VERSION%%.*}" \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        "libnvshmem3-cuda-${cuda_major}=${NVSHMEM_VERSION}" "libnvshmem3-dev-cuda-${cuda_major}=${NVSHMEM_VERSION}" \
    && rm -rf /var/lib/apt/lists/*

# GDRCopy: user-space library and tools (the kernel module comes from the host).
ARG GDRCOPY_VERSION
RUN : "${GDRCOPY_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && git clone --depth 1 --branch "${GDRCOPY_VERSION}" https://github.com/NVIDIA/gdrcopy.git /tmp/gdrcopy \
    && make -C /tmp/gdrcopy prefix=/opt/gdrcopy CUDA=/usr/local/cuda install \
    && rm -rf /tmp/gdrcopy

# EFA user space: libfabric, rdma-core and Open MPI, without kernel module or plugin. The tarball is verified
# against AWS's GPG signature; the key must have the fingerprint AWS publishes in the EC2 user guide.
# The installer's bundled aws-ofi-nccl (1.18.0 in 1.47.0) predates GIN support (added in aws-ofi-nccl 1.19.0),
# so --skip-plugin and the next step builds a release that has it.
ARG EFA_INSTALLER_VERSION
# hadolint ignore=DL3003
RUN : "${EFA_INSTALLER_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && efa_key_fingerprint=4E9091BCBB97A96B26B15E59A05480B1DD2D3CCC \
    && tarball="aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
    && mkdir /tmp/efa && cd /tmp/efa \
    && curl -fsSLO "https://efa-installer.amazonaws.com/${tarball}" \
    && curl -fsSLO "https://efa-installer.amazonaws.com/${tarball}.sig" \
    && curl -fsSLO https://efa-installer.amazonaws.com/aws-efa-installer.key \
    && GNUPGHOME=$(mktemp -d) && export GNUPGHOME \
    && gpg --batch --quiet --import aws-efa-installer.key \
    && status=$(gpg --batch --status-fd 1 --verify "${tarball}.sig" "${tarball}") \
    && if ! printf '%s\n' "${status}" | grep -E "^\[GNUPG:\] VALIDSIG .* ${efa_key_fingerprint}$" >/dev/null; then \
        echo "${tarball}: not signed by the AWS EFA key ${efa_key_fingerprint}" >&2; exit 1; \
    fi \
    && tar -xzf "${tarball}" && cd aws-efa-installer \
    && apt-get update \
    && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify --skip-plugin --mpi=openmpi4 \
    && rm -rf /var/lib/apt/lists/* /tmp/efa "${GNUPGHOME}"

# aws-ofi-nccl with GIN support (proxy path, NCCL_GIN_TYPE=2): release 1.19.2 was tested by AWS with NCCL 2.29.7 and
# libfabric 2.4.0, the libfabric of EFA installer 1.47.0. The release tarball is checked against its published sha512.
ARG AWS_OFI_NCCL_VERSION
ARG AWS_OFI_NCCL_SHA512
# hadolint ignore=DL3003
RUN : "${AWS_OFI_NCCL_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && : "${AWS_OFI_NCCL_SHA512:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && name="aws-ofi-nccl-${AWS_OFI_NCCL_VERSION}" \
    && curl -fsSL -o "/tmp/${name}.tar.gz" \
        "https://github.com/aws/aws-ofi-nccl/releases/download/v${AWS_OFI_NCCL_VERSION}/${name}.tar.gz" \
    && echo "${AWS_OFI_NCCL_SHA512}  /tmp/${name}.tar.gz" | sha512sum --check --strict - \
    && tar -xzf "/tmp/${name}.tar.gz" -C /tmp && cd "/tmp/${name}" \
    && ./configure --prefix=/opt/amazon/ofi-nccl --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
        --with-nvtx=/usr/local/cuda --enable-platform-aws --disable-tests \
    && make -j"$(nproc)" && make install \
    && rm -rf "/tmp/${name}" "/tmp/${name}.tar.gz"

# NCCL from source, with the Device API (nccl_device.h) that GIN and DeepEP's NCCL backend use, then nccl-tests
# against it (alltoall_perf -D 3/4 exercises GIN). CUDA_ARCHS is a comma list in TORCH_CUDA_ARCH_LIST form.
ARG CUDA_ARCHS
ARG NCCL_VERSION
ARG NCCL_TESTS_VERSION
RUN : "${CUDA_ARCHS:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && : "${NCCL_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && : "${NCCL_TESTS_VERSION:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && gencode="" \
    && for sm in $(echo "${CUDA_ARCHS}" | tr -d . | tr , ' '); do \
        gencode="${gencode} -gencode=arch=compute_${sm},code=sm_${sm}"; \
    done \
    && git clone --depth 1 --branch "${NCCL_VERSION}" https://github.com/NVIDIA/nccl.git /tmp/nccl \
    && make -C /tmp/nccl -j"$(nproc)" src.build BUILDDIR=/opt/nccl/build CUDA_HOME=/usr/local/cuda \
        NVCC_GENCODE="${gencode}" \
    && test -f /opt/nccl/build/include/nccl_device.h \
    && rm -rf /tmp/nccl /opt/nccl/build/obj \
    && git clone --depth 1 --branch "${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests.git /tmp/nccl-tests \
    && make -C /tmp/nccl-tests -j"$(nproc)" MPI=1 MPI_HOME=/opt/amazon/openmpi CUDA_HOME=/usr/local/cuda \
        NCCL_HOME=/opt/nccl/build NVCC_GENCODE="${gencode}" \
    && mkdir -p /opt/nccl-tests && mv /tmp/nccl-tests/build /opt/nccl-tests/build \
    && rm -rf /tmp/nccl-tests \
    && printf '%s\n' /opt/amazon/ofi-nccl/lib /opt/amazon/efa/lib /opt/amazon/openmpi/lib /opt/nccl/build/lib \
        /opt/gdrcopy/lib >/etc/ld.so.conf.d/00-megatron-image.conf \
    && ldconfig

# The libraries above are registered with the loader (ld.so.conf.d) and on LD_LIBRARY_PATH, so NCCL finds the
# aws-ofi-nccl plugin even when a job's environment replaces LD_LIBRARY_PATH. torch's wheel loads its own NCCL (2.28)
# through an RPATH, which outranks both; preloading the NCCL built above makes torch, DeepEP and the net plugin share
# one NCCL with the Device API.
ENV PATH=/opt/venv/bin:/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:/opt/gdrcopy/bin:/opt/nccl-tests/build:${PATH} \
    LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:/opt/nccl/build/lib:/opt/gdrcopy/lib:${LD_LIBRARY_PATH} \
    LD_PRELOAD=/opt/nccl/build/lib/libnccl.so.2 \
    VIRTUAL_ENV=/opt/venv \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The pinned Python stack ([python] of versions.txt), installed by the same script as the test environment.
# transformer-engine-torch is built from its sdist against this torch and CUDA.
COPY versions.txt /opt/toolkit/versions.txt
COPY tools/install_python_stack.sh /opt/toolkit/tools/install_python_stack.sh
RUN "python${PYTHON_VERSION}" -m venv /opt/venv \
    && NVTE_CUDA_ARCHS=$(echo "${CUDA_ARCHS}" | tr -d . | tr , ';') && export NVTE_CUDA_ARCHS \
    && PYTHON=/opt/venv/bin/python bash /opt/toolkit/tools/install_python_stack.sh

# DeepEP with its NCCL GIN backend (built with ENABLE_NCCL=1; runtime switch DEEP_EP_BACKEND=nccl), which upstream
# deepseek-ai/DeepEP has merged (README-NCCL.md), so it comes from there rather than from the reference design's fork.
# A short hash can become ambiguous, so DEEPEP_COMMIT is the full hash, and the checkout must be exactly that commit.
# Built for DEEPEP_CUDA_ARCHS only: the H100/H200 this image targets.
ARG DEEPEP_COMMIT
ARG DEEPEP_CUDA_ARCHS
RUN : "${DEEPEP_COMMIT:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && : "${DEEPEP_CUDA_ARCHS:?build arg missing: pass the [image] pins of versions.txt (make build does)}" \
    && git clone --filter=blob:none https://github.com/deepseek-ai/DeepEP.git /tmp/DeepEP \
    && git -C /tmp/DeepEP -c advice.detachedHead=false checkout --detach "${DEEPEP_COMMIT}" \
    && if [ "$(git -C /tmp/DeepEP rev-parse HEAD)" != "${DEEPEP_COMMIT}" ]; then \
        echo "DEEPEP_COMMIT=${DEEPEP_COMMIT} is not a full commit hash of deepseek-ai/DeepEP" >&2; exit 1; \
    fi \
    && ENABLE_NCCL=1 NCCL_DIR=/opt/nccl/build TORCH_CUDA_ARCH_LIST=$(echo "${DEEPEP_CUDA_ARCHS}" | tr , ';') \
        python -m pip install --no-cache-dir --no-deps --no-build-isolation /tmp/DeepEP \
    && rm -rf /tmp/DeepEP

# Import the stack and print its versions. There is no GPU during the build, so the driver stub stands in for
# libcuda.so.1; torch must report the NCCL built above, which proves the preload works.
RUN mkdir /tmp/cuda-stub && ln -s /usr/local/cuda/lib64/stubs/libcuda.so /tmp/cuda-stub/libcuda.so.1 \
    && LD_LIBRARY_PATH="/tmp/cuda-stub:${LD_LIBRARY_PATH}" python -c "\
import sys, importlib.metadata as md; \
import torch, transformer_engine, megatron.core, megatron.bridge, deep_ep, viztracer; \
from megatron.core.datasets import helpers_cpp; \
nccl = '.'.join(map(str, torch.cuda.nccl.version())); \
want = sys.argv[1].lstrip('v').rsplit('-', 1)[0]; \
assert nccl == want, f'torch loads NCCL {nccl}, not the {want} built into /opt/nccl'; \
[print(f'{d}=={md.version(d)}') for d in ('torch', 'transformer_engine', 'megatron-core', 'megatron-bridge', 'deep_ep', 'viztracer')]; \
print(f'nccl=={nccl}')" "${NCCL_VERSION}" \
    && rm -rf /tmp/cuda-stub

# Our code last: editing it rebuilds only this layer. srun.sh also mounts the checkout over it at run time.
WORKDIR /workspace/megatron
COPY . /workspace/megatron
