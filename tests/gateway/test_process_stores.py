# SPDX-License-Identifier: Apache-2.0
"""Stores straight from the client's process memory (protocol r5, docs/protocol.md
"Process memory"): a connector whose store buffers are anonymous memory
(LMCache's default L1) has the gateway read them with process_vm_readv into the
card (its mapping on a tmpfs card, staging otherwise), one copy, no ring. The
unhappy paths: an address the client does not have, a deadline that passes
while the gateway is slow, a client that scribbles on its buffer meanwhile."""

from __future__ import annotations

import ctypes
import mmap
import shutil
import tempfile
import threading
import time

import numpy as np
import pytest

from lmcache_adp import ADPConnector
from lmcache_adp._native import FEATURE_PROCESS_LOADS, FEATURE_PROCESS_STORES, FEATURE_RING
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway import wire
from tests.gateway.test_process_memory import ProcessClient
from tests.helpers import RawConnector, payload
from tests.support.gateway import Gateway

MIB = 1 << 20
SIZE = 3 * MIB + 100  # several 1 MiB pieces and a partial one


def new_gateway(memory: bool, delay_ms: int = 0, monkeypatch=None) -> tuple[str, Gateway]:
    """A gateway on a tmpfs card (read straight into its mapping) or on /tmp
    (read into staging, then written); with a delay, it sleeps that long before
    each object it reads from a client (outside the lease)."""
    d = tempfile.mkdtemp(prefix="adpps-", dir="/dev/shm" if memory else "/tmp")
    if delay_ms:
        monkeypatch.setenv("ADP_TEST_SEGMENT_WRITE_DELAY_MS", str(delay_ms))
    gw = Gateway(d).start()
    if delay_ms:
        monkeypatch.delenv("ADP_TEST_SEGMENT_WRITE_DELAY_MS")
    return d, gw


@pytest.fixture(params=["tmpfs", "disk"])
def card_gateway(request):
    d, gw = new_gateway(request.param == "tmpfs")
    yield gw
    if gw.proc:
        gw.kill()
    shutil.rmtree(d, ignore_errors=True)


def stats(gw: Gateway) -> dict:
    return read_gateway_stats(gw.unix_url)


def load(gw: Gateway, keys: list[str], size: int = SIZE) -> tuple[list[bool], list[bytes]]:
    """Loads keys through the ring (process memory off): which hit, and their bytes."""
    r = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=20000, process_memory=False))
    outs = [bytearray(size) for _ in keys]
    _, _, per_key = r.get(keys, [memoryview(o) for o in outs])
    r.conn.close()
    return per_key, [bytes(o) for o in outs]


class StoreClient(ProcessClient):
    """A hand-driven connection that asks for process-memory stores too."""

    def __init__(self, gw: Gateway):
        super().__init__(gw, features=FEATURE_RING | FEATURE_PROCESS_LOADS | FEATURE_PROCESS_STORES)

    def put(self, keys: list[bytes], sizes: list[int], addrs: list[int]) -> list[tuple[int, bytes]]:
        """A put of process items under an open lease; the (status, message) of each."""
        return self.batch(wire.PUT, keys, sizes, addrs)


def test_stores_come_from_process_memory_and_the_ring_carries_none(card_gateway):
    gw = card_gateway
    keys = [f"ps@{i}" for i in range(8)]
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=20000))
    try:
        bufs = [bytearray(payload(k, SIZE)) for k in keys]  # anonymous memory, as LMCache's default L1
        ok, _, per_key = c.set(keys, [memoryview(b) for b in bufs])
        assert ok and all(per_key)
        st = stats(gw)
        # Every object was read from this process by the gateway: none through a ring or a segment.
        assert st["process_stores"] == len(keys), st
        assert st["segment_stores"] == 0 and st["checksum_failures"] == 0, st
        assert c.conn.stats()["process_stores"] == len(keys)
        assert load(gw, keys) == ([True] * len(keys), [payload(k, SIZE) for k in keys])
    finally:
        c.conn.close()

    # By hand: the ring holds other bytes; the object is the process buffer's.
    h = StoreClient(gw)
    try:
        assert h.register() == (FEATURE_PROCESS_LOADS | FEATURE_PROCESS_STORES, "")
        h.map[4096 : 4096 + SIZE] = b"\xaa" * SIZE
        buf = ctypes.create_string_buffer(payload("ps@hand", SIZE), SIZE)
        assert h.put([b"ps@hand"], [SIZE], [ctypes.addressof(buf)]) == [(0, b"")]
    finally:
        h.close()
    assert load(gw, ["ps@hand"]) == ([True], [payload("ps@hand", SIZE)])


def test_unmapped_source_fails_that_item_and_others_go_on(card_gateway):
    gw = card_gateway
    c = StoreClient(gw)
    other = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
    try:
        assert c.register()[0] & FEATURE_PROCESS_STORES
        good = ctypes.create_string_buffer(payload("src@good", SIZE), SIZE)
        # Above user space on x86-64: never mapped.
        res = c.put([b"src@bad", b"src@good"], [SIZE, SIZE], [1 << 47, ctypes.addressof(good)])
        assert res[0][0] != 0 and b"cannot read" in res[0][1], res
        assert res[1] == (0, b""), res
        # Readable for its first MiB only: the item fails part way.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        half = libc.mmap(
            None, SIZE + 4096, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0
        )
        assert half not in (None, ctypes.c_void_p(-1).value)
        ctypes.memmove(half, payload("src@half", SIZE), SIZE)
        assert libc.mprotect(half + MIB, SIZE + 4096 - MIB, 0) == 0  # PROT_NONE
        res = c.put([b"src@half"], [SIZE], [half])
        assert res[0][0] != 0 and b"cannot read" in res[0][1], res
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap(half, SIZE + 4096)
        # The connection goes on.
        again = ctypes.create_string_buffer(payload("src@again", SIZE), SIZE)
        assert c.put([b"src@again"], [SIZE], [ctypes.addressof(again)]) == [(0, b"")]
        # Another client meanwhile: unaffected.
        assert other.set(["src@other"], [memoryview(bytearray(payload("src@other", SIZE)))])[0]
        hits, data = load(gw, ["src@bad", "src@good", "src@half", "src@again", "src@other"])
        assert hits == [False, True, False, True, True]
        assert data[1] == payload("src@good", SIZE) and data[3] == payload("src@again", SIZE)
        assert data[4] == payload("src@other", SIZE)
        st = stats(gw)
        # A client's bad address is no fault of the card's.
        assert st["io_errors"] == 0 and st["healthy"] and st["checksum_failures"] == 0, st
        assert st["process_stores"] == 3, st
    finally:
        c.close()
        other.conn.close()
    assert gw.proc.poll() is None


def test_deadline_passes_while_the_gateway_is_slow(monkeypatch):
    """The gateway sleeps before each object it reads from a client
    (ADP_TEST_SEGMENT_WRITE_DELAY_MS): the store's deadline passes with objects
    still to read. Nothing is indexed, and once the future has failed the
    gateway reads nothing more of the client's memory: the connector revoked
    the lease, and the gateway reads nothing under a revoked lease."""
    d, gw = new_gateway(True, delay_ms=300, monkeypatch=monkeypatch)
    keys = [f"late@{i}" for i in range(6)]
    try:
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=700))
        bufs = [bytearray(payload(k, SIZE)) for k in keys]
        ok, _, per_key = c.set(keys, [memoryview(b) for b in bufs])
        assert not ok and per_key == [False] * len(keys)
        read_at_completion = stats(gw)["process_read_bytes"]
        assert read_at_completion >= SIZE, "the first object is read before the deadline"
        for b in bufs:
            b[:] = b"\xee" * SIZE  # reused at once, as LMCache may
        time.sleep(300 * len(keys) / 1000 + 0.5)  # the gateway would have read them all by now
        st = stats(gw)
        assert st["process_read_bytes"] == read_at_completion, "the gateway read the buffers after the future failed"
        assert st["process_stores"] == 0 and st["objects"] == 0, st
        assert load(gw, keys)[0] == [False] * len(keys)
        c.conn.close()
    finally:
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_scribbled_buffer_stores_old_or_new_bytes_never_a_damaged_object(card_gateway):
    """The client rewrites its buffer while the gateway reads it (another thread, flipping it
    between two versions without pause): each object then holds, byte by byte, the old or the new
    bytes, and it loads as a hit: the CRC is of the bytes on the card, not of a second look at the
    client's buffer."""
    gw = card_gateway
    rounds = 24
    keys = [f"scr@{i}" for i in range(rounds)]
    old = np.frombuffer(payload("scr-old", SIZE), np.uint8)
    new = np.frombuffer(payload("scr-new", SIZE), np.uint8)
    buf = old.copy()  # anonymous memory
    stop = threading.Event()

    def scribble():
        while not stop.is_set():
            np.copyto(buf, new)
            np.copyto(buf, old)

    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
    t = threading.Thread(target=scribble)
    t.start()
    try:
        for k in keys:  # one object a store: the scribbler is on it all along
            ok, _, per_key = c.set([k], [memoryview(buf)])
            assert ok and all(per_key)
    finally:
        stop.set()
        t.join()
        c.conn.close()
    hits, data = load(gw, keys)
    st = stats(gw)
    assert hits == [True] * rounds, st
    assert st["checksum_failures"] == 0 and st["process_stores"] == rounds, st
    for k, got in zip(keys, data, strict=True):
        g = np.frombuffer(got, np.uint8)
        assert np.all((g == old) | (g == new)), f"{k} holds bytes the client never wrote"
