# SPDX-License-Identifier: Apache-2.0
"""A test program, compile or sanitize.sh run that times out or is interrupted leaves no process of its own behind
(tests/support/process_group.py, through which tests/support/cpp.py and test_sanitizers.py run them): before, only
the process started was killed, and what it had started (a compiler's cc1plus, sanitize.sh's compiles and stress
program, a harness's forked children) ran on beside the next tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support import cpp, process_group

# Forks a child; both sleep, after writing their pids (parent's first) to the file named by the argument.
FORKER = """\
import os, sys, time
child = os.fork()
if child == 0:
    time.sleep(600)
    os._exit(0)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child}\\n")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""


def forker(tmp_path: Path) -> tuple[Path, Path]:
    """The forking program (an executable script), and the file it writes its pids to."""
    program = tmp_path / "forker"
    program.write_text(f"#!{sys.executable}\n{FORKER}")
    program.chmod(0o755)
    return program, tmp_path / "pids"


def written_pids(pid_file: Path, wait: float = 60) -> list[int]:
    deadline = time.monotonic() + wait
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the program wrote no pids"
        time.sleep(0.05)
    return [int(w) for w in pid_file.read_text().split()]


def alive(pid: int) -> bool:
    """pid is a process that runs (a zombie has ended: it only waits to be reaped by its parent, here init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def assert_ended(pids: list[int]) -> None:
    """Each of pids ends within 30 s (SIGKILL is delivered asynchronously); any still alive then is killed here (by
    its own pid: this test started it), so that a failing run leaves nothing behind either."""
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"still running after the call ended: {left} of {pids} (program, its child)"


def test_a_program_past_its_timeout_is_killed_with_its_children(tmp_path):
    """cpp.run (every C++ test program, the crash harnesses) with a short timeout: the program and its forked child
    are both gone once it raises."""
    program, pid_file = forker(tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        cpp.run(program, str(pid_file), timeout=10)
    pids = written_pids(pid_file, wait=0)
    assert len(pids) == 2
    assert_ended(pids)


def test_an_interrupted_call_kills_the_program_and_its_children(tmp_path):
    """An exception raised while the call waits (a KeyboardInterrupt's stand-in: a signal handler's, in this
    thread) kills the group too: with its own session, the terminal's Ctrl-C no longer reaches it."""
    program, pid_file = forker(tmp_path)

    class Interrupted(Exception):
        pass

    def interrupt(signum, frame):
        if pid_file.exists():
            raise Interrupted()
        signal.setitimer(signal.ITIMER_REAL, 0.1)  # not started yet: look again

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Interrupted):
            process_group.run([str(program), str(pid_file)], timeout=300)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert_ended(written_pids(pid_file, wait=0))


def test_kill_all_kills_the_calls_of_other_threads(tmp_path):
    """kill_all() (cpp.py's parallel compiles, when the thread waiting for them is interrupted): the group of a call
    running in another thread is killed, and that call returns its program's SIGKILL."""
    program, pid_file = forker(tmp_path)
    result: list = []
    thread = threading.Thread(target=lambda: result.append(process_group.run([str(program), str(pid_file)], 300)))
    thread.start()
    pids = written_pids(pid_file)
    process_group.kill_all()
    thread.join(60)
    assert_ended(pids)
    thread.join(60)
    assert result and result[0].returncode == -signal.SIGKILL, result
