#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what the tests need and runs the whole suite. This is the README's
# test command and what CI runs (.ci/run). Extra arguments go to pytest (the
# main run only).
#
# Then the LMCache-facing tests (native plugin, MP server end to end, the
# examples and quickstart) run again against LMCache 0.5.4, the release the
# seed's deployment runs, in a venv of its own (build/venv-lmcache-0.5.4,
# kept between runs); they import this tree (pytest's pythonpath) and its
# extension as built above. ADP_SKIP_LMCACHE_054=1 leaves that run out (for a
# quick local run; CI does not set it). A run without pytest arguments builds the
# image in the background meanwhile (ADP_PREBUILD_IMAGE=0 leaves that out).
set -euo pipefail
cd "$(dirname "$0")/.."

# podman, runc, debootstrap: tests/packaging/test_image.py builds and runs the image
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
python -m pip install --quiet torch==2.13.0        # CPU build from local disk; before lmcache
python -m pip install --quiet lmcache==0.5.6
ADP_WERROR=1 python -m pip install --quiet -e '.[test]'   # warnings are errors in CI
PYTHON=python ./scripts/check_style.sh                     # ruff, clang-format, SPDX lines
status=0
# The image (tests/packaging/test_image.py) takes 15-20 minutes to build from nothing,
# most of it waiting on debootstrap, pip and podman's layer writes. A whole-suite run
# starts that build now, at low priority, beside the tests; the test's own build then
# waits on build_image.sh's lock and finds every layer cached. Its log: build/image-prebuild.log
# (a failure there is reported by the test, whose build runs again).
prebuild=
if [ "$#" -eq 0 ] && [ "${ADP_PREBUILD_IMAGE:-1}" = 1 ]; then
  mkdir -p build
  nice -n 15 ./scripts/build_image.sh cpu >build/image-prebuild.log 2>&1 &
  prebuild=$!
fi
# --durations: the slowest tests in every CI log, to see where the 90 minutes go.
python -m pytest -q -p no:cacheprovider --durations=30 tests "$@" || status=$?
if [ -n "$prebuild" ]; then
  wait "$prebuild" || echo "run_tests.sh: the image's early build failed (build/image-prebuild.log)"
fi

if [ "${ADP_SKIP_LMCACHE_054:-0}" != 1 ]; then
  venv=build/venv-lmcache-0.5.4
  [ -x "$venv/bin/python" ] || python -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet torch==2.13.0  # before lmcache, as above
  # 0.5.4's CLI (`lmcache server`, `lmcache bench`) imports openai without depending on it.
  "$venv/bin/python" -m pip install --quiet lmcache==0.5.4 openai
  "$venv/bin/python" -m pip install --quiet pytest numpy prometheus_client tqdm google-crc32c  # setup.py's [test] needs
  echo "run_tests.sh: the LMCache-facing tests against LMCache 0.5.4"
  start=$SECONDS
  "$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=10 tests/lmcache tests/e2e tests/examples || status=$?
  echo "run_tests.sh: LMCache 0.5.4 run took $((SECONDS - start)) s"
else
  echo "run_tests.sh: the LMCache 0.5.4 run was left out (ADP_SKIP_LMCACHE_054=1)"
fi
exit "$status"
