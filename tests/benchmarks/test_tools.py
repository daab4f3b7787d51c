# SPDX-License-Identifier: Apache-2.0
"""benchmarks/tools.py: what a benchmark records about the build it measured, and how it stops when a
process it measures dies."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import tools  # noqa: E402


def test_fail_fast_raises_in_a_blocked_main_thread_when_the_watched_process_dies():
    """A benchmark blocked in a long wait (a client's 600 s timeout) gets ProcessDied with the log tail as
    soon as the watched process exits; here the wait would otherwise last 60 s and end without error."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    threading.Timer(0.5, proc.kill).start()
    try:
        with pytest.raises(tools.ProcessDied, match=r"(?s)server exited with -9 while it was measured:\n.*the log"):
            with tools.fail_fast({"server": (proc, lambda: "the log's last lines")}, poll_s=0.1):
                threading.Event().wait(60)
    finally:
        proc.kill()
        proc.wait()


def test_fail_fast_leaves_a_block_alone_while_the_process_lives():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with tools.fail_fast({"server": (proc, lambda: "")}, poll_s=0.05):
            threading.Event().wait(0.3)
    finally:
        proc.kill()
        proc.wait()


def test_native_build_names_the_module_and_says_when_a_source_is_newer(tmp_path):
    """From a copy of the tree (no git checkout) the record still tells builds apart (digest, build time),
    and a C++ source newer than the module marks the build stale."""
    import lmcache_adp._native as native

    b = tools.native_build()
    assert b["module"] == str(Path(native.__file__).resolve())
    assert len(b["sha256"]) == 16 and b["built"].endswith("+00:00")

    copy = tmp_path / "tree"  # the package as a benchmark run from a copy of the tree imports it
    shutil.copytree(Path(native.__file__).parent, copy / "lmcache_adp", ignore=shutil.ignore_patterns("__pycache__"))
    so = copy / "lmcache_adp" / Path(native.__file__).name
    (copy / "src_cpp").mkdir()
    src = copy / "src_cpp" / "newer.cc"
    src.write_text("// edited after the build\n")
    os.utime(so, (1_000_000_000, 1_000_000_000))
    code = (
        f"import sys; sys.path[:0] = [{str(copy)!r}, {str(ROOT / 'benchmarks')!r}]; import tools; "
        "b = tools.native_build(); print(b['module']); print(b['commit']); print(b['stale']); "
        "print(tools.describe_build(b))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    module, commit, stale, line = out.stdout.splitlines()
    assert module == str(so)
    assert commit == f"none ({copy} is not a git checkout)"
    assert stale == "['src_cpp/newer.cc']"
    assert "STALE" in line and "2001-09-09" in line
