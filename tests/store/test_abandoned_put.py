# SPDX-License-Identifier: Apache-2.0
"""An abandoned store does not delete the older copy of its key on restart.

Builds tests/cpp/abandoned_put_test.cc with the store and runs it on a card
image in tmp_path: store k, store k again with the caller gone (still_wanted()
false, as after a deadline), close, reopen twice; k must keep its first copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_abandoned_store_keeps_older_copy_across_restart(tmp_path):
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} not found: this test needs a C++20 compiler (set CXX)"
    sources = sorted(str(p) for d in ("store", "util") for p in (ROOT / "src_cpp" / d).glob("*.cc"))
    sources.append(str(ROOT / "tests" / "cpp" / "abandoned_put_test.cc"))
    binary = tmp_path / "abandoned_put_test"
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers"]
    cmd += [f"-I{ROOT / 'src_cpp'}", "-pthread", *sources, "-o", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    env = dict(os.environ, ADP_LOG_LEVEL="ERROR")
    proc = subprocess.run(
        [str(binary), str(tmp_path / "card.img")], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert "abandoned_put_test: PASS" in proc.stdout
