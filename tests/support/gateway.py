# SPDX-License-Identifier: Apache-2.0
"""`lmcache-adp gateway` as a child process, for tests and benchmarks: the one
launcher of the tree (tests/gateway's fixtures, the end-to-end tests, the ops
tests, bench_restore)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmcache_adp.testing import child_env
from tests.support import process_group

# The gateway's one line when it serves (lmcache_adp/gateway.py).
READY = re.compile(r"gateway ready \(pid \d+\) on unix://\S+(?: and tcp port (\d+))?")
TOKEN = "test-token-0123456789"


class Gateway:
    """One `lmcache-adp gateway` process on a card and a Unix socket (and, with
    tcp=True, TCP on 127.0.0.1 with a token file); restartable on the same card,
    socket and port. Each start() logs to workdir/gateway<N>.log.

    card and socket default to workdir/card.img and workdir/gw.sock: keep
    workdir short, a Unix socket path has at most 107 bytes."""

    def __init__(
        self,
        workdir: str | os.PathLike,
        tcp: bool = False,
        card_size_gb: float = 0.25,
        extra: tuple[str, ...] = (),
        *,
        card: str | os.PathLike | None = None,
        socket: str | os.PathLike | None = None,
    ):
        self.workdir = os.path.abspath(workdir)
        os.makedirs(self.workdir, exist_ok=True)
        self.card = os.path.abspath(card or os.path.join(self.workdir, "card.img"))
        self.socket = os.path.abspath(socket or os.path.join(self.workdir, "gw.sock"))
        self.token_file = os.path.join(self.workdir, "token")
        Path(self.token_file).write_text(TOKEN + "\n")
        self.tcp = tcp
        self.card_size_gb = card_size_gb
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.port = 0  # TCP port, once started with tcp=True
        self.logs: list[str] = []  # logs of the runs that ended

    @property
    def unix_url(self) -> str:
        return "unix://" + self.socket

    url = unix_url  # what adapter_params' "gateway" takes

    @property
    def tcp_url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def args(self, *extra: str) -> list[str]:
        args = [
            sys.executable, "-m", "lmcache_adp.cli", "gateway",
            "--card", self.card, "--card-size-gb", str(self.card_size_gb), "--socket", self.socket,
        ]  # fmt: skip
        if self.tcp:
            # The same port again after a restart, so connectors find it.
            args += ["--listen", f"tcp://127.0.0.1:{self.port}", "--token-file", self.token_file]
        return args + self.extra + list(extra)

    def start(self, timeout: float = 60.0, env: dict[str, Any] | None = None) -> Gateway:
        """Starts the daemon and waits for its ready line; raises RuntimeError with its log if it exits or stalls.
        `env`: more environment for this start only (test hooks, ADP_TEST_*: a restart goes without them)."""
        self.log_path = os.path.join(self.workdir, f"gateway{len(self.logs)}.log")
        self.log_file = open(self.log_path, "w")
        # In a process group of its own (tests/support/process_group.py): kill() and a stop that times out end the
        # gateway with every process it started, none left beside the next tests.
        self.proc = process_group.popen(
            self.args(),
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**child_env(), **{k: str(v) for k, v in (env or {}).items()}},
            cwd=self.workdir,  # imports the lmcache_adp child_env() names, not one in the caller's directory
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = READY.search(self.log())
            if m:
                self.port = int(m.group(1) or 0)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"gateway did not get ready in {timeout:.0f} s:\n{self.logs[-1]}")

    def log(self) -> str:
        """This run's log."""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def all_logs(self) -> str:
        return "".join(self.logs) + (self.log() if self.proc else "")

    def _finish(self, timeout: float = 30.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:  # stuck: not left behind (its whole group), and the caller sees -9
            process_group.kill_group(self.proc)
            rc = self.proc.returncode
        self.log_file.close()
        self.logs.append(self.log())
        self.proc = None
        return rc

    def stop(self) -> int:
        """SIGTERM, then waits (SIGKILL after 30 s); returns the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self._finish()

    def kill(self) -> None:
        """SIGKILL to the gateway's process group (the gateway and any process it started), then reaps it."""
        process_group.kill_group(self.proc)
        self._finish()

    def pause(self, timeout: float = 10.0) -> None:
        """SIGSTOP, then waits until every thread of the daemon is stopped. kill() returns
        once the signal is queued: one thread takes it and stops the others as each next
        runs, so under CPU load a connection's thread can still answer a request sent
        right after kill() (test_close_with_gateway_hung_returns_promptly's flake)."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not self._all_threads_stopped():
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway {self.proc.pid} not stopped {timeout:.0f} s after SIGSTOP")
            time.sleep(0.005)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def _all_threads_stopped(self) -> bool:
        task = f"/proc/{self.proc.pid}/task"
        for tid in os.listdir(task):
            try:
                with open(f"{task}/{tid}/stat") as f:
                    stat = f.read()
            except FileNotFoundError:  # the thread ended meanwhile
                continue
            if stat[stat.rindex(")") + 2] != "T":  # the state follows the name, which may hold ") "
                return False
        return True

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None:
            self.stop()


@contextlib.contextmanager
def temp_gateway(memory: bool = True, env: dict[str, Any] | None = None, **kwargs: Any) -> Iterator[Gateway]:
    """A started Gateway (kwargs: Gateway's) on a fresh short directory on tmpfs (memory: /dev/shm, a card
    the gateway reads and writes in place) or on /tmp (a file card: through staging), with `env` (test hooks)
    for its first start only; killed, if still running, and the directory removed however the block ends."""
    d = tempfile.mkdtemp(prefix="adpgw-", dir="/dev/shm" if memory else "/tmp")
    gw = Gateway(d, **kwargs)
    try:
        yield gw.start(env=env)
    finally:
        if gw.proc is not None:
            gw.kill()
        shutil.rmtree(d, ignore_errors=True)
