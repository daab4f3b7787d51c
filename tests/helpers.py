# SPDX-License-Identifier: Apache-2.0
"""Drivers for the two faces of the plugin used across tests.

RawConnector: ADPConnector driven as LMCache's native adapter drives it
(submit, poll the eventfd, drain). L2: LMCache's own NativeConnectorL2Adapter,
built by LMCache's native_plugin factory over ADPConnector.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import select
import struct
import time
from typing import Any

import numpy as np

MIB = 1 << 20


def payload(key: str, size: int) -> bytes:
    """Deterministic bytes for a key, so any hit can be checked exactly."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def object_byte(image: bytes, key: str, at: int) -> int:
    """Where in a card image key's object has its byte `at` of the footprint (its header block from 0, its
    payload from 4096), docs/card_format.md: the object starts in the region of its header block; where its
    footprint runs past that region's end it continues after the header block of the region the frontier
    opened next (the one whose header names this region and its epoch as prev_region and prev_epoch), not
    necessarily the adjacent one."""
    region_bytes, num_regions = struct.unpack_from("<QI", image, 24)
    (data_offset,) = struct.unpack_from("<Q", image, 40)
    pos = image.find(key.encode())
    assert pos > 0, f"{key} is not on the card"
    cur = pos - pos % 4096  # the header block
    region = (cur - data_offset) // region_bytes

    def epoch(r: int) -> int:
        return struct.unpack_from("<Q", image, data_offset + r * region_bytes + 16)[0]

    while cur + at >= data_offset + (region + 1) * region_bytes:
        at -= data_offset + (region + 1) * region_bytes - cur
        prev = (region, epoch(region))
        nexts = [
            r
            for r in range(num_regions)
            if image[data_offset + r * region_bytes : data_offset + r * region_bytes + 8] == b"ADPREGN1"
            and struct.unpack_from("<IQ", image, data_offset + r * region_bytes + 28) == prev
        ]
        assert len(nexts) == 1, f"{key}: {len(nexts)} regions continue region {region}"
        region = nexts[0]
        cur = data_offset + region * region_bytes + 4096  # past that region's header block
    return cur + at


def corrupt(card: str, key: str, at: int) -> None:
    """Flips the lowest bit of key's object's byte `at` of its footprint (its header block from 0, its payload
    from 4096) on the card image, across region boundaries (object_byte)."""
    with open(card, "r+b") as f:
        f.seek(object_byte(f.read(), key, at))
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))


def no_foreign_bytes(out, data: bytes, flipped: int = 0) -> bool:
    """Every byte of out is 0 (untouched, from zeros) or the object's own at that place; with flipped=1, one
    byte may instead be the object's with its lowest bit flipped (the object as corrupt() left it)."""
    o, d = np.frombuffer(out, np.uint8), np.frombuffer(data, np.uint8)
    own = (o == 0) | (o == d)
    return bool(np.all(own | (o == d ^ 1))) and int(np.count_nonzero(~own)) <= flipped


def eventually(cond, timeout_s: float = 30.0) -> bool:
    """Whether cond() holds within timeout_s (asked every 50 ms)."""
    end = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < end:
        time.sleep(0.05)
    return cond()


class RawConnector:
    def __init__(self, conn: Any):
        self.conn = conn
        self.done: dict[int, tuple] = {}

    def wait(self, fid: int, timeout: float = 30.0) -> tuple:
        """Waits for future fid; returns (ok, error, per_key)."""
        poller = select.poll()
        poller.register(self.conn.event_fd(), select.POLLIN)
        deadline = time.monotonic() + timeout
        while fid not in self.done:
            if time.monotonic() > deadline:
                raise TimeoutError(f"future {fid} did not complete in {timeout} s")
            if poller.poll(100):
                for c in self.conn.drain_completions():
                    assert c[0] not in self.done, f"future {c[0]} completed twice"
                    self.done[c[0]] = c
        _, ok, err, per_key = self.done[fid]
        return ok, err, per_key

    def set(self, keys, bufs):
        return self.wait(self.conn.submit_batch_set(list(keys), list(bufs)))

    def get(self, keys, bufs):
        return self.wait(self.conn.submit_batch_get(list(keys), list(bufs)))

    def exists(self, keys):
        return self.wait(self.conn.submit_batch_exists(list(keys)))

    def delete(self, keys):
        return self.wait(self.conn.submit_batch_delete(list(keys)))


def hits_hold_their_own(url: str, keys: list[str], size: int, what: str, **params: Any) -> list[bool]:
    """Loads keys through a connector of its own on gateway `url` (a successful future); every hit must hold its
    own payload, not `what` (the bytes it could hold instead). Returns the per-key hits."""
    from lmcache_adp import ADPConnector

    reader = RawConnector(ADPConnector(gateway=url, timeout_ms=10000, **params))
    try:
        outs = [bytearray(size) for _ in keys]
        ok, _, per_key = reader.get(keys, [memoryview(o) for o in outs])
        assert ok
        for k, hit, o in zip(keys, per_key, outs, strict=True):
            if hit:
                assert bytes(o) == payload(k, size), f"{k} served {what}"
        return per_key
    finally:
        reader.conn.close()


def adapter_json(**params: Any) -> str:
    return json.dumps(
        {"type": "native_plugin", "module_path": "lmcache_adp", "class_name": "ADPConnector", "adapter_params": params}
    )


class L2:
    """LMCache's L2 adapter over ADPConnector, with blocking helpers."""

    def __init__(self, **params: Any):
        from lmcache.v1.distributed.l2_adapters import create_l2_adapter
        from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config

        cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[adapter_json(**params)]))
        self.adapter = create_l2_adapter(cfg.adapters[0])

    @staticmethod
    def key(chunk: int, model: str = "meta-llama/Llama-3.1-8B", salt: str = "", rank: int = 0):
        from lmcache.v1.distributed.api import ObjectKey

        return ObjectKey(
            chunk_hash=chunk.to_bytes(8, "little"), model_name=model, kv_rank=rank, object_group_id=0, cache_salt=salt
        )

    @staticmethod
    def objects(datas: list[bytes]):
        """TensorMemoryObjs over fresh tensors holding datas (as LMCache's bench builds them)."""
        import torch
        from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

        objs = []
        for d in datas:
            t = torch.frombuffer(bytearray(d), dtype=torch.uint8) if d else torch.empty(0, dtype=torch.uint8)
            meta = MemoryObjMetadata(
                shape=torch.Size([len(d)]),
                dtype=torch.uint8,
                address=0,
                phy_size=len(d),
                fmt=MemoryFormat.KV_2LTD,
                ref_count=1,
            )
            objs.append(TensorMemoryObj(raw_data=t, metadata=meta, parent_allocator=None))
        return objs

    @staticmethod
    def _wait_fd(fd: int, timeout: float) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll(int(timeout * 1000))

    def _until(self, fd: int, get, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while True:
            r = get()
            if r is not None:
                return r
            if time.monotonic() > deadline:
                raise TimeoutError("L2 task did not complete")
            self._wait_fd(fd, 0.05)

    def store(self, keys, datas) -> bool:
        """Stores and waits; True if LMCache saw the store succeed."""
        objs = self.objects(datas)
        tid = self.adapter.submit_store_task(keys, objs)
        res = self._until(self.adapter.get_store_event_fd(), lambda: self.adapter.pop_completed_store_tasks().get(tid))
        # lmcache 0.5.6: L2StoreResult(int), >= 0 on success; older releases: bool.
        return bool(res) if isinstance(res, bool) else int(res) >= 0

    def lookup(self, keys) -> list[bool]:
        tid = self.adapter.submit_lookup_and_lock_task(keys, {})
        bm = self._until(
            self.adapter.get_lookup_and_lock_event_fd(), lambda: self.adapter.query_lookup_and_lock_result(tid)
        )
        return [bm.test(i) for i in range(len(keys))]

    def load(self, keys, sizes) -> tuple[list[bool], list[bytes]]:
        objs = self.objects([b"\xee" * s for s in sizes])
        tid = self.adapter.submit_load_task(keys, objs)
        bm = self._until(self.adapter.get_load_event_fd(), lambda: self.adapter.query_load_result(tid))
        return [bm.test(i) for i in range(len(keys))], [bytes(o.byte_array) for o in objs]

    def delete(self, keys) -> None:
        self.adapter.delete(keys)

    @property
    def native(self):
        return self.adapter._client

    def close(self) -> None:
        self.adapter.close()
