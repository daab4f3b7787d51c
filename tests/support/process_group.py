# SPDX-License-Identifier: Apache-2.0
"""Subprocesses started in a session (and process group) of their own, the whole group killed when the call times
out or is interrupted.

subprocess.run(timeout=...) kills only the process it started: a compiler driver's cc1plus and as, a script's
compiler or program, a test program's forked children live on after the timeout and share the machine's cores with
the tests that follow (2 on the CI VM), until they end by themselves. Here the process is its group's leader, and
on a timeout, or any exception while waiting for it (KeyboardInterrupt: a Ctrl-C no longer reaches the group, which
is not the terminal's foreground one), SIGKILL goes to the group, which is killed while its leader is not yet
reaped, so its id cannot have been given to another process. A process that moves itself out of the group (setsid,
setpgid) is not followed.

kill_all() kills the groups of every call in progress, for a caller whose threads run them while its own thread is
interrupted (tests/support/cpp.py's parallel compiles).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

_live: dict[int, subprocess.Popen] = {}  # leader pid -> its Popen, while a call waits for it
_lock = threading.Lock()


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to proc's group, unless proc is reaped already (then its id may be another's); then reaps it."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run(args: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs), args started in a session
    of its own: on the timeout (subprocess.TimeoutExpired, with the output so far) or any other exception while it
    waits, every process of that session's group is killed before the exception goes on."""
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kwargs
    )
    with _lock:
        _live[proc.pid] = proc
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            try:  # the rest of the output, now that no process of the group holds the pipes
                out, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # one that left the group holds them: without it
                out, err = "", ""
            raise subprocess.TimeoutExpired(args, timeout, out, err) from None
        except BaseException:
            _kill_group(proc)
            raise
    finally:
        with _lock:
            _live.pop(proc.pid, None)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def popen(args: list[str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen(args, **kwargs) started in a session (and process group) of its own, for a process that
    outlives the call (tests/support/gateway.py's gateways): kill_group() ends it with every process it started."""
    return subprocess.Popen(args, start_new_session=True, **kwargs)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the group of a popen() process (not if it is reaped already: its id may be another's), then
    reaps it."""
    _kill_group(proc)


def kill_all() -> None:
    """Kills the group of every run() in progress (in any thread); each of those calls then returns its process's
    exit (-9)."""
    with _lock:
        procs = list(_live.values())
    for proc in procs:
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
