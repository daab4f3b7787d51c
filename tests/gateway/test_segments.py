# SPDX-License-Identifier: Apache-2.0
"""Loads straight into registered shared memory (protocol r3, docs/protocol.md
"Segments"): a connector whose load buffers lie in a /dev/shm file (LMCache's
L1 pool with --shm-name) has the gateway read the card into them, no ring
copy; buffers elsewhere keep the ring. The unhappy paths: a registration that
breaks the rules, an item outside its segment, a file shrunk under the
gateway, a client that gives up while the gateway would still write."""

from __future__ import annotations

import mmap
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time

import pytest

from lmcache_adp import ADPConnector
from lmcache_adp._native import FEATURE_RING, FEATURE_SEGMENTS, FRAME_TYPES, MAX_MESSAGE_BYTES
from lmcache_adp.gateway_stats import read_gateway_stats
from lmcache_adp.stats_catalog import LOAD_PROFILE_STEPS
from tests.gateway import wire
from tests.helpers import RawConnector, hits_hold_their_own, payload
from tests.support.gateway import Gateway, temp_gateway
from tests.support.stalling_fuse import StallingFuse

SIZE = 256 << 10
REGISTER, SEGMENT_OK = FRAME_TYPES["REGISTER_SEGMENT"], FRAME_TYPES["SEGMENT_OK"]
RING_BYTES = 1 << 20


@pytest.fixture(params=["shm", "disk"])
def card_gateway(request):
    """A gateway on a tmpfs card (read straight into the segment) or one on
    /tmp (staged, then copied into it)."""
    d = tempfile.mkdtemp(prefix="adpseg-", dir="/dev/shm" if request.param == "shm" else "/tmp")
    gw = Gateway(d).start()
    yield gw
    if gw.proc:
        gw.kill()
    shutil.rmtree(d, ignore_errors=True)


class ShmPool:
    """Load buffers carved out of one /dev/shm file, as LMCache's L1 pool with --shm-name."""

    def __init__(self, n: int, size: int):
        self.path = f"/dev/shm/adp-test-pool-{os.getpid()}-{time.monotonic_ns()}"
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(self.fd, n * size)
        self.map = mmap.mmap(self.fd, n * size)
        self.views = [memoryview(self.map)[i * size : (i + 1) * size] for i in range(n)]

    def close(self) -> None:
        for v in self.views:
            v.release()
        self.map.close()
        os.close(self.fd)
        os.unlink(self.path)


def stats(gw: Gateway) -> dict:
    return read_gateway_stats(gw.unix_url)


def test_stores_from_shm_buffers_skip_the_ring_on_a_memory_card(card_gateway):
    gw = card_gateway
    memory_card = gw.workdir.startswith("/dev/shm")
    keys = [f"segput@{i}" for i in range(10)]
    pool = ShmPool(len(keys), SIZE)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=10000))
    try:
        for k, v in zip(keys, pool.views, strict=True):
            v[:] = payload(k, SIZE)
        assert c.set(keys, pool.views)[0]
        # Read from the pool in place on a memory-speed card; through the ring on any other.
        assert stats(gw)["segment_stores"] == (len(keys) if memory_card else 0)
        outs = [bytearray(SIZE) for _ in keys]
        ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
        assert ok and all(per_key)
        assert [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
    finally:
        c.conn.close()
        pool.close()


def test_loads_into_shm_buffers_skip_the_ring(card_gateway):
    gw = card_gateway
    keys = [f"seg@{i}" for i in range(12)]
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=10000))
    assert c.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
    pool = ShmPool(len(keys) + 1, SIZE)
    try:
        # The last key is missing: its buffer must be left as it was.
        pool.views[-1][:] = b"\x5a" * SIZE
        ok, _, per_key = c.get(keys + ["seg@missing"], pool.views)
        assert per_key == [True] * len(keys) + [False]
        assert [bytes(v) for v in pool.views[:-1]] == [payload(k, SIZE) for k in keys]
        assert bytes(pool.views[-1]) == b"\x5a" * SIZE
        st = stats(gw)
        assert st["segment_loads"] == len(keys), st  # every hit went straight into the pool
        assert st["segments"] >= 1

        # Anonymous buffers: through the ring, as before.
        outs = [bytearray(SIZE) for _ in keys]
        ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
        assert ok and all(per_key)
        assert [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
        assert stats(gw)["segment_loads"] == len(keys)
    finally:
        c.conn.close()
        pool.close()
    assert gw.proc.poll() is None


TRY = "MADV_POPULATE_WRITE fails as EINVAL, not made"
REFUSED = "this kernel refuses MADV_POPULATE_WRITE"


def test_a_kernel_that_refuses_populate_is_asked_once():
    """Where the kernel refuses MADV_POPULATE_WRITE (EINVAL: before Linux 5.14; ADP_TEST_SEGMENT_POPULATE_EINVAL
    answers the gateway's question to the kernel so, logging each) the gateway says so once at WARNING and makes
    no call after: loads into buffers whose pages were never populated still land intact (the copy faults them
    in), with one try per connection at most, not one per load (review r11). The stores before them (a memory
    card) may be the ones that ask."""
    keys = [f"refused@{i}" for i in range(6)]
    with temp_gateway(env={"ADP_TEST_SEGMENT_POPULATE_EINVAL": "1"}) as gw:
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=10000))
        assert c.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
        pool = ShmPool(len(keys), SIZE)
        tries_after = []
        try:
            for _ in range(2):  # the second round: buffers the first one loaded into
                ok, _, per_key = c.get(keys, pool.views)
                assert ok and all(per_key)
                assert [bytes(v) for v in pool.views] == [payload(k, SIZE) for k in keys]
                tries_after.append(gw.log().count(TRY))
            st = stats(gw)
            assert st["segment_loads"] == 2 * len(keys) and st["segment_populates"] == 0, st
        finally:
            c.conn.close()
            pool.close()
        log = gw.log()
        assert gw.proc.poll() is None, log
    # The 2 connections' first loads may both try before either sees the refusal: one try per connection at
    # most, and none once it was refused (the second round), refused logged once.
    refused = [line for line in log.splitlines() if REFUSED in line]
    assert 1 <= tries_after[0] <= 2 and tries_after[1] == tries_after[0] and len(refused) == 1, (tries_after, log)
    assert "WARNING" in refused[0] and "not tried again" in refused[0], refused


def test_a_memory_cards_stores_ask_a_refusing_kernel_once():
    """A store into a card on tmpfs populates the card's pages before it copies into the card's mapping
    (MADV_POPULATE_WRITE, CardDevice::prepare_mapped_write); where the kernel refuses the call the gateway asks
    it once, not once per store as it did before session twelve (one failing system call per store), and
    writes the stores with pwritev instead: they load back intact. No segment here: the one try is the stores'."""
    keys = [f"refused-store@{i}" for i in range(8)]
    with temp_gateway(env={"ADP_TEST_SEGMENT_POPULATE_EINVAL": "1"}) as gw:
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000))
        try:
            for k in keys:  # a put each: 8 mapped stores
                assert c.set([k], [memoryview(payload(k, SIZE))])[0]
            assert hits_hold_their_own(gw.unix_url, keys, SIZE, "bytes not its own") == [True] * len(keys)
            assert stats(gw)["segments"] == 0
        finally:
            c.conn.close()
        log = gw.log()
        assert gw.proc.poll() is None, log
    refused = [line for line in log.splitlines() if REFUSED in line]
    assert log.count(TRY) == 1 and len(refused) == 1, log
    assert "WARNING" in refused[0] and "stores into a card on tmpfs are written with pwritev" in refused[0], refused


def test_a_refusing_kernel_is_named_by_the_cards_prefault():
    """A tmpfs card's written extents are mapped in ahead with MADV_POPULATE_READ (Linux 5.14, as
    MADV_POPULATE_WRITE): on an older kernel the prefault logged "mapping its extents in ahead stopped at
    offset 0: Invalid argument", once per open, without saying why (review r12). It now asks the kernel the
    same one question first and says why: the kernel does not have it, loads fault the pages in instead."""
    with temp_gateway(env={"ADP_TEST_SEGMENT_POPULATE_EINVAL": "1"}) as gw:
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000))
        try:
            assert c.set(["k"], [memoryview(payload("k", SIZE))])[0]
        finally:
            c.conn.close()
        log = gw.log()
    said = [line for line in log.splitlines() if "not mapped in ahead" in line]
    assert len(said) == 1 and "does not have MADV_POPULATE_READ (Linux before 5.14)" in said[0], log
    assert "loads fault its pages in" in said[0] and "Invalid argument" not in log, log
    assert "written extents mapped in" not in log and log.count(TRY) == 1, log


HINT = "Start `lmcache server` with --shm-name"


def test_segment_pages_are_populated_once(card_gateway):
    """The gateway sets up its page tables for a load's pages once (MADV_POPULATE_WRITE, tracked per 4 KiB
    page): loads into buffers loaded into before make no such call, whatever the objects' size and alignment
    (it cost 11-17 us per 64-256 KiB load on the 2-CPU VM); a buffer over pages not yet populated makes one."""
    gw = card_gateway
    keys = [f"pop@{i}" for i in range(6)]
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=10000))
    assert c.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
    # Objects 4 KiB past a 2 MiB boundary and smaller than 2 MiB: none covers one of the 2 MiB chunks the
    # gateway used to track, so each of its loads populated again.
    at, half = 4096, SIZE // 2
    pool = ShmPool(1, at + half + len(keys) * SIZE)
    views = [pool.views[0][at + i * SIZE : at + (i + 1) * SIZE] for i in range(len(keys))]
    shifted = [pool.views[0][at + half + i * SIZE : at + half + (i + 1) * SIZE] for i in range(len(keys))]
    try:
        for round_ in range(3):
            ok, _, per_key = c.get(keys, views)
            assert ok and all(per_key)
            assert [bytes(v) for v in views] == [payload(k, SIZE) for k in keys]
            st = stats(gw)
            assert st["segment_loads"] == (round_ + 1) * len(keys), st
            # One call per buffer in the first round (their pages do not overlap), none after.
            assert st["segment_populates"] == len(keys), (round_, st)
        # Half a buffer over pages no load used: that one load populates, the others do not.
        ok, _, per_key = c.get(keys, shifted)
        assert ok and all(per_key)
        assert [bytes(v) for v in shifted] == [payload(k, SIZE) for k in keys]
        assert stats(gw)["segment_populates"] == len(keys) + 1
    finally:
        for v in views + shifted:
            v.release()
        c.conn.close()
        pool.close()
    assert gw.proc.poll() is None


def written_pool(n: int) -> ShmPool:
    """A pool whose pages the client wrote (as LMCache's L1 pool, pinned or used before): the file holds them."""
    pool = ShmPool(n, SIZE)
    pool.map[:] = b"\x01" * (n * SIZE)
    return pool


def register_by_a_miss(c: RawConnector, pool: ShmPool) -> None:
    """Registers the pool's file with the gateway without a load into it: a load of keys the card does not hold
    (a miss delivers nothing, so it populates nothing)."""
    ok, _, per_key = c.get([f"absent@{i}" for i in range(len(pool.views))], pool.views)
    assert per_key == [False] * len(pool.views)


def stored_and_pool(gw: Gateway, tag: str, n: int, workers: int = 1) -> tuple[RawConnector, list[str], ShmPool]:
    """A connector on gw that stored n keys (from anonymous memory), and a written pool of n buffers for them."""
    keys = [f"{tag}@{i}" for i in range(n)]
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=workers, timeout_ms=10000))
    assert c.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
    return c, keys, written_pool(n)


def wait_for_stat(gw: Gateway, key: str, want: int, timeout: float = 30.0) -> dict:
    give_up = time.monotonic() + timeout
    while (st := stats(gw))[key] != want and time.monotonic() < give_up:
        time.sleep(0.02)
    return st


def test_a_registered_segment_is_populated_before_its_first_load(card_gateway):
    """Issue 10 item 2: the gateway populates a registered segment's written pages in the background
    (--segment-prefault on, the default), so the first loads into them make no MADV_POPULATE_WRITE (~220 us a
    2 MiB object before): segment_prefault_bytes counts the pool's bytes, segment_prefaults the file, and
    segment_populates does not move through two rounds of loads. A second connection registering the same file
    (the mapping is shared) does not populate it again."""
    gw = card_gateway
    c, keys, pool = stored_and_pool(gw, "prefault", 6, workers=2)
    try:
        register_by_a_miss(c, pool)
        st = wait_for_stat(gw, "segment_prefaults", 1)
        assert st["segment_prefaults"] == 1 and st["segment_prefault_bytes"] == len(keys) * SIZE, st
        assert st["segment_prefault_ns"] > 0 and st["segment_populates"] == 0 and st["segments"] >= 1, st
        for round_ in range(2):
            ok, _, per_key = c.get(keys, pool.views)
            assert ok and all(per_key)
            assert [bytes(v) for v in pool.views] == [payload(k, SIZE) for k in keys]
            st = stats(gw)
            assert st["segment_loads"] == (round_ + 1) * len(keys) and st["segment_populates"] == 0, (round_, st)
        assert st["segment_prefaults"] == 1 and st["segment_prefault_bytes"] == len(keys) * SIZE, st
    finally:
        c.conn.close()
        pool.close()
    log = gw.log()
    assert gw.proc.poll() is None, log
    assert log.count("of written pages populated in the background") == 1, log


def register_wait_and_load(gw: Gateway, tag: str) -> tuple[dict, str]:
    """Stores 4 keys, registers a written pool by a miss, waits until the background populate finished with every
    segment added (segment_prefault_pending 0: a gate, not a pause, review r15 N11; at once where none was added),
    loads the keys into it and checks their bytes; returns the gateway's stats and log."""
    c, keys, pool = stored_and_pool(gw, tag, 4)
    try:
        register_by_a_miss(c, pool)
        assert wait_for_stat(gw, "segment_prefault_pending", 0)["segment_prefault_pending"] == 0
        ok, _, per_key = c.get(keys, pool.views)
        assert ok and all(per_key)
        assert [bytes(v) for v in pool.views] == [payload(k, SIZE) for k in keys]
        st = stats(gw)
    finally:
        c.conn.close()
        pool.close()
    log = gw.log()
    assert gw.proc.poll() is None, log
    assert st["segments"] >= 1 and st["segment_loads"] == len(keys), st
    return st, log


def test_segment_prefault_off_leaves_the_pages_to_the_loads():
    """--segment-prefault off: nothing is populated in the background; each first load into a page populates its
    own (one call a buffer), as before session fifteen."""
    with temp_gateway(extra=("--segment-prefault", "off")) as gw:
        st, log = register_wait_and_load(gw, "prefault-off")
    assert st["segment_prefault_bytes"] == st["segment_prefaults"] == st["segment_prefault_ns"] == 0, st
    assert st["segment_populates"] == 4, st
    assert "populated in the background" not in log, log


def test_a_refusing_kernel_populates_no_segment_in_the_background():
    """ADP_TEST_SEGMENT_POPULATE_EINVAL (a kernel before Linux 5.14): the background populate makes no call and
    counts nothing; the refusal is logged once, as before; loads land intact (their copy faults the pages in)."""
    with temp_gateway(env={"ADP_TEST_SEGMENT_POPULATE_EINVAL": "1"}) as gw:
        st, log = register_wait_and_load(gw, "prefault-refused")
    assert st["segment_prefault_bytes"] == st["segment_prefaults"] == st["segment_populates"] == 0, st
    refused = [line for line in log.splitlines() if REFUSED in line]
    assert len(refused) == 1 and log.count(TRY) == 1, log
    assert "populated in the background" not in log and "in the background stopped" not in log, log


def disk_dir() -> str:
    """A directory on a disk filesystem (not in memory): /var/tmp or /tmp."""
    for d in ("/var/tmp", "/tmp"):
        fs = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip()
        if fs not in ("tmpfs", "ramfs", "hugetlbfs"):
            return d
    pytest.skip("/var/tmp and /tmp are both in memory here")


def written_file(directory: str, size: int) -> tuple[str, int]:
    """A file of size bytes, all written and synced, in directory; its fd open read-write."""
    fd, path = tempfile.mkstemp(prefix="adp-test-seg-", dir=directory)
    os.write(fd, b"\x02" * size)
    os.fsync(fd)
    return path, fd


def test_a_segment_on_a_disk_file_is_not_populated_in_the_background():
    """Review r15 N10: the background populate write-faults each written page (MADV_POPULATE_WRITE), which on a
    disk filesystem dirties the page: a whole file written back and its mtime moved with no load asked for. A
    segment file on a disk filesystem is left to the loads (a DEBUG line says so); a /dev/shm one registered after
    it on the same connection is still populated. Segments are gone over in the order added, so once the /dev/shm
    one is done the disk file was passed over: no sleep."""
    size = 4 << 20
    disk_path, disk_fd = written_file(disk_dir(), size)
    os.utime(disk_fd, ns=(10**18, 10**18))  # 2001: the populate would set it to now
    shm_path, shm_fd = shm_file(size)
    os.write(shm_fd, b"\x03" * size)
    try:
        with temp_gateway(env={"ADP_LOG_LEVEL": "DEBUG"}) as gw:
            c = RawClient(gw)
            try:
                assert c.register(disk_fd, size, seg_id=1) == (SEGMENT_OK, b"")
                assert c.register(shm_fd, size, seg_id=2) == (SEGMENT_OK, b"")
                st = wait_for_stat(gw, "segment_prefaults", 1)
                assert st["segments"] == 2, st
            finally:
                c.close()
            log = gw.log()
        assert st["segment_prefaults"] == 1 and st["segment_prefault_bytes"] == size, st
        assert os.fstat(disk_fd).st_mtime_ns == 10**18, "the disk file's mtime moved"
        assert f"segment {disk_path} is not on a memory filesystem" in log, log
        assert log.count("of written pages populated in the background") == 1 and shm_path in log, log
    finally:
        for fd, path in ((disk_fd, disk_path), (shm_fd, shm_path)):
            os.close(fd)
            os.unlink(path)


SEG_STEPS = tuple(s for s in LOAD_PROFILE_STEPS if s.startswith("seg_"))  # a segment load's steps


def test_load_profile_counts_each_step_of_a_segment_load():
    """ADP_LOAD_PROFILE=1: the gateway's seg_* steps (aaea38d: where a segment load's time goes, benchmarks/README.md
    "Session thirteen, measured", read by bench_connector's segment_load_table) count each item of a segment load
    once in item and get, a hit once more in prepare, lease and copy (a miss delivers nothing); every step counted
    has time. The I/O context step counts none: a batch of segment items takes its context before its first item
    (context is for an item after a process item gave the batch's back; the connector sends a batch wholly to
    segments or not at all). A load into anonymous buffers (process memory or the ring) counts no seg_* step.
    Review r14b N3: nothing pinned these counts."""
    d = tempfile.mkdtemp(prefix="adpseg-", dir="/dev/shm")
    gw = Gateway(d).start(env={"ADP_LOAD_PROFILE": 1})
    keys = [f"segprof@{i}" for i in range(4)]
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000))
    pool = ShmPool(len(keys) + 1, SIZE)
    try:
        assert c.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
        batches = 2
        for _ in range(batches):
            ok, _, per_key = c.get(keys + ["segprof@missing"], pool.views)
            assert per_key == [True] * len(keys) + [False]
            assert [bytes(v) for v in pool.views[:-1]] == [payload(k, SIZE) for k in keys]
        st = stats(gw)
        outs = [bytearray(SIZE) for _ in keys]
        assert c.get(keys, [memoryview(o) for o in outs])[2] == [True] * len(keys)
        assert [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
        after = stats(gw)
    finally:
        c.conn.close()
        pool.close()
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)
    hits = batches * len(keys)
    assert st["segment_loads"] == hits, st
    n = {step: st[f"load_profile_{step}_n"] for step in SEG_STEPS}
    assert n["seg_item"] == n["seg_get"] == batches * (len(keys) + 1), n
    assert n["seg_prepare"] == n["seg_lease"] == n["seg_copy"] == hits, n
    assert n["seg_context"] == 0, n
    for step, count in n.items():
        assert (st[f"load_profile_{step}_ns"] > 0) == (count > 0), (step, st)
    assert {step: after[f"load_profile_{step}_n"] for step in SEG_STEPS} == n, after


def test_batch_time_counts_each_put_and_get_batch(card_gateway):
    """batch_puts / batch_gets count the put and get batches answered, batch_put_ns / batch_get_ns the
    connection's time on them (request read to reply written), so that a client's time per request beyond it
    is the round trip (benchmarks/README.md, "Session eleven"); exists batches count in neither."""
    gw = card_gateway
    pool = ShmPool(4, SIZE)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000))
    try:
        t0 = time.monotonic()
        for r in range(3):  # one worker: a submit is one request
            keys = [f"bt@{r}@{i}" for i in range(2)]
            for k, v in zip(keys, pool.views[:2], strict=True):
                v[:] = payload(k, SIZE)
            assert c.set(keys, pool.views[:2])[0]
        for _ in range(2):
            ok, _, per_key = c.get(keys, pool.views[2:])
            assert ok and all(per_key)
        assert c.exists(keys)[0]
        wall_ns = (time.monotonic() - t0) * 1e9
        st = stats(gw)
        assert (st["batch_puts"], st["batch_gets"], st["batches"]) == (3, 2, 6), st
        assert 0 < st["batch_put_ns"] and 0 < st["batch_get_ns"], st
        assert st["batch_put_ns"] + st["batch_get_ns"] < wall_ns, (st, wall_ns)
    finally:
        c.conn.close()
        pool.close()


def test_a_connectors_request_timing_splits_each_slice_and_moves_with_the_gateways(card_gateway):
    """The connector's per-request timing (worker_{put,get}_*, gateway_{put,get}_*; docs/stats.md): counts equal
    the slices, batches and requests sent (the gateway counts as many requests), every part moves, the parts of a
    slice's run add up to no more than it, the request's round trip holds the gateway's own time on it, and a
    batch's whole (submit to eventfd) is no shorter than the latency its future recorded and no longer than the
    parts of all its slices. Exists and delete batches count in none of them."""
    gw = card_gateway
    rounds, per = 3, 4  # two workers: each batch of 4 keys is two slices of 2
    pool = ShmPool(2 * per, SIZE)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=10000))
    try:
        for r in range(rounds):
            keys = [f"rt@{r}@{i}" for i in range(per)]
            for k, v in zip(keys, pool.views[:per], strict=True):
                v[:] = payload(k, SIZE)
            assert c.set(keys, pool.views[:per])[0]
            ok, _, per_key = c.get(keys, pool.views[per:])
            assert ok and all(per_key)
        assert c.exists(keys)[0]
        assert c.delete(keys[:1])[0]
        # A slice is counted once its worker is done with it, after its batch's completion was signalled: the
        # last one may still be on its way here (2 s at most).
        deadline = time.monotonic() + 2
        while True:
            st, served = c.conn.stats(), stats(gw)
            counted = [st[f"worker_{op}_{k}"] for op in ("put", "get") for k in ("slices", "batches")]
            if counted == [2 * rounds, rounds] * 2 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for op, n_key, ns_key in (("put", "batch_puts", "batch_put_ns"), ("get", "batch_gets", "batch_get_ns")):
            w, g = (lambda k, op=op: st[f"worker_{op}_{k}"]), (lambda k, op=op: st[f"gateway_{op}_{k}"])
            assert (w("slices"), w("batches"), g("slices"), g("requests")) == (
                2 * rounds,
                rounds,
                2 * rounds,
                2 * rounds,
            ), st
            assert g("requests") == served[n_key], (st, served)
            for k in ("queue_ns", "run_ns", "done_ns", "batch_ns", "pickup_ns"):
                assert w(k) > 0, (op, k, st)
            for k in ("setup_ns", "round_trip_ns", "finish_ns"):
                assert g(k) > 0, (op, k, st)
            assert g("setup_ns") + g("round_trip_ns") + g("finish_ns") <= w("run_ns"), (op, st)
            assert served[ns_key] < g("round_trip_ns"), (op, st, served)
            assert w("batch_ns") <= w("queue_ns") + w("run_ns") + w("done_ns"), (op, st)
            lat = st["latency_us_log2"]["set" if op == "put" else "get"]
            assert lat["count"] == rounds and lat["sum_us"] * 1000 <= w("batch_ns"), (op, lat, st)
    finally:
        c.conn.close()
        pool.close()


def spin_rounds(gw: Gateway, c: RawConnector, pool: ShmPool, prefix: str, rounds: int, expect: int) -> tuple[int, int]:
    """`rounds` back to back (a store and a load of two objects each: two answers, each next request well within
    10 ms of the last reply); the gateway's batch_spins and batch_spin_hits counted meanwhile, read once `expect`
    spins are (2 s at most: the last answer's spin is counted after its reply; expect 0: 0.2 s after it)."""
    before = stats(gw)  # the reader's connection is counted from here on
    for r in range(rounds):
        keys = [f"{prefix}@{r}@{i}" for i in range(2)]
        for k, v in zip(keys, pool.views, strict=True):
            v[:] = payload(k, SIZE)
        assert c.set(keys, pool.views)[0]
        ok, _, per_key = c.get(keys, pool.views)
        assert ok and all(per_key)
        assert [bytes(v) for v in pool.views] == [payload(k, SIZE) for k in keys]
    if not expect:
        time.sleep(0.2)
    deadline = time.monotonic() + 2
    while True:
        st = stats(gw)
        n, hits = st["batch_spins"] - before["batch_spins"], st["batch_spin_hits"] - before["batch_spin_hits"]
        if n >= expect or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert st["batch_puts"] + st["batch_gets"] - before["batch_puts"] - before["batch_gets"] == 2 * rounds, st
    return n, hits


@pytest.mark.parametrize(
    ("spin_us", "cpus", "spins"),
    [("10000", 1000, True), ("0", 1000, False), ("10000", 1, False), (None, 1000, False)],
    ids=str,
)
def test_a_connection_looks_for_the_next_request_awake_while_cpus_are_spare(tmp_path, spin_us, cpus, spins):
    """After answering a put or get, the connection's thread polls for the client's next request for up to
    --request-spin-us before it sleeps (batch_spins; batch_spin_hits those a request ended), only while
    connections x 2 <= CPUs and the machine's runnable threads x 2 <= CPUs (/proc/loadavg, read every 10 ms);
    ADP_TEST_GATEWAY_CPUS sets the CPUs both rules count: 1000 passes the first, 1 fails it (1 x 2 > 1). The
    runnable threads read here are 0 (ADP_TEST_LOADAVG_FILE), so the load rule passes in every case and the 1-CPU
    case fails by the connection rule alone (with this machine's count it failed both: a gateway that ignored the
    connection rule passed it). --request-spin-us 0, the default: never. Each request is answered all the same. The
    load rule: test_the_request_spin_follows_the_machines_runnable_threads."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.00 0.00 0.00 0/1234 5678\n")
    d = tempfile.mkdtemp(prefix="adpspin-", dir="/dev/shm")
    flag = ("--request-spin-us", spin_us) if spin_us else ()  # None: the default, 0 (session eleven's device run)
    gw = Gateway(d, extra=flag).start(env={"ADP_TEST_GATEWAY_CPUS": cpus, "ADP_TEST_LOADAVG_FILE": loadavg})
    pool = ShmPool(2, SIZE)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000))
    try:
        n, hits = spin_rounds(gw, c, pool, "spin", 5, 10 if spins else 0)
        if spins:
            assert n == 10 and 1 <= hits <= 9, (n, hits)  # each answer; the last one's wait ends unanswered
        else:
            assert (n, hits) == (0, 0)
    finally:
        c.conn.close()
        pool.close()
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_the_request_spin_follows_the_machines_runnable_threads(tmp_path):
    """--request-spin-us's load rule: a connection spins only while the machine's runnable threads x 2 <= the
    gateway's CPUs (ADP_TEST_GATEWAY_CPUS: 1000, so the connection rule always passes), read from /proc/loadavg
    (here ADP_TEST_LOADAVG_FILE, a file the test writes) at most every kSpinLoadEvery (10 ms; here
    ADP_TEST_SPIN_LOAD_EVERY_MS, 5 s: the cached phase has ~4.5 s of margin on a loaded 2-core host, review r12 N6). 600 runnable (600 x 2 > 1000): no answer spins; 1 runnable, read once the
    interval passed: every answer spins (batch_spins), the next request ends some spins (batch_spin_hits); loaded
    again: answers within the interval of the last read still spin (the value read then), those after it do not."""
    loadavg = tmp_path / "loadavg"

    def runnable(n: int) -> None:
        loadavg.write_text(f"0.00 0.00 0.00 {n}/1234 5678\n")

    runnable(600)
    d = tempfile.mkdtemp(prefix="adpspinload-", dir="/dev/shm")
    env = {"ADP_TEST_GATEWAY_CPUS": 1000, "ADP_TEST_LOADAVG_FILE": loadavg, "ADP_TEST_SPIN_LOAD_EVERY_MS": 5000}
    gw = Gateway(d, extra=("--request-spin-us", "10000")).start(env=env)
    pool = ShmPool(2, SIZE)
    c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000))
    try:
        n, hits = spin_rounds(gw, c, pool, "loaded", 3, 0)  # read at the first answer: 600 runnable
        assert (n, hits) == (0, 0)
        runnable(1)
        time.sleep(5.1)  # the interval passed since that read: the next answer reads the file again
        n, hits = spin_rounds(gw, c, pool, "idle", 3, 6)
        assert n == 6 and 1 <= hits <= 5, (n, hits)
        runnable(600)  # the last read was at the first answer just above, well within 5 s
        n, _ = spin_rounds(gw, c, pool, "cached", 1, 2)
        assert n == 2, n
        time.sleep(5.1)
        n, hits = spin_rounds(gw, c, pool, "reread", 2, 0)
        assert (n, hits) == (0, 0)
        assert "ADP_TEST_LOADAVG_FILE" in gw.log()  # the hook is logged as set
    finally:
        c.conn.close()
        pool.close()
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


POLL_CALL = re.compile(r"^(\d+)\s+poll\(\[\{fd=\d+, events=[^}]*\}\], 1, (-?\d+)\)")


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_request_the_spin_caught_is_read_with_no_poll_of_its_own(tmp_path):
    """review32b F1 (session 33): once the request spin saw the socket readable, the connection reads the frame at
    once: none of its waits polls again (await_frame's, the loader's 20 ms and the store buffers' idle checks, each
    a poll() with a timeout, which would return at once and change nothing). strace, attached to the gateway's
    threads, counts the polls of the connection's thread, the one with the most polls of timeout 0 (the spin's);
    every other poll of it is a wait. Waits come only from requests the spin did not catch (the first, any the load made
    it miss: at most 3 each) and the connection's start, not from the spin's hits. Until then each request waited
    in 3 polls, spin hit or not: ~3 x 2 x 100 here."""
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.00 0.00 0.00 0/1234 5678\n")
    d = tempfile.mkdtemp(prefix="adpspinpoll-", dir="/dev/shm")
    log = tmp_path / "strace.log"
    gw = Gateway(d, extra=("--request-spin-us", "10000")).start(
        env={"ADP_TEST_GATEWAY_CPUS": 1000, "ADP_TEST_LOADAVG_FILE": loadavg}
    )
    pool = ShmPool(2, SIZE)
    tracer = c = None
    try:
        tracer = subprocess.Popen(
            ["strace", "-f", "-e", "trace=poll", "-o", str(log), "-p", str(gw.proc.pid)],
            stderr=subprocess.PIPE,
            text=True,
        )
        said = tracer.stderr.readline()  # "strace: Process N attached with M threads", once all are
        assert "attached" in said, said + tracer.stderr.read()
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=10000))
        rounds = 100
        n, hits = spin_rounds(gw, c, pool, "polls", rounds, 2 * rounds)
        tracer.terminate()  # detaches, the log written whole
        tracer.communicate(timeout=30)
        by_thread: dict[int, list[int]] = {}
        for line in log.read_text().splitlines():
            m = POLL_CALL.match(line)
            if m:
                by_thread.setdefault(int(m.group(1)), []).append(int(m.group(2)))
        # The connection's thread: the one that polls with timeout 0 most (its spins; another may once or twice).
        spinning = max(by_thread, key=lambda t: by_thread[t].count(0))
        assert by_thread[spinning].count(0) >= n, {t: len(p) for t, p in by_thread.items()}  # one a spin at least
        waits = sum(1 for ms in by_thread[spinning] if ms != 0)
        missed = 2 * rounds - hits  # requests no spin caught (the first, spins the load made miss)
        assert n == 2 * rounds and hits >= 1, (n, hits)
        assert waits <= 3 * missed + 10, (waits, missed, hits)
    finally:
        if tracer is not None and tracer.poll() is None:
            tracer.kill()
            tracer.wait()
        if c is not None:
            c.conn.close()
        pool.close()
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_ring_hint_logged_once_for_buffers_outside_shm(gateway, capfd):
    """An operator whose LMCache keeps L1 in process memory, with loads through the ring (process_memory off or
    refused), is told, once, why the gateway copies twice and what to change; buffers in a /dev/shm file (or
    direct_loads off, or loads into process memory) draw no hint."""
    keys = [f"hint@{i}" for i in range(4)]
    pool = ShmPool(len(keys), SIZE)
    shm = RawConnector(ADPConnector(gateway=gateway.unix_url, num_workers=1, timeout_ms=10000))
    off = RawConnector(ADPConnector(gateway=gateway.unix_url, num_workers=1, timeout_ms=10000, direct_loads=False))
    # Loads the gateway writes into this process's memory (r5) do not copy twice: no hint for them.
    pm = RawConnector(ADPConnector(gateway=gateway.unix_url, num_workers=1, timeout_ms=10000))
    anon = RawConnector(ADPConnector(gateway=gateway.unix_url, num_workers=2, timeout_ms=10000, process_memory=False))
    try:
        for k, v in zip(keys, pool.views, strict=True):
            v[:] = payload(k, SIZE)
        assert shm.set(keys, pool.views)[0]
        assert shm.get(keys, pool.views)[2] == [True] * len(keys)
        outs = [bytearray(SIZE) for _ in keys]
        assert off.get(keys, [memoryview(o) for o in outs])[2] == [True] * len(keys)
        assert pm.get(keys, [memoryview(o) for o in outs])[2] == [True] * len(keys)
        assert HINT not in capfd.readouterr().err
        for _ in range(3):
            assert anon.get(keys, [memoryview(o) for o in outs])[2] == [True] * len(keys)
            assert anon.set(keys, [memoryview(o) for o in outs])[0]
        assert capfd.readouterr().err.count(HINT) == 1
    finally:
        for c in (shm, off, pm, anon):
            c.conn.close()
        pool.close()


class RawClient(wire.RingClient):
    """A hand-driven ring connection asking for the segments feature."""

    def __init__(self, gw: Gateway, features: int = FEATURE_RING | FEATURE_SEGMENTS):
        super().__init__(gw.socket, features, RING_BYTES)

    def register(self, fd: int | None, size: int, seg_id: int = 1) -> tuple[int | None, bytes]:
        self.send(REGISTER, struct.pack("<QII", size, seg_id, 0), [] if fd is None else [fd])
        return self.recv()

    def open_lease(self, rid: int) -> None:
        self.map[:8] = struct.pack("<Q", rid << 2 | 1)


def error_text(frame: tuple[int | None, bytes]) -> str:
    ftype, body = frame
    assert ftype == wire.ERROR, frame
    (n,) = struct.unpack_from("<H", body)
    return body[2 : 2 + n].decode()


def shm_file(size: int) -> tuple[str, int]:
    path = f"/dev/shm/adp-test-seg-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    return path, fd


def _no_fd(c: RawClient) -> str:
    return error_text(c.register(None, 1 << 20))


def _pipe(c: RawClient) -> str:
    r, w = os.pipe()
    try:
        return error_text(c.register(r, 1 << 20))
    finally:
        os.close(r)
        os.close(w)


def _with_file(c: RawClient, then) -> str:
    path, fd = shm_file(1 << 20)
    try:
        return then(c, fd)
    finally:
        os.close(fd)
        os.unlink(path)


def _wrong_size(c: RawClient) -> str:
    return _with_file(c, lambda c, fd: error_text(c.register(fd, 2 << 20)))


def _bad_id(c: RawClient) -> str:
    return _with_file(c, lambda c, fd: error_text(c.register(fd, 1 << 20, seg_id=9)))


def _twice(c: RawClient) -> str:
    def go(c, fd):
        assert c.register(fd, 1 << 20) == (SEGMENT_OK, b"")
        return error_text(c.register(fd, 1 << 20))

    return _with_file(c, go)


def _batch_after_register(items) -> callable:
    def go(c, fd):
        assert c.register(fd, 1 << 20) == (SEGMENT_OK, b"")
        op, segment, offset = items
        c.send(wire.BATCH, wire.batch(op, [b"k"], [8192], [offset], segments=[segment]))
        return error_text(c.recv())

    return lambda c: _with_file(c, go)


BAD_REGISTRATIONS = {
    "no descriptor": (_no_fd, "segment registration without its descriptor"),
    "not a regular file": (_pipe, "not a regular file of the stated size"),
    "size disagrees with the file": (_wrong_size, "not a regular file of the stated size"),
    "id out of range": (_bad_id, "segment registration: id out of range"),
    "same id twice": (_twice, "segment 1 registered twice"),
    "unregistered segment in a get": (_batch_after_register((wire.GET, 2, 0)), "names segment 2, not registered"),
    "get past the segment's end": (
        _batch_after_register((wire.GET, 1, (1 << 20) - 4096)),
        "lies outside segment 1",
    ),
    # The fixture's card is on /tmp, not memory-speed: stores from segments are not granted.
    "segment in a put without the feature": (
        _batch_after_register((wire.PUT, 1, 0)),
        "a store from a segment without the segment-stores feature",
    ),
    "segment in an exists": (_batch_after_register((wire.EXISTS, 1, 0)), "segment id out of range"),
}


@pytest.mark.parametrize("case", sorted(BAD_REGISTRATIONS))
def test_bad_registration_closes_only_that_connection(gateway, case):
    bystander = RawConnector(ADPConnector(gateway=gateway.unix_url))
    assert bystander.set(["bystander"], [memoryview(b"still here")])[0]
    c = RawClient(gateway)
    assert c.features == FEATURE_RING | FEATURE_SEGMENTS
    try:
        run, reason = BAD_REGISTRATIONS[case]
        assert reason in run(c)
    finally:
        c.close()
    assert reason in gateway.log()
    out = bytearray(10)
    assert bystander.get(["bystander"], [memoryview(out)])[2] == [True] and out == b"still here"
    bystander.conn.close()


@pytest.mark.parametrize("with_fd", [True, False])
def test_registration_needs_the_feature(gateway, with_fd):
    c = RawClient(gateway, features=FEATURE_RING)
    path, fd = shm_file(1 << 20)
    try:
        assert c.features == FEATURE_RING
        reason = error_text(c.register(fd if with_fd else None, 1 << 20))
        assert ("unexpected descriptors" if with_fd else "without the segments feature") in reason
    finally:
        c.close()
        os.close(fd)
        os.unlink(path)


def test_file_shrunk_under_the_gateway(card_gateway):
    """A client truncates its registered file, then asks for a load into it:
    the gateway neither dies nor loses the object; that load fails."""
    gw = card_gateway
    keys = [f"shrink@{i}" for i in range(4)]
    writer = RawConnector(ADPConnector(gateway=gw.unix_url))
    assert writer.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
    c = RawClient(gw)
    path, fd = shm_file(len(keys) * SIZE)
    try:
        assert c.register(fd, len(keys) * SIZE) == (SEGMENT_OK, b"")
        os.ftruncate(fd, 0)
        c.open_lease(c.rid + 1)
        c.send(
            wire.BATCH,
            wire.batch(
                wire.GET, [k.encode() for k in keys], [SIZE] * 4, [i * SIZE for i in range(4)], segments=[1] * 4
            ),
        )
        # The gateway's copy into the file (from the card's mapping on tmpfs,
        # from staging otherwise) faults: SIGBUS, caught; that connection closes.
        assert "shrank under a load" in error_text(c.recv())
    finally:
        c.close()
        os.close(fd)
        os.unlink(path)
    assert gw.proc.poll() is None, gw.log()
    outs = [bytearray(SIZE) for _ in keys]
    ok, _, per_key = writer.get(keys, [memoryview(o) for o in outs])
    assert ok and all(per_key), "the objects must survive a client's broken segment"
    assert [bytes(o) for o in outs] == [payload(k, SIZE) for k in keys]
    writer.conn.close()


def slow_gateway(monkeypatch, delay_ms: int) -> tuple[str, Gateway]:
    """A gateway on a tmpfs card that sleeps delay_ms before each object it
    copies into or out of a segment (ADP_TEST_SEGMENT_WRITE_DELAY_MS)."""
    d = tempfile.mkdtemp(prefix="adpseg-", dir="/dev/shm")
    monkeypatch.setenv("ADP_TEST_SEGMENT_WRITE_DELAY_MS", str(delay_ms))
    gw = Gateway(d).start()
    monkeypatch.delenv("ADP_TEST_SEGMENT_WRITE_DELAY_MS")
    return d, gw


def test_nothing_written_after_the_future_failed(monkeypatch):
    """The gateway is slow before each object (ADP_TEST_SEGMENT_WRITE_DELAY_MS):
    the load's deadline passes with objects still to write. Once the future
    has failed, the buffers do not change again: the connector revoked the
    load lease, and the gateway writes nothing under a revoked lease."""
    d, gw = slow_gateway(monkeypatch, 300)
    keys = [f"late@{i}" for i in range(6)]
    pool = ShmPool(len(keys), SIZE)
    try:
        writer = RawConnector(ADPConnector(gateway=gw.unix_url))
        assert writer.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
        writer.conn.close()
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=700))
        for v in pool.views:
            v[:] = b"\x11" * SIZE
        ok, _, per_key = c.get(keys, pool.views)
        assert not ok and per_key == [False] * len(keys)
        at_completion = [bytes(v) for v in pool.views]
        # The first object or two landed before the deadline; the rest must never come.
        assert at_completion[-1] == b"\x11" * SIZE
        time.sleep(300 * len(keys) / 1000 + 0.5)  # the gateway would have written them all by now
        assert [bytes(v) for v in pool.views] == at_completion, "bytes landed after the future failed"
        assert stats(gw)["segment_loads"] < len(keys)
        c.conn.close()
    finally:
        pool.close()
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_failed_store_from_a_segment_never_serves_later_bytes(monkeypatch):
    """The gateway is slow before each chunk it reads from a segment: the
    store's deadline passes first. The caller then overwrites its buffers (as
    LMCache may reuse them); no load ever returns those bytes."""
    d, gw = slow_gateway(monkeypatch, 400)
    keys = [f"lateput@{i}" for i in range(4)]
    pool = ShmPool(len(keys), SIZE)
    try:
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=200))
        for k, v in zip(keys, pool.views, strict=True):
            v[:] = payload(k, SIZE)
        ok, _, _ = c.set(keys, pool.views)
        assert not ok
        for v in pool.views:
            v[:] = b"\xee" * SIZE  # reused at once
        time.sleep(1.0)  # the gateway has woken up meanwhile
        c.conn.close()
        hits_hold_their_own(gw.unix_url, keys, SIZE, "bytes the caller wrote after its store failed")
        assert stats(gw)["segment_stores"] == 0
    finally:
        pool.close()
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_a_segment_on_a_fuse_file_is_refused(workdir):
    """Session 23 (gwreview23): a segment was any regular file of the stated size. One on a FUSE filesystem that
    the client serves itself (an unprivileged user mounts one with fusermount) lets it stall the gateway's
    accesses to the mapping without bound: a load into it populates and copies into its pages inside the card
    read, under an I/O context, so a READ its server never answers held that context (and stop()) for good; with
    --io-contexts 1 every other client's request then timed out waiting for one. The process-memory path holds
    nothing shared while it writes into a client for that reason (docs/protocol.md, "Process memory"); a
    segment had no such care. Now a segment on a FUSE filesystem is refused at registration (Error frame, the
    connection closed: the connector then sends that file's buffers through the ring)."""
    if why := StallingFuse.available():
        pytest.skip(f"no FUSE mount here: {why}")
    gw = Gateway(workdir, extra=("--io-contexts", "1")).start()
    fuse = StallingFuse(1 << 20)
    fd = os.open(fuse.path, os.O_RDWR)
    bystander = RawConnector(ADPConnector(gateway=gw.unix_url, timeout_ms=3000))
    try:
        c = RawClient(gw)
        c.map[4096:8192] = b"\x07" * 4096
        c.send(wire.BATCH, wire.batch(wire.PUT, [b"k"], [4096], [4096]))
        assert c.recv()[0] == wire.BATCH_REPLY
        registered = c.register(fd, 1 << 20)
        if registered[0] == SEGMENT_OK:  # a gateway that maps it: a load into it waits on the FUSE server
            c.open_lease(c.rid + 1)
            c.send(wire.BATCH, wire.batch(wire.GET, [b"k"], [4096], [0], timeout_ms=60000, segments=[1]))
            assert fuse.wait_for_held_read(10)
        ok, err, _ = bystander.set(["bystander"], [memoryview(b"still served")])
        assert ok, f"another client's store failed while a load waited on a FUSE segment: {err}"
        assert "FUSE" in error_text(registered), registered
        assert "FUSE" in gw.log()
    finally:
        bystander.conn.close()
        os.close(fd)
        # The server first: a read it took is waited out even by a SIGKILLed gateway (the kernel's FUSE wait is
        # not interruptible once the server has the request); its death fails the read, and the gateway's
        # SIGBUS handler takes the segment as broken.
        fuse.close()
        gw.kill()


def refused_fuse_segment(workdir, parent):
    """Registers a file of a stalling FUSE mount made under `parent` (created) with a fresh gateway, which refuses
    it: (the file's path, the Error frame's text, the gateway's log lines naming the mount)."""
    parent.mkdir(parents=True)
    gw = Gateway(workdir).start()
    fuse = StallingFuse(1 << 20, parent=str(parent))
    fd = os.open(fuse.path, os.O_RDWR)
    try:
        text = error_text(RawClient(gw).register(fd, 1 << 20))
        return fuse.path, text, [line for line in gw.log().splitlines() if "fuse.adp-stalling mount" in line]
    finally:
        os.close(fd)
        fuse.close()
        gw.kill()


def test_a_refused_segments_reason_is_whole_in_the_log_and_the_error_frame(workdir, tmp_path):
    """debt38b: a segment's refusal ran to 260 bytes and more, its verdict ("not mapped") at the end: the gateway's
    log line (log_safe's 200 bytes) never carried it, and with a long path the Error frame (256 bytes,
    kMaxMessageBytes) lost it too. Now the reason starts with its verdict and the type, cuts a long path in the
    middle (its head and tail kept) and fits the frame whole; the log line carries that whole text. A FUSE file
    whose path is about 400 bytes."""
    if why := StallingFuse.available():
        pytest.skip(f"no FUSE mount here: {why}")
    path, text, said = refused_fuse_segment(workdir, tmp_path / ("head-" + "d" * 120) / ("e" * 120) / ("f" * 120))
    assert len(path) > 380, path
    assert len(text.encode()) <= MAX_MESSAGE_BYTES, text
    assert text.startswith("segment not mapped: a FUSE file (fuse.adp-stalling mount: "), text
    assert path[:24] in text and "f" * 20 + "/adp-fuse-" in text and text.count("...") == 1, text
    advice = "/segment): its server decides when the gateway's accesses complete; register memory files (/dev/shm)"
    assert text.endswith(advice), text
    assert len(said) == 1 and f"{text}; closing the connection" in said[0], said


def test_a_refused_segments_non_ascii_path_is_in_the_log_as_in_the_error_frame(workdir, tmp_path):
    """review38 of e6cef15: a segment's refusal makes its path printable ASCII with log_safe's \\xNN escapes, and the
    gateway's WARNING line (ClientHandler::refuse) passed that text through log_safe again, which escapes a backslash:
    a path with a non-ASCII byte was logged "caf\\x5cxc3\\x5cxa9" where the Error frame said "caf\\xc3\\xa9", so
    the log line did not carry the frame's reason. A FUSE file whose kept path tail holds an "\u00e9"."""
    if why := StallingFuse.available():
        pytest.skip(f"no FUSE mount here: {why}")
    _, text, said = refused_fuse_segment(
        workdir, tmp_path / ("head-" + "d" * 120) / ("e" * 120) / ("f" * 40 + "caf\u00e9")
    )
    assert "caf\\xc3\\xa9/adp-fuse-" in text, text
    assert len(said) == 1 and f"{text}; closing the connection" in said[0], said


def test_a_segment_on_a_mount_the_gateway_cannot_see_is_refused_without_asking_its_server(workdir):
    """Review of 33cfc22: a segment's mount is looked up in the gateway's /proc/self/mountinfo; one it does not list
    (the client in a mount namespace of its own: a container, an unprivileged user namespace) was judged by
    fstatfs, which on a FUSE file asks its server. One that never answers a STATFS held the connection's thread for
    good (past stop() and SIGKILL: the kernel waits out a request its server took). Now the seals are asked first
    (the kernel answers them for a tmpfs or hugetlbfs file without asking a filesystem: a memory file is taken as
    before), and a file of a mount the gateway does not list is refused without asking anyone."""
    if why := StallingFuse.available():
        pytest.skip(f"no FUSE mount here: {why}")
    gw = Gateway(workdir).start()
    try:
        fuse = StallingFuse(1 << 20, own_namespace=True)
    except OSError as e:
        gw.kill()
        pytest.skip(f"no mount namespace of its own for the FUSE server here: {e}")
    fd = os.open(fuse.path, os.O_RDWR)
    path, shm = shm_file(1 << 20)
    try:
        c = RawClient(gw)
        c.sock.settimeout(10)
        try:
            registered = c.register(fd, 1 << 20)
        except TimeoutError:
            registered = None
        assert registered is not None, "no answer to a registration: the gateway waits on the FUSE server's STATFS"
        assert "mount" in error_text(registered), registered
        assert not fuse.wait_for_held_read(0.5)  # its server was never asked
        c2 = RawClient(gw)
        assert c2.register(shm, 1 << 20)[0] == SEGMENT_OK  # a /dev/shm file is taken
    finally:
        os.close(fd)
        os.close(shm)
        os.unlink(path)
        fuse.close()  # first: a gateway waiting on the server ends its wait only then
        gw.kill()
