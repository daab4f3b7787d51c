# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_restore.py up to its fio step, with dd and fio on PATH replaced (no disk written, no server
started): the lmcache_adp it measures and its children import (this tree's, when built in place, even where an
editable install points at another tree)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_restore.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("lmcache")
import tools  # noqa: E402

# fio: records its PID and the lmcache_adp a Python child under its environment (the one every MP server and
# gateway of the run inherits) imports, then fails, or (FIO_MODE=wait) waits to be stopped.
FAKE_FIO = f"""#!/bin/sh
echo $$ >> "$FAKE_PIDS"
{sys.executable} -c 'import lmcache_adp; print(lmcache_adp.__file__)' > "$FIO_SAW" 2>&1
[ "$FIO_MODE" = wait ] && exec sleep 30
exit 1
"""


def start(tmp_path: Path, *args: str, fio_mode: str = "fail") -> subprocess.Popen:
    """The bench run from tmp_path without PYTHONPATH, its --workdir tmp_path/work, dd and fio faked."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "fio").write_text(FAKE_FIO)
    (bin_dir / "dd").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("fio", "dd"):
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FIO_MODE=fio_mode)
    env.update(FAKE_PIDS=str(tmp_path / "fio.pids"), FIO_SAW=str(tmp_path / "fio.saw"))
    cmd = [sys.executable, str(BENCH), "--workdir", str(tmp_path / "work"), "--tiers", "mock", *args]
    return subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@contextlib.contextmanager
def stopped_after(proc: subprocess.Popen, tmp_path: Path):
    """Kills the bench and the fake fio's it started (by their PIDs) if the test left them running."""
    try:
        yield
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pids = tmp_path / "fio.pids"
        for pid in map(int, pids.read_text().split()) if pids.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(tools.native_module(ROOT / "lmcache_adp") is None, reason="this tree is not built in place")
def test_it_measures_this_tree_and_so_do_its_children_(tmp_path):
    """Run without PYTHONPATH=. from elsewhere, it imported the editable install's lmcache_adp (another
    worktree's) and so did its MP servers; now this tree's, named in its output, and the environment its
    children inherit imports it too."""
    proc = start(tmp_path)
    with stopped_after(proc, tmp_path):
        out, _ = proc.communicate(timeout=120)
    assert f"lmcache_adp measured: {ROOT / 'lmcache_adp'}\n" in out, out
    assert (tmp_path / "fio.saw").read_text().strip() == str(ROOT / "lmcache_adp" / "__init__.py")
