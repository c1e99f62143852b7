# The image every rank runs in: CUDA + EFA + aws-ofi-nccl (GIN, GDRCopy) + NCCL (the nvidia-nccl-cu13 wheel, with the
# Device API) + DeepEP + the pinned Megatron Bridge stack. Build it with `make build`, which passes every [image] pin
# of versions.txt as a --build-arg; none of the ARGs below has a default. docs/image.md says where each pin was
# checked upstream and why each source build stays.
#
# The `pins` stage looks every pin up upstream first, so a pin that does not exist stops the build in its first
# minutes; the image waits for it. Layers go from what changes least to what changes most, and each ARG is declared
# right before the first step that uses it, so bumping one pin rebuilds from that step on. Our own code is the last
# layer. No ARG shares a name with an ENV of the base image: an inherited ENV would override it in every RUN step.

# The tag names the base image; the digest pins its content, since NVIDIA rebuilds a tag (security updates).
ARG CUDA_VERSION
ARG UBUNTU_VERSION
ARG CUDA_IMAGE_DIGEST

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION}@${CUDA_IMAGE_DIGEST} AS pins
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl git \
    && rm -rf /var/lib/apt/lists/*
COPY tools/image/check_pins.sh /opt/toolkit/tools/image/check_pins.sh
ARG PYTHON_VERSION
ARG CUDA_ARCHS
ARG NSYS_VERSION
ARG NSYS_KEY_FINGERPRINT
ARG GDRCOPY_VERSION
ARG EFA_INSTALLER_VERSION
ARG AWS_OFI_NCCL_VERSION
ARG AWS_OFI_NCCL_SHA512
ARG NCCL_TESTS_VERSION
ARG DEEPEP_COMMIT
ARG DEEPEP_CUDA_ARCHS
RUN devtools="https://developer.download.nvidia.com/devtools/repos/ubuntu$(. /etc/os-release && echo "${VERSION_ID}" | tr -d .)/$(dpkg --print-architecture)" \
    && bash /opt/toolkit/tools/image/check_pins.sh \
        set PYTHON_VERSION "${PYTHON_VERSION}" \
        set CUDA_ARCHS "${CUDA_ARCHS}" \
        set NSYS_KEY_FINGERPRINT "${NSYS_KEY_FINGERPRINT}" \
        set AWS_OFI_NCCL_SHA512 "${AWS_OFI_NCCL_SHA512}" \
        set DEEPEP_CUDA_ARCHS "${DEEPEP_CUDA_ARCHS}" \
        apt NSYS_VERSION "${NSYS_VERSION}" "${devtools}" "nsight-systems-cli-${NSYS_VERSION}" \
        git-tag GDRCOPY_VERSION "${GDRCOPY_VERSION}" https://github.com/NVIDIA/gdrcopy.git \
        url EFA_INSTALLER_VERSION "${EFA_INSTALLER_VERSION}" \
            "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
        url AWS_OFI_NCCL_VERSION "${AWS_OFI_NCCL_VERSION}" \
            "https://github.com/aws/aws-ofi-nccl/releases/download/v${AWS_OFI_NCCL_VERSION}/aws-ofi-nccl-${AWS_OFI_NCCL_VERSION}.tar.gz" \
        git-tag NCCL_TESTS_VERSION "${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests.git \
        git-commit DEEPEP_COMMIT "${DEEPEP_COMMIT}" https://github.com/deepseek-ai/DeepEP.git \
    && touch /pins-checked

FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION}@${CUDA_IMAGE_DIGEST}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
# An empty file: the image waits for the pin check, and its cache does not depend on it.
COPY --from=pins /pins-checked /opt/toolkit/pins-checked

# Build tools and Python (for the venv; nothing else before it runs python3). Package versions come with the Ubuntu
# release the base image tag pins; Ubuntu replaces them with security updates, so pinning each one would break the
# build instead of making it reproducible. cuda-compat is removed, as in the reference design, so the host driver's
# libcuda (mounted by enroot) is the only one the loader can find: the hosts must run a driver for CUDA 13 (R580 or
# newer). The base image's NCCL packages (libnccl2, libnccl-dev) go too: the one NCCL of the image is the wheel of
# [python], and a second libnccl.so.2 on the loader's path would be loaded by whatever does not run torch.
ARG PYTHON_VERSION
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        autoconf automake build-essential ca-certificates check curl git gnupg hwloc iproute2 kmod libhwloc-dev \
        libsubunit-dev libtool ninja-build openssh-client pkg-config \
        "python${PYTHON_VERSION}" "python${PYTHON_VERSION}-dev" "python${PYTHON_VERSION}-venv" \
    && { dpkg-query -W -f='${Package}\n' 'cuda-compat-*' 'libnccl2' 'libnccl-dev' 2>/dev/null || true; } \
        | xargs -r apt-get purge -y --allow-change-held-packages \
    && rm -rf /var/lib/apt/lists/*

# Nsight Systems CLI from NVIDIA's devtools apt repository, trusted through its own keyring (signed-by), not apt-key.
# nvidia.pub may hold several keys; apt trusts only the one pinned by NSYS_KEY_FINGERPRINT, exported alone into the
# repository's keyring, which is then checked to hold exactly that key (gpg exports nothing, and fails, when
# nvidia.pub lacks it: the check says so).
ARG NSYS_VERSION
ARG NSYS_KEY_FINGERPRINT
# hadolint ignore=DL3008
RUN ubuntu="ubuntu$(. /etc/os-release && echo "${VERSION_ID}" | tr -d .)" \
    && repo="https://developer.download.nvidia.com/devtools/repos/${ubuntu}/$(dpkg --print-architecture)" \
    && GNUPGHOME=$(mktemp -d) && export GNUPGHOME \
    && curl -fsSL "${repo}/nvidia.pub" | gpg --dearmor -o "${GNUPGHOME}/nvidia-pub.gpg" \
    && { gpg --batch --no-default-keyring --keyring "${GNUPGHOME}/nvidia-pub.gpg" --export "${NSYS_KEY_FINGERPRINT}" \
        || true; } >/usr/share/keyrings/nvidia-devtools.gpg \
    && keys=$({ gpg --show-keys --with-colons /usr/share/keyrings/nvidia-devtools.gpg 2>/dev/null || true; } \
        | awk -F: '$1 == "pub" { primary = 1 } $1 == "fpr" && primary { print $10; primary = 0 }') \
    && if [ "${keys}" != "${NSYS_KEY_FINGERPRINT}" ]; then \
        echo "${repo}/nvidia.pub does not hold the pinned key ${NSYS_KEY_FINGERPRINT}" >&2; exit 1; \
    fi \
    && rm -rf "${GNUPGHOME}" \
    && echo "deb [signed-by=/usr/share/keyrings/nvidia-devtools.gpg] ${repo} /" \
        >/etc/apt/sources.list.d/nvidia-devtools.list \
    && apt-get update \
    && apt-get install -y --no-install-recommends "nsight-systems-cli-${NSYS_VERSION}" \
    && rm -rf /var/lib/apt/lists/* \
    && if ! command -v nsys >/dev/null; then \
        ln -s "/opt/nvidia/nsight-systems-cli/${NSYS_VERSION}/bin/nsys" /usr/local/bin/nsys; \
    fi \
    && nsys --version

# GDRCopy: user-space library and tools (the gdrdrv kernel module comes from the host). aws-ofi-nccl's GIN needs 2.5+.
ARG GDRCOPY_VERSION
RUN git clone --depth 1 --branch "${GDRCOPY_VERSION}" https://github.com/NVIDIA/gdrcopy.git /tmp/gdrcopy \
    && make -C /tmp/gdrcopy prefix=/opt/gdrcopy CUDA=/usr/local/cuda install \
    && rm -rf /tmp/gdrcopy

# EFA user space: libfabric, rdma-core and Open MPI 4, without kernel module. The tarball is verified against AWS's
# GPG signature; the key must have the fingerprint AWS publishes in the EC2 user guide. The installer's own
# aws-ofi-nccl is removed (whatever package owns /opt/amazon/ofi-nccl): AWS's Debian recipe for it has no GDRCopy,
# without which its GIN refuses to start, and the next step builds the same release with it.
ARG EFA_INSTALLER_VERSION
# hadolint ignore=DL3003
RUN efa_key_fingerprint=4E9091BCBB97A96B26B15E59A05480B1DD2D3CCC \
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
    && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify --mpi=openmpi4 \
    && { dpkg -S /opt/amazon/ofi-nccl 2>/dev/null || true; } | cut -d: -f1 | tr -s ', ' '\n' \
        | xargs -r dpkg --purge \
    && rm -rf /var/lib/apt/lists/* /tmp/efa "${GNUPGHOME}"

# aws-ofi-nccl with GIN (NCCL_GIN_TYPE=2, the host-proxy path) and GDRCopy, from its checksummed release tarball:
# 1.21.x is AWS's first GIN release, tested with NCCL 2.31.2 and the libfabric 2.6.0 of EFA installer 1.50.0. GIN
# needs GDRCopy 2.5+ (gdr_pin_buffer_v2), which configure finds only where it is told to look.
ARG AWS_OFI_NCCL_VERSION
ARG AWS_OFI_NCCL_SHA512
# hadolint ignore=DL3003
RUN name="aws-ofi-nccl-${AWS_OFI_NCCL_VERSION}" \
    && curl -fsSL -o "/tmp/${name}.tar.gz" \
        "https://github.com/aws/aws-ofi-nccl/releases/download/v${AWS_OFI_NCCL_VERSION}/${name}.tar.gz" \
    && echo "${AWS_OFI_NCCL_SHA512}  /tmp/${name}.tar.gz" | sha512sum --check --strict - \
    && tar -xzf "/tmp/${name}.tar.gz" -C /tmp && cd "/tmp/${name}" \
    && ./configure --prefix=/opt/amazon/ofi-nccl --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
        --with-gdrcopy=/opt/gdrcopy --with-nvtx=/usr/local/cuda --enable-platform-aws --disable-tests \
    && for define in HAVE_GDRCOPY HAVE_DECL_GDR_PIN_BUFFER_V2; do \
        grep -qx "#define ${define} 1" include/config.h \
            || { echo "aws-ofi-nccl: configure left ${define} unset (config.log): GIN would refuse to start" >&2; exit 1; }; \
    done \
    && make -j"$(nproc)" && make install \
    && rm -rf "/tmp/${name}" "/tmp/${name}.tar.gz"

# The libraries above are registered with the loader (ld.so.conf.d) and on LD_LIBRARY_PATH, so NCCL finds the
# aws-ofi-nccl plugin and the plugin finds GDRCopy even when a job's environment replaces LD_LIBRARY_PATH.
ENV PATH=/opt/venv/bin:/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:/opt/gdrcopy/bin:/opt/nccl-tests/build:${PATH} \
    LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:/opt/gdrcopy/lib:${LD_LIBRARY_PATH} \
    VIRTUAL_ENV=/opt/venv \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The pinned Python stack ([python] of versions.txt), installed by the same script as the test environment; its NCCL
# is the nvidia-nccl-cu13 wheel with the Device API (nccl_device.h), which torch loads through its RPATH. The wheel's
# folder is registered with the loader, so nccl-tests and anything else that loads libnccl.so.2 by name gets the same
# NCCL. transformer-engine-torch is built from its sdist against this torch and CUDA.
ARG CUDA_ARCHS
COPY versions.txt /opt/toolkit/versions.txt
COPY tools/install_python_stack.sh tools/fix_dataset_helpers.sh /opt/toolkit/tools/
RUN "python${PYTHON_VERSION}" -m venv /opt/venv \
    && NVTE_CUDA_ARCHS=$(echo "${CUDA_ARCHS}" | tr -d . | tr , ';') && export NVTE_CUDA_ARCHS \
    && PYTHON=/opt/venv/bin/python bash /opt/toolkit/tools/install_python_stack.sh \
    && nccl=$(python -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))') \
    && printf '%s\n' /opt/amazon/ofi-nccl/lib /opt/amazon/efa/lib /opt/amazon/openmpi/lib /opt/gdrcopy/lib "${nccl}" \
        >/etc/ld.so.conf.d/00-megatron-image.conf \
    && ldconfig \
    && grep -E '^(torch|nvidia-nccl-cu13)==' /opt/toolkit/versions.txt >/opt/toolkit/pip-constraints.txt

# torch 2.11.0 requires nvidia-nccl-cu13==2.28.9, too old for aws-ofi-nccl's GIN (2.31.2+): a later `pip install`
# here that resolves torch's dependencies would put it back. pip takes these constraints into every install, so it
# refuses such an install instead (--no-deps, as the image installs, still works); the last step asks pip.
ENV PIP_CONSTRAINT=/opt/toolkit/pip-constraints.txt

# nccl-tests against that NCCL (alltoall_perf -D 3/4 exercises the Device API and GIN). The wheel ships libnccl.so.2
# only, so the link names that file. CUDA_ARCHS is a comma list in TORCH_CUDA_ARCH_LIST form.
ARG NCCL_TESTS_VERSION
RUN gencode="" \
    && for sm in $(echo "${CUDA_ARCHS}" | tr -d . | tr , ' '); do \
        gencode="${gencode} -gencode=arch=compute_${sm},code=sm_${sm}"; \
    done \
    && nccl=$(python -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])') \
    && git clone --depth 1 --branch "${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests.git /tmp/nccl-tests \
    && make -C /tmp/nccl-tests -j"$(nproc)" MPI=1 MPI_HOME=/opt/amazon/openmpi CUDA_HOME=/usr/local/cuda \
        NCCL_HOME="${nccl}" LIBRARIES=:libnccl.so.2 NVCC_GENCODE="${gencode}" \
    && mkdir -p /opt/nccl-tests && mv /tmp/nccl-tests/build /opt/nccl-tests/build \
    && rm -rf /tmp/nccl-tests

# DeepEP V1 with its NCCL (GIN) backend, at a full commit fetched by its hash (GitHub serves a pull request's commits
# by hash; a short hash can become ambiguous), built by tools/build_deepep.sh against the NCCL wheel that torch loads
# (NCCL_DIR), for DEEPEP_CUDA_ARCHS only: the H100/H200 this image targets.
ARG DEEPEP_COMMIT
ARG DEEPEP_CUDA_ARCHS
COPY tools/build_deepep.sh /opt/toolkit/tools/build_deepep.sh
RUN git init -q /tmp/DeepEP \
    && git -C /tmp/DeepEP fetch -q --depth 1 https://github.com/deepseek-ai/DeepEP.git "${DEEPEP_COMMIT}" \
    && git -C /tmp/DeepEP -c advice.detachedHead=false checkout -q --detach "${DEEPEP_COMMIT}" \
    && if [ "$(git -C /tmp/DeepEP rev-parse HEAD)" != "${DEEPEP_COMMIT}" ]; then \
        echo "DEEPEP_COMMIT=${DEEPEP_COMMIT} is not a full commit hash of deepseek-ai/DeepEP" >&2; exit 1; \
    fi \
    && git -C /tmp/DeepEP submodule update -q --init --recursive --depth 1 \
    && nccl=$(python -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])') \
    && PYTHON=/opt/venv/bin/python NCCL_DIR="${nccl}" TORCH_CUDA_ARCH_LIST=$(echo "${DEEPEP_CUDA_ARCHS}" | tr , ';') \
        bash /opt/toolkit/tools/build_deepep.sh /tmp/DeepEP \
    && rm -rf /tmp/DeepEP

# What the image claims, proved at build time (tools/image/check_image.py): one NCCL, the pinned wheel, in torch and
# on the loader's path, and kept by pip; the one NET plugin is aws-ofi-nccl with GIN and GDRCopy 2.5+; the stack,
# DeepEP included, imports. There is no GPU during the build, so the driver stub stands in for libcuda.so.1.
COPY tools/image/check_image.py /opt/toolkit/tools/image/check_image.py
RUN mkdir /tmp/cuda-stub && ln -s /usr/local/cuda/lib64/stubs/libcuda.so /tmp/cuda-stub/libcuda.so.1 \
    && LD_LIBRARY_PATH="/tmp/cuda-stub:${LD_LIBRARY_PATH}" python /opt/toolkit/tools/image/check_image.py \
        /opt/toolkit/versions.txt \
    && rm -rf /tmp/cuda-stub

# Our code last: editing it rebuilds only this layer. srun.sh also mounts the checkout over it at run time.
WORKDIR /workspace/megatron
COPY . /workspace/megatron
