#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Style gate, run by the test command: ruff (format + lint) for Python,
# clang-format for C++, and an SPDX line in every source file. Fix with
#   ruff format . && ruff check --fix . && git ls-files '*.cc' '*.h' | xargs clang-format -i
# (both pinned in setup.py's test extras: pip install -e '.[test]')
set -euo pipefail
cd "$(dirname "$0")/.."
# The tools come with the test extras ('.[test]'); take them from this Python's
# scripts folder, which need not be on PATH (a venv not activated, pyenv shims).
PY=${PYTHON:-python}
bin=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
ruff() { "$bin/ruff" "$@"; }
clang-format() { "$bin/clang-format" "$@"; }

ruff format --check --quiet . || { echo "ruff format: files above need 'ruff format .'" >&2; exit 1; }
ruff check --quiet .
git ls-files -z '*.cc' '*.h' | xargs -0 clang-format --dry-run -Werror

missing=$(git ls-files '*.py' '*.pyi' '*.cc' '*.h' '*.sh' .ci/run | grep -v '^benchmarks/results/' |
  while read -r f; do head -n 3 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0' || echo "$f"; done)
if [ -n "$missing" ]; then
  echo "no SPDX-License-Identifier line in the first 3 lines of:" >&2
  echo "$missing" >&2
  exit 1
fi
echo "style: ruff, clang-format and SPDX lines OK"
