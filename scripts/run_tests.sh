#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what the tests need and runs the whole suite. This is the README's
# test command and what CI runs (.ci/run). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# podman, runc, debootstrap: tests/packaging/test_image.py builds and runs the image
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap >/dev/null
python -m pip install --quiet torch==2.13.0        # CPU build from local disk; before lmcache
python -m pip install --quiet lmcache==0.5.6
ADP_WERROR=1 python -m pip install --quiet -e '.[test]'   # warnings are errors in CI
PYTHON=python ./scripts/check_style.sh                     # ruff, clang-format, SPDX lines
python -m pytest -q -p no:cacheprovider tests "$@"
