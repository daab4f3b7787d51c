# SPDX-License-Identifier: Apache-2.0
"""Gateway daemons for the tests: `lmcache-adp gateway` in a subprocess on a
short temporary socket path and, when asked, TCP on a free port (port 0)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

READY = re.compile(r"gateway ready \(pid \d+\) on unix://\S+(?: and tcp port (\d+))?")
TOKEN = "test-token-0123456789"


class Gateway:
    """One `lmcache-adp gateway` process; restartable on the same card and socket."""

    def __init__(self, workdir: str, tcp: bool = False, card_size_gb: float = 0.25, extra: tuple[str, ...] = ()):
        self.workdir = workdir
        self.card = os.path.join(workdir, "card.img")
        self.socket = os.path.join(workdir, "gw.sock")
        self.token_file = os.path.join(workdir, "token")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        self.tcp = tcp
        self.card_size_gb = card_size_gb
        self.extra = list(extra)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.logs: list[str] = []

    @property
    def unix_url(self) -> str:
        return "unix://" + self.socket

    @property
    def tcp_url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def args(self, *extra: str) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "lmcache_adp.cli",
            "gateway",
            "--card",
            self.card,
            "--card-size-gb",
            str(self.card_size_gb),
            "--socket",
            self.socket,
        ]
        if self.tcp:
            # The same port again after a restart, so connectors find it.
            args += ["--listen", f"tcp://127.0.0.1:{self.port}", "--token-file", self.token_file]
        return args + self.extra + list(extra)

    def start(self, timeout: float = 30.0) -> Gateway:
        self.log_path = os.path.join(self.workdir, f"gateway{len(self.logs)}.log")
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.args(), stdout=self.log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = READY.search(self.log())
            if m:
                self.port = int(m.group(1) or 0)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise RuntimeError("gateway did not get ready:\n" + self.log())

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def all_logs(self) -> str:
        return "".join(self.logs) + (self.log() if self.proc else "")

    def _finish(self) -> int:
        rc = self.proc.wait(timeout=30)
        self.log_file.close()
        self.logs.append(self.log())
        self.proc = None
        return rc

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self._finish()

    def kill(self) -> None:
        self.proc.kill()
        self._finish()


@pytest.fixture
def workdir():
    # Short: a Unix socket path has at most 107 bytes.
    d = tempfile.mkdtemp(prefix="adpgw-", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def gateway(workdir):
    gw = Gateway(workdir, tcp=True).start()
    yield gw
    if gw.proc:
        gw.kill()
