#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Style gate, run by the test command: ruff (format + lint) for Python,
# clang-format for C++, and an SPDX line in every source file. Fix with
#   ruff format . && ruff check --fix . &&
#   git ls-files --cached --others --exclude-standard '*.cc' '*.h' | xargs clang-format -i
# (both pinned in setup.py's test extras: pip install -e '.[test]'). The
# files checked are the tracked ones and the untracked ones git does not
# ignore, so a new file is checked before it is committed (c2d28d6 landed
# an unformatted one that was untracked when checked).
set -euo pipefail
cd "$(dirname "$0")/.."
# The tools come with the test extras ('.[test]'); take them from this Python's
# scripts folder, which need not be on PATH (a venv not activated, pyenv shims).
PY=${PYTHON:-python}
bin=$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
ruff() { "$bin/ruff" "$@"; }
clang-format() { "$bin/clang-format" "$@"; }

# Tracked and untracked-but-not-ignored files matching the patterns given,
# one a line (a tracked file deleted in the worktree is left out).
sources() {
  git ls-files --cached --others --exclude-standard -- "$@" | while read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done
}

# ruff walks the tree itself and skips what .gitignore ignores (respect-gitignore).
ruff format --check --quiet . || { echo "ruff format: files above need 'ruff format .'" >&2; exit 1; }
ruff check --quiet .
sources '*.cc' '*.h' | tr '\n' '\0' | xargs -0 -r clang-format --dry-run -Werror

missing=$(sources '*.py' '*.pyi' '*.cc' '*.h' '*.sh' .ci/run | grep -v '^benchmarks/results/' |
  while read -r f; do head -n 3 "$f" | grep -q 'SPDX-License-Identifier: Apache-2.0' || echo "$f"; done)
if [ -n "$missing" ]; then
  echo "no SPDX-License-Identifier line in the first 3 lines of:" >&2
  echo "$missing" >&2
  exit 1
fi
echo "style: ruff, clang-format and SPDX lines OK"
