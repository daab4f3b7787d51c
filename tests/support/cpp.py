# SPDX-License-Identifier: Apache-2.0
"""Builds and runs the C++ test programs of tests/cpp against the sources they test.

A program links the .cc files of the given src_cpp/ directories (and any single
files), prints "<name>: PASS" and exits 0 when every check held.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src_cpp"


SANITIZERS = {
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "tsan": ["-fsanitize=thread"],
}


def build(
    name: str,
    out: Path,
    dirs: tuple[str, ...] = ("store", "util", "testing"),
    extra: tuple[str, ...] = (),
    sanitize: str | None = None,
) -> Path:
    """Compiles tests/cpp/<name>.cc with the sources of `dirs` and `extra` (paths under src_cpp/)
    into out/<name>, warnings as errors, under a sanitizer of SANITIZERS if given; returns the
    binary's path."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} not found: this test needs a C++20 compiler (set CXX)"
    sources = sorted(str(p) for d in dirs for p in (SRC / d).glob("*.cc"))
    sources += [str(SRC / f) for f in extra] + [str(ROOT / "tests" / "cpp" / f"{name}.cc")]
    binary = out / name
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-D_GLIBCXX_ASSERTIONS", "-Wall", "-Wextra", "-Werror"]
    cmd += SANITIZERS[sanitize] if sanitize else []
    cmd += ["-Wno-missing-field-initializers", f"-I{SRC}", "-pthread", *sources, "-o", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return binary


def run(binary: Path, *args: str, timeout: float = 300, shown: int = 5000) -> str:
    """Runs a built test program (store logging at ERROR); asserts it passed (a sanitizer's report
    makes it exit non-zero), showing the last `shown` characters of its output if not; returns its
    output."""
    env = {**os.environ, "ADP_LOG_LEVEL": "ERROR"}
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and f"{binary.name}: PASS" in proc.stdout, output[-shown:]
    return output
