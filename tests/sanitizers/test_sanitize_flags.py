# SPDX-License-Identifier: Apache-2.0
"""scripts/sanitize.sh and tests/support/cpp.py compile src_cpp under a sanitizer with the same flags into the same
directory, so that each reuses the other's objects (scripts/object_stamps.py judges an object by its compile command).
A difference fails nothing else, it only compiles src_cpp twice more per test run: this test makes it fail. Both read
the flags from scripts/sanitize_flags.py; sanitize.sh --flags prints the directory and flags it compiles with."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support import cpp

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sanitize.sh"


@pytest.mark.parametrize("mode", ["asan", "tsan", "asan-python"])
def test_sanitize_sh_compiles_with_the_flags_of_the_test_programs(mode):
    """asan-python's objects, bindings.cc and its digest unit aside, are asan's: the same directory, the same flags."""
    proc = subprocess.run(["bash", str(SCRIPT), mode, "--flags"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    base = mode.removesuffix("-python")
    assert proc.stdout.splitlines() == [cpp.sanitize_object_dir(base), *cpp.sanitize_flags(base)]
