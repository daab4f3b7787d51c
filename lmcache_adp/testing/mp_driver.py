# SPDX-License-Identifier: Apache-2.0
"""Drive a real `lmcache server` the way vLLM's LMCacheMPConnector does.

MPServer starts `lmcache server` as a child process on free ports, watches its
HTTP port and log, and stops it by PID. VLLMClient wraps the two client classes
vLLM uses (LMCacheMPSchedulerAdapter for lookups, LMCacheMPWorkerAdapter for
store/retrieve) over CPU KV tensors, so the whole path runs without vLLM or a
GPU. roundtrip() is the scenario shared by the quickstart, the end-to-end tests
and the restore benchmark: store a prompt, drop it from L1, look it up and
retrieve it, and say where it came from.

Only lmcache's public client classes, its CLI and its HTTP API are used; the
one thing read from the log is the prefetch line that says how many chunks
came from L1 and how many from L2, as there is no other per-request report.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import site
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_NAME = "lmcache-adp/e2e-model"

# lmcache 0.5.x, storage_manager.query_prefetch_status:
#   "Prefetch request completed (L1+L2): 4/4 retained keys (0 L1, 4 L2) in 3.1 ms
#    (external_request_id=..., prefetch_request_id=...)"
# Counters of the server's /metrics (lmcache 0.5.x, mp_observability): chunks
# LMCache wrote to L2 successfully, and chunks its prefetch loaded from L2.
L2_STORED_CHUNKS = "lmcache_mp_l2_store_completed_objects_chunks_total"
L2_STORE_TASKS_SUBMITTED = "lmcache_mp_l2_store_submitted_requests_total"
L2_STORE_TASKS_DONE = "lmcache_mp_l2_store_completed_requests_total"  # succeeded or failed
L2_SUBMITTED_CHUNKS = "lmcache_mp_l2_store_submitted_objects_chunks_total"
L2_LOADED_CHUNKS = "lmcache_mp_l2_prefetch_load_completed_chunks_total"

_PREFETCH_LINE = re.compile(
    r"Prefetch request completed \(L1\+L2\): (\d+)/(\d+) retained keys "
    r"\((\d+) L1, (\d+) L2\) in ([0-9.]+) ms \(external_request_id=([^,]+),"
)


def adp_adapter(**adapter_params: Any) -> dict[str, Any]:
    """The --l2-adapter spec that loads this plugin."""
    return {
        "type": "native_plugin",
        "module_path": "lmcache_adp",
        "class_name": "ADPConnector",
        "adapter_params": adapter_params,
    }


def _accepts(fn: Any, name: str) -> bool:
    """Whether fn takes a keyword argument `name` (APIs differ across LMCache releases)."""
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lmcache_executable() -> list[str]:
    """`lmcache` next to this interpreter (a venv's), else on PATH."""
    here = Path(sys.executable).with_name("lmcache")
    return [str(here)] if here.exists() else ["lmcache"]


@dataclass(frozen=True)
class Prefetch:
    """What the server reported for one lookup (in chunks)."""

    hits: int
    requested: int
    from_l1: int
    from_l2: int
    ms: float


class ServerError(RuntimeError):
    pass


def child_env() -> dict[str, str]:
    """Environment of a child that loads the plugin: it must import this very
    lmcache_adp (a source tree under test, not another install on the machine)."""
    env = dict(os.environ)
    import lmcache_adp

    root = str(Path(lmcache_adp.__file__).resolve().parent.parent)
    if root not in {str(Path(p).resolve()) for p in site.getsitepackages()}:
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    # A script's `lmcache` is the one installed beside this interpreter (a venv
    # with another LMCache release must not start the machine's default one).
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), *filter(None, [env.get("PATH")])])
    return env


class _Child:
    """A child process we started and stop by its PID (SIGTERM, then SIGKILL)."""

    proc: subprocess.Popen | None = None

    def _spawn(self, args: list[str], log_path: Path, env: dict[str, str] | None = None, **popen: Any) -> None:
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env or child_env(), **popen
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, timeout: float = 30.0) -> int | None:
        """Stops the process; returns its exit code (None if never started)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def start(self, timeout: float) -> Any:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class MPServer(_Child):
    """One `lmcache server` child process, on free ports, stopped by PID.

    `args` is the command line it runs and `env` what it adds to the
    environment: a test may swap in a launch script that honours the ports."""

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
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.http_port = free_port()
        self.chunk_size = chunk_size
        self.log_path = self.workdir / f"{name}.log"
        self.args = [
            *lmcache_executable(), "server",
            "--host", "127.0.0.1", "--port", str(self.port),
            "--http-host", "127.0.0.1", "--http-port", str(self.http_port),
            "--l1-size-gb", str(l1_size_gb), "--eviction-policy", "LRU",
            "--chunk-size", str(chunk_size),
            *extra_args,
        ]  # fmt: skip
        for spec in l2_adapters:
            self.args += ["--l2-adapter", json.dumps(spec)]
        self.env: dict[str, str] = {}
        self._log_offset = 0

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 120.0) -> MPServer:
        env = {**child_env(), **self.env}
        env.setdefault("LMCACHE_DISABLE_BANNER", "1")
        env.setdefault("LMCACHE_TRACK_USAGE", "false")  # no telemetry from tests
        env.setdefault("PYTHONWARNINGS", "ignore")
        # The prefetch report that says L1 or L2 is an INFO line.
        if env.get("LMCACHE_LOG_LEVEL", "INFO").upper() not in ("INFO", "DEBUG"):
            env["LMCACHE_LOG_LEVEL"] = "INFO"
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._spawn(self.args, self.log_path, env=env, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"lmcache server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self._http("GET", "/healthcheck", timeout=2).get("status") == "healthy":
                    return self
            except (OSError, ValueError):
                pass
            time.sleep(0.3)
        self.stop()
        raise ServerError(f"lmcache server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    # --- observing the server -------------------------------------------------

    def log(self) -> str:
        """This run's log (a server restarted on the same workdir appends)."""
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            return f.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        text = [line for line in self.log().splitlines() if '"GET /' not in line]  # not the polling
        return "\n".join(text[-lines:])

    def _http(self, method: str, path: str, body: dict | None = None, timeout: float = 30) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.http_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read() or b"{}")

    def status(self) -> dict:
        return self._http("GET", "/status")

    def clear_l1(self) -> dict:
        """POST /cache/clear: drop every unlocked object from LMCache's CPU tier."""
        return self._http("POST", "/cache/clear", {"tier": "l1", "force": False})

    def l1_object_count(self) -> int:
        return int(self.status()["storage_manager"]["l1_manager"]["total_object_count"])

    def metrics(self, *names: str) -> dict[str, float]:
        """Counters of the server's /metrics, each summed over its label sets (0 if absent)."""
        with urllib.request.urlopen(self.http_url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        totals = dict.fromkeys(names, 0.0)
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
        return totals

    def metric(self, name: str) -> float:
        return self.metrics(name)[name]

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

    def log_problems(self, lines: int = 10) -> str:
        """The last WARNING/ERROR lines of this run's log."""
        bad = [line for line in self.log().splitlines() if "WARNING" in line or "ERROR" in line or "Traceback" in line]
        return "\n".join(line[:600] for line in bad[-lines:])

    def prefetch(self, request_id: str, timeout: float = 10.0) -> Prefetch | None:
        """The server's own report of where the lookup's chunks came from."""
        deadline = time.monotonic() + timeout
        while True:
            for m in _PREFETCH_LINE.finditer(self.log()):
                if m.group(6) == request_id:
                    hits, req, l1, l2 = (int(m.group(i)) for i in range(1, 5))
                    return Prefetch(hits, req, l1, l2, float(m.group(5)))
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)


# --- the gateway daemon ------------------------------------------------------


class Gateway(_Child):
    """`lmcache-adp gateway` on a card, serving a Unix socket; stopped by PID."""

    def __init__(self, card: str | os.PathLike, socket_path: str | os.PathLike, *, card_size_gb: float = 1,
                 workdir: str | os.PathLike | None = None, extra_args: Iterable[str] = ()):  # fmt: skip
        self.card = str(card)
        self.socket_path = str(socket_path)
        self.workdir = Path(workdir or Path(self.socket_path).parent)
        self.log_path = self.workdir / "gateway.log"
        self.args = [
            sys.executable, "-m", "lmcache_adp.cli", "gateway",
            "--card", self.card, "--card-size-gb", str(card_size_gb), "--socket", self.socket_path,
            *extra_args,
        ]  # fmt: skip

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self, timeout: float = 60.0) -> Gateway:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spawn(self.args, self.log_path)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"gateway exited with {self.proc.returncode}:\n{self.log_path.read_text()[-4000:]}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket_path)
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise ServerError(f"gateway not listening on {self.socket_path} after {timeout:.0f} s")


# --- the vLLM side -----------------------------------------------------------


@dataclass(frozen=True)
class KVShape:
    """Paged KV cache of one worker: per layer a (2, blocks, block_size, heads, head_dim) tensor."""

    num_layers: int = 4
    num_heads: int = 2
    head_dim: int = 64
    block_size: int = 16
    num_blocks: int = 64
    dtype: str = "float16"

    @property
    def itemsize(self) -> int:
        import torch

        return torch.empty(0, dtype=getattr(torch, self.dtype)).element_size()

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_heads * self.head_dim * self.itemsize


def prompt(num_tokens: int, seed: int = 0) -> list[int]:
    """Deterministic token ids, different per seed (so prompts share no prefix)."""
    import random

    rng = random.Random(seed)
    return [rng.randrange(1, 128_000) for _ in range(num_tokens)]


class VLLMClient:
    """One vLLM scheduler + one worker (TP=1) on CPU KV tensors."""

    def __init__(
        self,
        server_url: str,
        shape: KVShape,
        *,
        model_name: str = MODEL_NAME,
        transfer_mode: str = "lmcache_driven",
        timeout: float = 120.0,
    ):
        import torch
        import zmq
        from lmcache.integration.vllm.vllm_multi_process_adapter import (
            LMCacheMPSchedulerAdapter,
            LMCacheMPWorkerAdapter,
            ParallelStrategy,
        )
        from lmcache.v1.multiprocess.group_view import EngineGroupInfo

        self.shape = shape
        self.timeout = timeout
        self.ctx = zmq.Context()
        strategy = ParallelStrategy(
            mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1, pp_size=1, n_servers=1
        )
        extra = {"lmcache.mp.mq_timeout": timeout, "lmcache.mp.mp_transfer_mode": transfer_mode}
        self.scheduler = LMCacheMPSchedulerAdapter(
            [server_url], self.ctx, model_name, shape.block_size, strategy, extra_config=extra
        )
        self.worker = LMCacheMPWorkerAdapter(
            server_url, self.ctx, model_name, shape.block_size, strategy, extra_config=extra
        )
        dtype = getattr(torch, shape.dtype)
        dims = (2, shape.num_blocks, shape.block_size, shape.num_heads, shape.head_dim)
        self.kv = {f"model.layers.{i}.self_attn": torch.zeros(dims, dtype=dtype) for i in range(shape.num_layers)}
        groups = [
            EngineGroupInfo(
                engine_group_id=0, layer_indices=tuple(range(shape.num_layers)), tokens_per_block=shape.block_size
            )
        ]
        # LMCache 0.5.6 takes the KV layout as a hint; 0.5.4 has no such
        # argument and reads these (layer, 2, blocks, block, heads, dim) tensors as NHD.
        hints = (
            {"layout_hints": {"kv_layout": "NHD"}} if _accepts(self.worker.register_kv_caches, "layout_hints") else {}
        )
        self.worker.register_kv_caches(self.kv, engine_group_infos=groups, **hints)
        self.chunk_size = self.scheduler.lmcache_tokens_per_chunk

    # Blocks ---------------------------------------------------------------

    def blocks_for(self, num_tokens: int, first_block: int) -> list[int]:
        n = -(-num_tokens // self.shape.block_size)
        if first_block + n > self.shape.num_blocks:
            raise ValueError(f"{n} blocks from {first_block} exceed the {self.shape.num_blocks}-block cache")
        return list(range(first_block, first_block + n))

    def fill(self, blocks: list[int], seed: int) -> None:
        """Random KV into these blocks of every layer (the "prefill")."""
        import torch

        g = torch.Generator().manual_seed(seed)
        for t in self.kv.values():
            t[:, blocks] = torch.randn(t[:, blocks].shape, generator=g).to(t.dtype)

    def zero(self, blocks: list[int]) -> None:
        for t in self.kv.values():
            t[:, blocks] = 0

    def blocks_bytes(self, blocks: list[int], num_tokens: int) -> bytes:
        """The KV of the first num_tokens tokens held in these blocks, all layers."""
        import torch

        parts = []
        for t in self.kv.values():
            sel = t[:, blocks].reshape(2, -1, self.shape.num_heads, self.shape.head_dim)[:, :num_tokens]
            parts.append(sel.contiguous().view(torch.uint8).numpy().tobytes())
        return b"".join(parts)

    # The connector calls ----------------------------------------------------

    def _op(self, tokens: list[int], blocks: list[int], end: int):
        from lmcache.integration.vllm.vllm_multi_process_adapter import LoadStoreOp

        return LoadStoreOp(token_ids=list(tokens), block_ids=[list(blocks)], start=0, end=end)

    def _event(self) -> Any:
        """The ordering event a store/retrieve waits on, as LMCacheMPConnector makes it."""
        if hasattr(self.worker, "create_recorded_event"):  # LMCache 0.5.6
            return self.worker.create_recorded_event()
        from lmcache import torch_dev  # LMCache 0.5.4: the connector records one itself

        event = torch_dev.Event(interprocess=True)
        event.record()
        return event

    def lookup(self, request_id: str, tokens: list[int]) -> int:
        """Scheduler: LOOKUP (which starts LMCache's prefetch L2 -> L1); returns hit tokens."""
        self.scheduler.maybe_submit_lookup_request(request_id, list(tokens))
        deadline = time.monotonic() + self.timeout
        while True:
            hit = self.scheduler.check_lookup_result(request_id)
            if hit is not None:
                return hit
            if time.monotonic() > deadline:
                raise TimeoutError(f"lookup {request_id} not answered in {self.timeout} s")
            time.sleep(0.001)

    def store(self, request_id: str, tokens: list[int], blocks: list[int]) -> bool:
        """Worker: STORE the full chunks of tokens from blocks; True if LMCache acknowledged it."""
        end = len(tokens) // self.chunk_size * self.chunk_size
        self.worker.submit_store_request(request_id, self._op(tokens, blocks, end), self._event())
        future = self.worker.store_futures[request_id]
        ok = bool(future.result(timeout=self.timeout))
        self._wait_finished(stores={request_id})
        return ok

    def retrieve(self, request_id: str, tokens: list[int], blocks: list[int], num_tokens: int) -> bool:
        """Worker: RETRIEVE num_tokens (what lookup hit) into blocks; True if no block failed."""
        self.worker.submit_retrieve_request(request_id, self._op(tokens, blocks, num_tokens), self._event())
        self._wait_finished(retrieves={request_id})
        failed = self.worker.get_block_ids_with_load_errors()
        return not failed

    def _wait_finished(self, stores: set[str] = frozenset(), retrieves: set[str] = frozenset()) -> None:
        stores, retrieves = set(stores), set(retrieves)
        deadline = time.monotonic() + self.timeout
        while stores or retrieves:
            done_s, done_r = self.worker.get_finished(set(stores))
            stores -= done_s or set()
            retrieves -= done_r or set()
            if time.monotonic() > deadline:
                raise TimeoutError(f"not finished in {self.timeout} s: stores {stores} retrieves {retrieves}")
            time.sleep(0.001)

    def end_request(self, request_id: str) -> None:
        self.scheduler.end_session(request_id)
        self.scheduler.cleanup_lookup_result(request_id)

    def close(self) -> None:
        for close in (self.worker.shutdown, self.scheduler.shutdown):
            try:
                close()
            except Exception as e:  # the server may be gone already
                print(f"[mp_driver] {close.__qualname__}: {e}", file=sys.stderr)
        self.ctx.term()

    def __enter__(self) -> VLLMClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --- the scenario ------------------------------------------------------------


@dataclass
class Restore:
    """One lookup + retrieve of a stored prompt, and where the server says it came from."""

    tokens: int
    hit_tokens: int
    retrieved: bool
    identical: bool
    prefetch: Prefetch | None  # the server's log line for this lookup
    l2_loaded_chunks: float  # the server's counter of chunks loaded from L2, during this lookup
    lookup_s: float
    retrieve_s: float

    @property
    def from_l2(self) -> bool:
        """Every chunk was loaded from L2 and none was in L1: the log line and the counter agree."""
        p = self.prefetch
        return (
            p is not None and p.hits > 0 and p.from_l2 == p.hits and p.from_l1 == 0
            and self.l2_loaded_chunks == p.hits
        )  # fmt: skip

    @property
    def total_s(self) -> float:
        return self.lookup_s + self.retrieve_s

    @property
    def ok(self) -> bool:
        """Every token hit, the retrieve succeeded and the bytes are the stored ones."""
        return self.hit_tokens == self.tokens and self.retrieved and self.identical


@dataclass
class StoredPrompt:
    tokens: list[int]
    src_blocks: list[int]
    expected: bytes = field(repr=False)
    store_s: float = 0.0
    l2_write_s: float = 0.0


def store_prompt(server: MPServer, client: VLLMClient, num_tokens: int, seed: int | None = None) -> StoredPrompt:
    """Prefills random KV for a prompt and stores it as vLLM does after a prefill
    (lookup misses, then STORE); waits until LMCache has written every chunk to L2.
    The prompt is new (random seed unless given), so nothing may hit before."""
    if seed is None:
        seed = uuid.uuid4().int & 0xFFFF_FFFF
    if num_tokens % client.chunk_size:
        raise ValueError(f"num_tokens {num_tokens} must be a multiple of the chunk size {client.chunk_size}")
    chunks = num_tokens // client.chunk_size
    tokens = prompt(num_tokens, seed)
    blocks = client.blocks_for(num_tokens, 0)
    client.fill(blocks, seed)
    rid = f"store-{uuid.uuid4().hex[:8]}"
    if client.lookup(rid, tokens) != 0:
        raise ServerError("a fresh prompt already hits: the cache was not empty")
    before = server.metrics(L2_SUBMITTED_CHUNKS, L2_STORED_CHUNKS)
    t0 = time.perf_counter()
    if not client.store(rid, tokens, blocks):
        raise ServerError(f"LMCache reported the STORE failed:\n{server.log_problems()}")
    t1 = time.perf_counter()
    client.end_request(rid)
    stored = server.wait_l2_stores(before[L2_SUBMITTED_CHUNKS] + chunks) - before[L2_STORED_CHUNKS]
    t2 = time.perf_counter()
    if stored < chunks:
        raise ServerError(
            f"LMCache wrote {stored:.0f} of the prompt's {chunks} chunks to L2; its log says:\n{server.log_problems()}"
        )
    return StoredPrompt(tokens, blocks, client.blocks_bytes(blocks, num_tokens), t1 - t0, t2 - t0)


def restore_prompt(server: MPServer, client: VLLMClient, stored: StoredPrompt) -> Restore:
    """Lookup, then retrieve into other (zeroed) blocks, as vLLM does for a prompt
    it has seen before; compares the bytes with what was stored."""
    n = len(stored.tokens)
    room = client.shape.num_blocks - stored.src_blocks[-1] - 1
    dst = client.blocks_for(n, stored.src_blocks[-1] + 1) if room >= len(stored.src_blocks) else stored.src_blocks
    client.zero(dst)
    rid = f"restore-{uuid.uuid4().hex[:8]}"
    loaded_before = server.metric(L2_LOADED_CHUNKS)
    t0 = time.perf_counter()
    hit = client.lookup(rid, stored.tokens)
    t1 = time.perf_counter()
    retrieved = client.retrieve(rid, stored.tokens, dst, hit) if hit else False
    t2 = time.perf_counter()
    client.end_request(rid)
    identical = hit == n and client.blocks_bytes(dst, n) == stored.expected
    return Restore(
        tokens=n,
        hit_tokens=hit,
        retrieved=retrieved,
        identical=identical,
        prefetch=server.prefetch(rid) if hit else None,
        l2_loaded_chunks=server.metric(L2_LOADED_CHUNKS) - loaded_before,
        lookup_s=t1 - t0,
        retrieve_s=t2 - t1,
    )


def drop_l1(server: MPServer) -> int:
    """POST /cache/clear; returns how many objects L1 still holds (0 unless locked)."""
    server.clear_l1()
    return server.l1_object_count()
