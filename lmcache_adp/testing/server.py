# SPDX-License-Identifier: Apache-2.0
"""An LMCache MP server with this plugin as its L2 tier: started as a child
process (MPServer), or one already running reached by its ports (RunningServer).

Only LMCache's command line and its HTTP API (/healthcheck, /status,
/cache/clear, /metrics) are used; the server's log is kept in a file and shown
when the server fails, never parsed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import site
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lmcache_adp.log import showing_info

# Counters of the server's /metrics (lmcache 0.5.x, mp_observability): chunks
# LMCache wrote to L2 successfully, and chunks its prefetch loaded from L2.
L2_STORED_CHUNKS = "lmcache_mp_l2_store_completed_objects_chunks_total"
L2_STORE_TASKS_SUBMITTED = "lmcache_mp_l2_store_submitted_requests_total"
L2_STORE_TASKS_DONE = "lmcache_mp_l2_store_completed_requests_total"  # succeeded or failed
L2_SUBMITTED_CHUNKS = "lmcache_mp_l2_store_submitted_objects_chunks_total"
L2_LOADED_CHUNKS = "lmcache_mp_l2_prefetch_load_completed_chunks_total"


class ServerError(RuntimeError):
    """The server did not start, or did not do what it was asked (the message says what and shows its log)."""


def adp_adapter(**adapter_params: Any) -> dict[str, Any]:
    """The `--l2-adapter` spec that loads this plugin with these adapter_params."""
    return {
        "type": "native_plugin",
        "module_path": "lmcache_adp",
        "class_name": "ADPConnector",
        "adapter_params": adapter_params,
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lmcache_executable() -> list[str]:
    """`lmcache` next to this interpreter (a venv's); else LMCache's command run by this interpreter,
    which imports this lmcache_adp (a venv made with --system-site-packages on a host whose LMCache is
    installed outside it has no `lmcache` of its own: the one on PATH runs the host's interpreter, which
    cannot import the plugin installed in the venv, audit 13); else the `lmcache` on PATH."""
    here = Path(sys.executable).with_name("lmcache")
    if here.exists():
        return [str(here)]
    for ep in importlib.metadata.entry_points(group="console_scripts", name="lmcache"):
        run = f"import importlib, sys; sys.argv[0] = 'lmcache'; sys.exit(importlib.import_module({ep.module!r}).{ep.attr}())"
        return [sys.executable, "-c", run]
    return ["lmcache"]


def child_env() -> dict[str, str]:
    """Environment for a child process that loads the plugin: it imports this very
    lmcache_adp (a source tree, not another install on the machine), runs the
    `lmcache` beside this interpreter and logs at INFO at least (lmcache_adp.log.showing_info)."""
    env = dict(os.environ)
    import lmcache_adp

    root = str(Path(lmcache_adp.__file__).resolve().parent.parent)
    if root not in {str(Path(p).resolve()) for p in site.getsitepackages()}:
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), *filter(None, [env.get("PATH")])])
    return showing_info(env)  # the tests read their children's INFO lines: the gateway's ready line first


def read_metrics(http_url: str, *names: str) -> dict[str, float]:
    """Counters of a Prometheus /metrics page at http_url, each summed over its label sets (0 if absent)."""
    with urllib.request.urlopen(http_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


class RunningServer:
    """An LMCache MP server reached by its ports (ZMQ `port`, HTTP `http_port`):
    one this process started (MPServer) or one already running, for a smoke test
    of a deployment."""

    def __init__(self, port: int, http_port: int, host: str = "127.0.0.1"):
        self.host, self.port, self.http_port = host, port, http_port

    @property
    def url(self) -> str:
        """What VLLMClient (vLLM's `lmcache.mp.host`:`lmcache.mp.port`) connects to."""
        return f"tcp://{self.host}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    def _http(self, method: str, path: str, body: dict | None = None, timeout: float = 30) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.http_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"{}")

    def healthy(self) -> bool:
        """GET /healthcheck says healthy (False while it does not answer)."""
        try:
            return self._http("GET", "/healthcheck", timeout=2).get("status") == "healthy"
        except (OSError, ValueError):
            return False

    def status(self) -> dict:
        return self._http("GET", "/status")

    def clear_l1(self) -> dict:
        """POST /cache/clear: drop every unlocked object from LMCache's CPU tier (L1)."""
        return self._http("POST", "/cache/clear", {"tier": "l1", "force": False})

    def l1_object_count(self) -> int:
        return int(self.status()["storage_manager"]["l1_manager"]["total_object_count"])

    def metrics(self, *names: str) -> dict[str, float]:
        """Counters of the server's /metrics, each summed over its label sets (0 if absent)."""
        return read_metrics(self.http_url, *names)

    def metric(self, name: str) -> float:
        return self.metrics(name)[name]

    def log_tail(self, lines: int = 40) -> str:
        """The end of the server's log, for error messages (a server started elsewhere: where to look)."""
        return "(the server was not started here: see its own log)"

    def wait_l2_stores(self, submitted_chunks_at_least: float, timeout: float = 120.0) -> float:
        """Waits until LMCache has submitted that many chunks to L2 in all and
        every store task it submitted has completed; returns the count of chunks
        it stored successfully."""
        deadline = time.monotonic() + timeout
        names = (L2_SUBMITTED_CHUNKS, L2_STORE_TASKS_SUBMITTED, L2_STORE_TASKS_DONE, L2_STORED_CHUNKS)
        while True:
            m = self.metrics(*names)
            if (
                m[L2_SUBMITTED_CHUNKS] >= submitted_chunks_at_least
                and m[L2_STORE_TASKS_DONE] >= m[L2_STORE_TASKS_SUBMITTED]
            ):
                return m[L2_STORED_CHUNKS]
            if time.monotonic() > deadline:
                raise ServerError(f"L2 stores not done after {timeout:.0f} s: {m}\n{self.log_tail()}")
            time.sleep(0.02)


class MPServer(RunningServer):
    """`lmcache server` as a child process on free ports, with these L2 adapters;
    stopped by its PID (SIGTERM, then SIGKILL). Its log goes to
    workdir/<name>.log (a server restarted on the same workdir appends).

    `args` is the command line it runs and `env` what it adds to the
    environment: a caller may swap in a launch script that honours the ports.
    Use it as a context manager, or call start() and stop()."""

    def __init__(
        self,
        l2_adapters: Iterable[dict[str, Any]],
        workdir: str | os.PathLike,
        *,
        l1_size_gb: float = 1,
        chunk_size: int = 256,
        extra_args: Iterable[str] = (),
        name: str = "server",
    ):
        super().__init__(free_port(), free_port())
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.chunk_size = chunk_size
        self.log_path = self.workdir / f"{name}.log"
        self.args = [
            *lmcache_executable(), "server",
            "--host", self.host, "--port", str(self.port),
            "--http-host", self.host, "--http-port", str(self.http_port),
            "--l1-size-gb", str(l1_size_gb), "--eviction-policy", "LRU",
            "--chunk-size", str(chunk_size),
            *extra_args,
        ]  # fmt: skip
        for spec in l2_adapters:
            self.args += ["--l2-adapter", json.dumps(spec)]
        self.env: dict[str, str] = {}
        self.proc: subprocess.Popen | None = None
        self._log_offset = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self, timeout: float = 120.0) -> MPServer:
        """Starts the server and waits until /healthcheck answers; raises ServerError with its log if it does not."""
        env = {**child_env(), **self.env}
        env.setdefault("LMCACHE_DISABLE_BANNER", "1")
        env.setdefault("LMCACHE_TRACK_USAGE", "false")  # no telemetry
        env.setdefault("PYTHONWARNINGS", "ignore")
        # Its log is a file: INFO (the adapters it loaded, each prefetch's L1/L2 report)
        # even where the caller quiets its own LMCache client with WARNING.
        if env.get("LMCACHE_LOG_LEVEL", "INFO").upper() not in ("INFO", "DEBUG"):
            env["LMCACHE_LOG_LEVEL"] = "INFO"
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=self.workdir
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"lmcache server exited with {self.proc.returncode}:\n{self.log_tail()}")
            if self.healthy():
                return self
            time.sleep(0.3)
        self.stop()
        raise ServerError(f"lmcache server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> int | None:
        """Stops the server (SIGTERM, SIGKILL after timeout); returns its exit code (None if never started)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def __enter__(self) -> MPServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log(self) -> str:
        """This run's log (from the latest start())."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        text = [line for line in self.log().splitlines() if '"GET /' not in line]  # not the health polling
        return f"(log: {self.log_path})\n" + "\n".join(line[:600] for line in text[-lines:])
