# SPDX-License-Identifier: Apache-2.0
"""Crash consistency of the card store on a fault-injecting device.

Builds tests/cpp/card_crash_test.cc with the store and the test double
src_cpp/testing/fault_device.cc, and runs it: a scripted workload with power
cuts (whole, torn, and keeping a seeded subset of the unsynced writes) and
failed writes at a bounded number of write points spread over it, then the
checks after each reopen, and a lost region header over two cuts (see the .cc
file). Set
ADP_CRASH_ALL=1 to cut at every write point (minutes instead of seconds).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(out: Path) -> Path:
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} not found: the crash test needs a C++20 compiler (set CXX)"
    sources = sorted(str(p) for d in ("store", "util", "testing") for p in (ROOT / "src_cpp" / d).glob("*.cc"))
    sources.append(str(ROOT / "tests" / "cpp" / "card_crash_test.cc"))
    binary = out / "card_crash_test"
    cmd = [
        cxx,
        "-std=c++20",
        "-O1",
        "-g",
        "-D_GLIBCXX_ASSERTIONS",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wno-missing-field-initializers",
        f"-I{ROOT / 'src_cpp'}",
        "-pthread",
        *sources,
        "-o",
        str(binary),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return binary


def test_crash_consistency_on_fault_device(tmp_path):
    binary = build(tmp_path)
    env = dict(os.environ, ADP_LOG_LEVEL="ERROR")
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=1800, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-20000:]
    assert "card_crash_test: PASS" in proc.stdout, output[-5000:]
    assert "unreadable block: card opened" in proc.stdout
