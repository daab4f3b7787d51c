# SPDX-License-Identifier: Apache-2.0
"""vLLM's side of an LMCache MP server, without vLLM or a GPU.

VLLMClient wraps the two client classes vLLM's LMCacheMPConnector uses
(LMCacheMPSchedulerAdapter for lookups, LMCacheMPWorkerAdapter for store and
retrieve) over CPU KV tensors. store_prompt() and restore_prompt() are what
vLLM does for a prompt after its prefill and when it sees the prompt again;
restore_prompt() reports whether every token came back, with the stored bytes,
and whether the server's own counter says the chunks were loaded from L2.
"""

from __future__ import annotations

import gc
import inspect
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from lmcache_adp.testing.server import (
    L2_LOADED_CHUNKS,
    L2_STORED_CHUNKS,
    L2_SUBMITTED_CHUNKS,
    RunningServer,
    ServerError,
)

MODEL_NAME = "lmcache-adp/e2e-model"


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
    rng = random.Random(seed)
    return [rng.randrange(1, 128_000) for _ in range(num_tokens)]


def _accepts(fn: Any, name: str) -> bool:
    """Whether fn takes a keyword argument `name` (APIs differ across LMCache releases)."""
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class VLLMClient:
    """One vLLM scheduler and one worker (TP=1) of `server_url`, on CPU KV tensors.
    Use it as a context manager, or call close()."""

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
        """END_SESSION, waiting for the server's answer (vLLM's scheduler does not wait).

        LMCache's scheduler adapter sends END_SESSION without waiting, and the server runs it on a
        thread pool. A close() right after the last request sends UNREGISTER_KV_CACHE, which can
        overtake it: the server's end_session handler then looks up the model's layout, which is
        gone, and logs LMCache ERROR "Error in blocking handler" (harmless, but an ERROR line in
        every log check). vLLM's worker lives on after its requests, so it never meets this order;
        a short-lived client must wait.
        """
        sent = _capture_end_session(self.scheduler, lambda: self.scheduler.end_session(request_id))
        self.scheduler.cleanup_lookup_result(request_id)
        for future in sent:
            future.result(timeout=self.timeout)

    def close(self) -> None:
        """Shuts both adapters down and frees the KV cache's /dev/shm segments (LMCache moved the tensors
        there at registration). The adapters sit in reference cycles that hold the tensors, so without a
        collection here the segments stay until Python's cyclic GC happens to run: 1 GiB per client of
        bench_restore's shape, which ran a long benchmark out of memory."""
        if self.worker is None:  # closed already
            return
        for close in (self.worker.shutdown, self.scheduler.shutdown):
            try:
                close()
            except Exception as e:  # the server may be gone already
                print(f"[lmcache_adp.testing] {close.__qualname__}: {e}", file=sys.stderr)
        self.ctx.term()
        self.kv = {}
        self.worker = self.scheduler = None
        gc.collect()

    def __enter__(self) -> VLLMClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _capture_end_session(scheduler: Any, call: Any) -> list[Any]:
    """Runs call() and returns the futures of the END_SESSION requests it sent.

    The RPC objects are wrapped for this one call by instance attributes that shadow their
    methods: LMCache 0.5.6 sends through scheduler.req_clients[url].end_session, 0.5.4 through
    scheduler.mq_clients[url].submit_request.
    """
    sent: list[Any] = []
    if hasattr(scheduler, "req_clients"):  # LMCache 0.5.6
        targets = [(rc, "end_session") for rc in scheduler.req_clients.values()]

        def wrap(send: Any) -> Any:
            def end_session(*args: Any, **kwargs: Any) -> Any:
                sent.append(send(*args, **kwargs))
                return sent[-1]

            return end_session
    elif hasattr(scheduler, "mq_clients"):  # LMCache 0.5.4
        targets = [(mq, "submit_request") for mq in scheduler.mq_clients.values()]

        def wrap(send: Any) -> Any:
            def submit_request(request_type: Any, *args: Any, **kwargs: Any) -> Any:
                future = send(request_type, *args, **kwargs)
                if getattr(request_type, "name", None) == "END_SESSION":  # RequestType.END_SESSION
                    sent.append(future)
                return future

            return submit_request
    else:
        raise RuntimeError("LMCache's scheduler adapter has neither req_clients nor mq_clients: it changed")
    for obj, name in targets:
        setattr(obj, name, wrap(getattr(obj, name)))
    try:
        call()
    finally:
        for obj, name in targets:
            delattr(obj, name)
    if targets and not sent and getattr(scheduler, "is_healthy", True):
        raise RuntimeError("END_SESSION did not go through the scheduler's RPC clients: LMCache's adapter changed")
    return sent


# --- a prompt stored and restored --------------------------------------------


@dataclass
class StoredPrompt:
    """A prompt's tokens, the blocks its KV was written from, and those bytes."""

    tokens: list[int]
    src_blocks: list[int]
    expected: bytes = field(repr=False)
    store_s: float = 0.0  # STORE sent -> acknowledged
    l2_write_s: float = 0.0  # STORE sent -> every chunk written to L2


@dataclass
class Restore:
    """One lookup + retrieve of a stored prompt, and what the server says it loaded from L2."""

    request_id: str  # the lookup's request id (the server's log names it)
    tokens: int
    hit_tokens: int
    hit_chunks: int
    retrieved: bool
    identical: bool
    l2_loaded_chunks: float  # the server's counter of chunks loaded from L2, during this lookup
    lookup_s: float
    retrieve_s: float

    @property
    def from_l2(self) -> bool:
        """Every hit chunk was loaded from L2 (none was still in L1), by the server's own counter."""
        return self.hit_chunks > 0 and self.l2_loaded_chunks == self.hit_chunks

    @property
    def total_s(self) -> float:
        return self.lookup_s + self.retrieve_s

    @property
    def ok(self) -> bool:
        """Every token hit, the retrieve succeeded and the bytes are the stored ones."""
        return self.hit_tokens == self.tokens and self.retrieved and self.identical


def prefilled_prompt(client: VLLMClient, num_tokens: int, seed: int) -> StoredPrompt:
    """The prompt and KV that store_prompt(..., seed=seed) stores, written into the
    client's first blocks but not sent: to restore, from another process or after
    a restart, what an earlier store_prompt stored."""
    if num_tokens % client.chunk_size:
        raise ValueError(f"num_tokens {num_tokens} must be a multiple of the chunk size {client.chunk_size}")
    tokens = prompt(num_tokens, seed)
    blocks = client.blocks_for(num_tokens, 0)
    client.fill(blocks, seed)
    return StoredPrompt(tokens, blocks, client.blocks_bytes(blocks, num_tokens))


def store_prompt(server: RunningServer, client: VLLMClient, num_tokens: int, seed: int | None = None) -> StoredPrompt:
    """Prefills random KV for a prompt and stores it as vLLM does after a prefill
    (lookup misses, then STORE); waits until LMCache has written every chunk to L2
    and raises ServerError if it did not. The prompt is new (a random seed unless
    given), so it must miss before the store."""
    if seed is None:
        seed = uuid.uuid4().int & 0xFFFF_FFFF
    stored = prefilled_prompt(client, num_tokens, seed)
    chunks = num_tokens // client.chunk_size
    rid = f"store-{uuid.uuid4().hex[:8]}"
    if client.lookup(rid, stored.tokens) != 0:
        raise ServerError("a fresh prompt already hits: the cache was not empty")
    before = server.metrics(L2_SUBMITTED_CHUNKS, L2_STORED_CHUNKS)
    t0 = time.perf_counter()
    if not client.store(rid, stored.tokens, stored.src_blocks):
        raise ServerError(f"LMCache reported the STORE failed:\n{server.log_tail()}")
    t1 = time.perf_counter()
    client.end_request(rid)
    written = server.wait_l2_stores(before[L2_SUBMITTED_CHUNKS] + chunks) - before[L2_STORED_CHUNKS]
    t2 = time.perf_counter()
    if written < chunks:
        raise ServerError(f"LMCache wrote {written:.0f} of the prompt's {chunks} chunks to L2:\n{server.log_tail()}")
    stored.store_s, stored.l2_write_s = t1 - t0, t2 - t0
    return stored


def restore_prompt(server: RunningServer, client: VLLMClient, stored: StoredPrompt) -> Restore:
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
    return Restore(
        request_id=rid,
        tokens=n,
        hit_tokens=hit,
        hit_chunks=hit // client.chunk_size,
        retrieved=retrieved,
        identical=hit == n and client.blocks_bytes(dst, n) == stored.expected,
        l2_loaded_chunks=server.metric(L2_LOADED_CHUNKS) - loaded_before,
        lookup_s=t1 - t0,
        retrieve_s=t2 - t1,
    )


def drop_l1(server: RunningServer) -> int:
    """POST /cache/clear; returns how many objects L1 still holds (0 unless locked)."""
    server.clear_l1()
    return server.l1_object_count()
