# SPDX-License-Identifier: Apache-2.0
"""ADPConnector driven the way LMCache's NativeConnectorL2Adapter drives it."""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from lmcache_adp import ADPConnector, CardStore
from tests.helpers import MIB, RawConnector, corrupt, no_foreign_bytes, payload


@pytest.fixture
def conn(card):
    c = ADPConnector(card=card, card_size_gb=0.0625, num_workers=4)
    yield RawConnector(c)
    c.close()


def aligned_array(size: int, align: int = 4096, offset: int = 0) -> np.ndarray:
    raw = np.empty(size + align + offset, dtype=np.uint8)
    start = (-raw.ctypes.data) % align + offset
    return raw[start : start + size]


def test_interface_is_what_lmcache_checks(conn):
    for name in (
        "event_fd",
        "submit_batch_get",
        "submit_batch_set",
        "submit_batch_exists",
        "submit_batch_delete",
        "drain_completions",
        "close",
    ):
        assert callable(getattr(conn.conn, name))
    assert isinstance(conn.conn.event_fd(), int)


def test_set_exists_get_delete_with_mixed_lengths_and_alignments(conn):
    sizes = [1, 4096, 4097, 65536 + 5, 200_000, 8192]
    keys = [f"m@00000000@0@{i:x}" for i in range(len(sizes))]
    srcs = []
    for i, (k, n) in enumerate(zip(keys, sizes, strict=True)):
        a = aligned_array(n, offset=0 if i % 2 == 0 else 3)  # zero-copy and staged paths
        a[:] = np.frombuffer(payload(k, n), dtype=np.uint8)
        srcs.append(memoryview(a))
    ok, err, per_key = conn.set(keys, srcs)
    assert ok and err == "" and per_key == [True] * len(keys)

    ok, _, found = conn.exists(keys + ["m@00000000@0@missing"])
    assert ok and found == [True] * len(keys) + [False]

    dsts = [bytearray(n) for n in sizes]
    ok, _, hits = conn.get(keys, [memoryview(d) for d in dsts])
    assert ok and hits == [True] * len(keys)
    assert [bytes(d) for d in dsts] == [payload(k, n) for k, n in zip(keys, sizes, strict=True)]

    ok, _, deleted = conn.delete([keys[0], "never-stored"])
    assert ok and deleted == [True, True]  # both gone: LMCache may forget them (test_delete_result.py)
    ok, _, found = conn.exists(keys[:2])
    assert found == [False, True]


def test_get_miss_leaves_buffer_untouched(conn):
    conn.set(["a"], [memoryview(payload("a", 5000))])
    bufs = [bytearray(b"\x55" * 5000), bytearray(b"\x66" * 5000)]
    ok, _, hits = conn.get(["a", "b"], [memoryview(b) for b in bufs])
    assert ok and hits == [True, False]
    assert bytes(bufs[0]) == payload("a", 5000) and bytes(bufs[1]) == b"\x66" * 5000


def test_get_with_wrong_buffer_length_is_a_miss(conn):
    conn.set(["a"], [memoryview(payload("a", 5000))])
    buf = bytearray(b"\x11" * 4000)
    ok, _, hits = conn.get(["a"], [memoryview(buf)])
    assert hits == [False] and bytes(buf) == b"\x11" * 4000


def test_failed_store_reports_reason(conn):
    ok, err, per_key = conn.set(["ok", "x" * 2000], [memoryview(b"1" * 100), memoryview(b"2" * 100)])
    assert not ok and per_key == [True, False]
    assert "exceeds the bound of 1024 bytes" in err
    ok, err, per_key = conn.set(["huge"], [memoryview(bytearray(80 * MIB))])
    assert not ok and "larger than the largest object" in err
    assert conn.exists(["huge"])[2] == [False]


def test_a_failed_store_batch_stores_each_of_its_objects_whole_or_not_at_all(conn):
    """README, "What LMCache is told when something fails": visibility is atomic per object, not per batch
    (review34 F1; the lead's decision). A batch whose middle key fails (80 MiB: larger than the largest object of
    this 64 MiB card) fails ok=False; the failed key is absent (no lookup finds it, a load leaves its buffer
    untouched), while its siblings, stored whole, are found and read back byte for byte: exactly the keys per_key
    reports stored are visible. test_failed_store_reports_reason checks only the per-key results and a failed
    key stored alone, not what a lookup and a load of a failed batch's keys find."""
    keys = ["before", "huge", "after"]
    srcs = [payload("before", 5000), bytes(range(256)) * (80 * MIB // 256), payload("after", 70_000)]
    ok, err, per_key = conn.set(keys, [memoryview(b) for b in srcs])
    assert not ok and "larger than the largest object" in err
    assert per_key == [True, False, True]
    assert conn.exists(keys)[2] == per_key, "the keys visible are not those reported stored"
    outs = [bytearray(b"\x5a" * len(b)) for b in srcs]
    assert conn.get(keys, [memoryview(o) for o in outs])[2] == per_key
    assert bytes(outs[0]) == srcs[0] and bytes(outs[2]) == srcs[2], "a stored sibling reads back other bytes"
    assert outs[1] == b"\x5a" * len(srcs[1]), "the failed key's load buffer was written"


def test_a_failed_keys_error_text_is_clipped_as_the_wire_clips_it(conn):
    """Review34: a future's error text repeated the whole key ("store of key <1113 bytes> failed: ...", 1.2 KB).
    The key is clipped to 256 bytes, the bound of a per-key error text on the wire, marked with its length, and
    the reason after it stays whole; a cut never splits a UTF-8 character (the completion's str() would raise)."""
    long_key = "k" * 1113
    ok, err, _ = conn.set([long_key], [memoryview(b"1" * 100)])
    assert not ok
    assert err == f"store of key {'k' * 256}... (1113 bytes) failed: key of 1113 bytes exceeds the bound of 1024 bytes"
    # A valid key of 1000 bytes whose object is too large: the reason is kept whole after the clipped key.
    ok, err, _ = conn.set(["v" * 1000], [memoryview(bytearray(80 * MIB))])
    assert not ok and err.startswith(f"store of key {'v' * 256}... (1000 bytes) failed: object of 83886080 bytes")
    assert err.endswith(")") and len(err) < 600, err
    # Byte 256 of this key is the second byte of an "é": the clip ends before that character.
    e_acute = "\u00e9"
    ok, err, _ = conn.set(["x" + e_acute * 600], [memoryview(b"1" * 100)])
    assert not ok and err.startswith(f"store of key x{e_acute * 127}... (1201 bytes) failed: key of 1201 bytes"), err


def test_empty_batches_complete(conn):
    assert conn.set([], [])[0] and conn.exists([]) == (True, "", [])


def test_key_count_must_match_buffers(conn):
    with pytest.raises(ValueError, match="2 keys but 1 buffers"):
        conn.conn.submit_batch_set(["a", "b"], [memoryview(b"x")])


def test_readonly_buffer_rejected_for_get(conn):
    with pytest.raises(BufferError):
        conn.conn.submit_batch_get(["a"], [memoryview(b"readonly")])


def test_drain_consumes_eventfd(conn):
    fid = conn.conn.submit_batch_exists(["a"])
    conn.wait(fid)
    p = select.poll()
    p.register(conn.conn.event_fd(), select.POLLIN)
    assert p.poll(50) == []  # level-triggered fd is quiet after drain


def test_every_future_completes_on_close_with_work_pending(card):
    c = ADPConnector(card=card, card_size_gb=0.25, num_workers=2)
    rc = RawConnector(c)
    data = [memoryview(bytearray(2 * MIB)) for _ in range(8)]
    fids = [c.submit_batch_set([f"k{j}-{i}" for i in range(8)], data) for j in range(30)]
    fids += [c.submit_batch_get([f"k0-{i}" for i in range(8)], [memoryview(bytearray(2 * MIB)) for _ in range(8)])]
    c.close()
    got = {}
    for cpl in c.drain_completions():
        assert cpl[0] not in got
        got[cpl[0]] = cpl
    assert sorted(got) == sorted(fids)
    failed = [f for f in fids if not got[f][1]]
    assert failed and all(got[f][2] == "connector closed" for f in failed)
    # After close, new work completes at once as failed; nothing hangs.
    fid = c.submit_batch_exists(["a"])
    assert rc.wait(fid, timeout=5) == (False, "connector is closed", [False])


def test_deadline_completes_futures(card):
    c = ADPConnector(card=card, card_size_gb=0.5, num_workers=1, timeout_ms=1)
    rc = RawConnector(c)
    keys = [[f"t{j}-{i}" for i in range(16)] for j in range(4)]
    fids = [c.submit_batch_set(ks, [memoryview(payload(k, 4 * MIB)) for k in ks]) for ks in keys]
    results = [rc.wait(f, timeout=10) for f in fids]
    timed_out = [r for r in results if not r[0]]
    assert timed_out and all(r[1] == "timed out after 1 ms" for r in timed_out)
    c.close()
    # Whatever a late store left behind is either absent or exactly right.
    c2 = RawConnector(ADPConnector(card=card, num_workers=1))
    for ks in keys:
        bufs = [bytearray(4 * MIB) for _ in ks]
        _, _, hits = c2.get(ks, [memoryview(b) for b in bufs])
        assert all(bytes(b) == payload(k, 4 * MIB) for k, b, h in zip(ks, bufs, hits, strict=True) if h)
    c2.conn.close()


def test_two_connectors_on_one_card_is_an_error(card):
    c = ADPConnector(card=card, card_size_gb=0.0625)
    with pytest.raises(RuntimeError, match="already open by another connector or gateway"):
        ADPConnector(card=card)
    c.close()


def test_ctypes_memoryview_like_lmcache(conn):
    """LMCache hands over ctypes-backed memoryviews of L1 memory."""
    src = (ctypes.c_ubyte * 10000).from_buffer_copy(payload("c", 10000))
    dst = (ctypes.c_ubyte * 10000)()
    assert conn.set(["c"], [memoryview(src).cast("B")])[0]
    assert conn.get(["c"], [memoryview(dst).cast("B")])[2] == [True]
    assert bytes(dst) == payload("c", 10000)


def test_latency_histograms_count_completions(conn):
    conn.set(["a", "b"], [memoryview(b"1" * 100), memoryview(b"2" * 100)])
    conn.exists(["a"])
    conn.exists(["b"])
    lat = conn.conn.stats()["latency_us_log2"]
    assert lat["set"]["count"] == 1 and lat["exists"]["count"] == 2 and lat["get"]["count"] == 0
    assert sum(lat["exists"]["buckets"]) == 2 and len(lat["exists"]["buckets"]) == 32


def test_card_io_failure_is_reported_and_recovers(card, monkeypatch):
    """An I/O error: healthy 0; the next I/O that works: 1 again (the hold, kFailingHold, is 0 here)."""
    monkeypatch.setenv("ADP_TEST_CARD_FAILING_HOLD_MS", "0")
    c = RawConnector(ADPConnector(card=card, card_size_gb=0.0625, num_workers=1))
    c.set(["a", "b"], [memoryview(payload("a", 300_000)), memoryview(payload("b", 300_000))])
    size = os.path.getsize(card)
    os.truncate(card, 1 << 20)  # the card loses its data area under the store
    buf = bytearray(300_000)
    ok, err, hits = c.get(["a"], [memoryview(buf)])
    assert not ok and hits == [False] and "unexpected end of card" in err
    assert buf == bytearray(300_000)
    st = c.conn.stats()
    assert not st["healthy"] and st["io_errors"] >= 1
    os.truncate(card, size)  # the card comes back (zeros now: the object reads as damaged)
    ok, err, hits = c.get(["b"], [memoryview(buf)])
    assert ok and hits == [False]  # a checked miss, not an error
    assert c.conn.stats()["healthy"]
    c.conn.close()


# --- Loads from a memory-speed card: read straight into the caller's buffer --------------------


@pytest.fixture
def memory_card():
    """A card image on tmpfs (/dev/shm): the store reads it straight into aligned load buffers."""
    if not os.path.isdir("/dev/shm"):
        pytest.fail("these tests need /dev/shm (tmpfs) for a memory-speed card")
    d = tempfile.mkdtemp(prefix="adp-test-", dir="/dev/shm")
    yield os.path.join(d, "card.img")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(params=["disk", "memory"])
def any_card(request, card, memory_card):
    """The card in the test tree's directory (staged reads unless that is tmpfs) and on tmpfs (direct reads)."""
    return card if request.param == "disk" else memory_card


def test_stores_and_loads_aligned_or_not_survive_a_restart(any_card):
    """Stores from 4 KiB aligned memory (written straight from it; on tmpfs in 1 MiB pieces, header
    last) and from unaligned memory (staged); loads into both kinds of buffer, filled exactly, also
    after the card is reopened (recovery checks every header and CRC)."""
    sizes = [1, 4095, 4096, 4097, MIB + 123, 2 * MIB, 3 * MIB + 5]  # direct I/O goes in 1 MiB pieces
    keys = [f"m@00000000@0@{i:x}" for i in range(len(sizes))]
    srcs = []
    for i, (k, n) in enumerate(zip(keys, sizes, strict=True)):
        a = aligned_array(n, offset=0 if i % 2 == 0 else 3)
        a[:] = np.frombuffer(payload(k, n), dtype=np.uint8)
        srcs.append(memoryview(a))
    c = RawConnector(ADPConnector(card=any_card, card_size_gb=0.25, num_workers=2))
    try:
        assert c.set(keys, srcs)[0]
    finally:
        c.conn.close()
    for _ in range(2):  # the second time after a restart: what recovery found
        c = RawConnector(ADPConnector(card=any_card, num_workers=2))
        try:
            for offset in (0, 3):  # 4 KiB aligned (read in place) and not (staged)
                raws, dsts = [], []
                for n in sizes:
                    a = aligned_array(n + 8192, offset=offset)
                    a[:] = 0x5A
                    raws.append(a)
                    dsts.append(a[:n])
                ok, _, hits = c.get(keys, [memoryview(d) for d in dsts])
                assert ok and hits == [True] * len(keys)
                for k, n, a in zip(keys, sizes, raws, strict=True):
                    assert bytes(a[:n]) == payload(k, n)
                    assert (a[n:] == 0x5A).all(), f"{n}-byte load wrote past its buffer"
            assert c.conn.stats()["checksum_failures"] == 0
        finally:
            c.conn.close()


def card_mappings(card: str) -> list[str]:
    """Lines of this process's memory map that map the card image."""
    real = os.path.realpath(card)
    with open("/proc/self/maps") as f:
        return [line for line in f if line.rstrip().endswith(real)]


def test_memory_card_is_mapped_while_open_and_loads_copy_from_the_mapping(memory_card):
    """A tmpfs card is mapped while open (stores copy into the mapping and loads out of it, each
    checksummed in the same pass, no kernel copy); the mapping goes when the connector closes.
    A load into a buffer of any alignment sees what the last store wrote."""
    key = "m@00000000@0@mapped"
    c = RawConnector(ADPConnector(card=memory_card, card_size_gb=0.25, num_workers=2))
    try:
        maps = card_mappings(memory_card)
        assert len(maps) == 1 and maps[0].split()[1].startswith("rw"), maps
        for n, fill in ((3 * MIB + 5, 0), (MIB, 1)):  # a second store of the key replaces the first
            src = bytes((b + fill) % 256 for b in payload(key, n)[:256]) * (n // 256) + b"\x07" * (n % 256)
            assert c.set([key], [memoryview(src)])[0]
            for offset in (0, 3):
                dst = aligned_array(n, offset=offset)
                ok, _, hits = c.get([key], [memoryview(dst)])
                assert ok and hits == [True] and bytes(dst) == src
    finally:
        c.conn.close()
    assert card_mappings(memory_card) == []


@pytest.mark.parametrize("where", ["payload", "later piece", "tail", "header"])
def test_damaged_object_is_a_miss_and_dropped(any_card, where):
    c = RawConnector(ADPConnector(card=any_card, card_size_gb=0.25, num_workers=1))
    try:
        n = 5 * MIB + 100  # a disk card reads it in 4 MiB pieces, a memory card in 1 MiB pieces
        keys = ["m@00000000@0@good", "m@00000000@0@bad"]
        assert c.set(keys, [memoryview(payload(k, n)) for k in keys])[0]
        corrupt(
            any_card,
            keys[1],
            {"payload": 4096 + 777, "later piece": 4096 + 4 * MIB + 12345, "tail": 4096 + n - 5, "header": 30}[where],
        )
        dsts = [aligned_array(n) for _ in keys]
        for d in dsts:
            d[:] = 0
        ok, _, hits = c.get(keys, [memoryview(d) for d in dsts])
        assert hits == [True, False]
        assert bytes(dsts[0]) == payload(keys[0], n)
        # The README ("integrity"): the missed key's buffer may hold the damaged bytes; nothing else.
        assert no_foreign_bytes(dsts[1], payload(keys[1], n), flipped=1), "foreign bytes in the damaged buffer"
        assert c.conn.stats()["checksum_failures"] == 1
        assert c.exists(keys)[2] == [True, False]
    finally:
        c.conn.close()


def test_no_write_into_a_load_buffer_after_its_future_timed_out(memory_card):
    """Direct reads run under the batch's deadline guard: once a get completed (here by its 1 ms
    deadline, in the middle of reading a 32 MiB object), its buffers stay as they were."""
    n = 32 * MIB
    keys = [f"m@00000000@0@{i}" for i in range(4)]
    c = RawConnector(ADPConnector(card=memory_card, card_size_gb=1, num_workers=1))
    assert c.set(keys, [memoryview(payload(k, n)) for k in keys])[0]
    c.conn.close()
    c = RawConnector(ADPConnector(card=memory_card, num_workers=1, timeout_ms=1))
    try:
        late = timed_out = 0
        dsts = [aligned_array(n) for _ in keys]
        for _ in range(5):
            for d in dsts:
                d[:] = 0
            ok, err, hits = c.get(keys, [memoryview(d) for d in dsts])
            snapshot = dsts[0].copy()  # the object being read when the deadline passed
            time.sleep(0.2)  # the worker finishes the batch meanwhile
            late += not np.array_equal(dsts[0], snapshot)
            if not ok:
                assert err == "timed out after 1 ms" and hits == [False] * len(keys)
                timed_out += 1
        assert timed_out and late == 0
    finally:
        c.conn.close()


def test_a_deadline_waiting_on_a_delivery_does_not_block_submits(card, monkeypatch):
    """A load whose deadline passes while its bytes are being delivered completes once the
    delivery ends (nothing is written after completion); meanwhile the connector keeps
    answering: a lookup submitted after the deadline completes first. (Before, the deadline
    thread waited for the delivery while holding the connector's lock, so the lookup's submit
    blocked until the load's completion was out.)"""
    key = "m@00000000@0@slow"
    c = RawConnector(ADPConnector(card=card, card_size_gb=0.0625, num_workers=1))
    assert c.set([key], [memoryview(payload(key, MIB))])[0]
    c.conn.close()
    monkeypatch.setenv("ADP_TEST_DELIVERY_DELAY_MS", "4000")  # read by the connector at construction
    c = RawConnector(ADPConnector(card=card, num_workers=1, timeout_ms=1000))
    try:
        dst = bytearray(MIB)
        get_fid = c.conn.submit_batch_get([key], [memoryview(dst)])
        # The worker reaches the delivery well within the deadline; after 2 s the deadline
        # has passed and the delivery is still in its pause.
        time.sleep(2.0)
        exists_fid = c.conn.submit_batch_exists([key])
        order = []
        poller = select.poll()
        poller.register(c.conn.event_fd(), select.POLLIN)
        while len(order) < 2:
            assert poller.poll(10_000), "no completion within 10 s"
            order += [done[0] for done in c.conn.drain_completions()]
        assert order == [exists_fid, get_fid], "the lookup waited for the load's delivery"
    finally:
        c.conn.close()


def test_a_card_image_larger_than_its_filesystem_is_warned_about():
    """A sparse image larger than its filesystem's free space was taken silently: once the filesystem is full
    every store fails 'No space left on device' and the card never evicts for it (audit 12, on a 48 MiB tmpfs).
    Now creating one is refused with the figures, an existing one gets a WARNING at open; a card that fits says
    nothing."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # the package's logger does not propagate: listen on it
    logging.getLogger("lmcache_adp").addHandler(handler)
    shm = tempfile.mkdtemp(prefix="adp-space-", dir="/dev/shm")
    try:
        too_big = shutil.disk_usage(shm).total / (1 << 30) + 1  # beyond the whole filesystem: free space never fits
        big = os.path.join(shm, "big.img")
        with pytest.raises(RuntimeError, match=r"cannot create card image .* its filesystem has .* free"):
            ADPConnector(card=big, card_size_gb=too_big, num_workers=1)  # creating one is refused (session 12)
        assert not os.path.exists(big)
        with open(big, "wb") as f:
            f.truncate(int(too_big * (1 << 30)))  # an existing one is opened, with the WARNING
        ADPConnector(card=big, num_workers=1).close()
        warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "but its filesystem has" in warned[0] and "No space left" in warned[0], warned
        records.clear()
        # In a directory of its own: beside big.img it would be warned about as well (several cards that do not
        # fit together: tests/store/test_card_space.py).
        ADPConnector(card=os.path.join(shm, "alone", "small.img"), card_size_gb=0.0625, num_workers=1).close()
        assert not [r for r in records if r.levelno >= logging.WARNING]
        # Through a link on another filesystem (/tmp): the image's filesystem counts, not the link's directory's
        # (review r12 N3), where a disk with room hid the small tmpfs.
        link = tempfile.mktemp(prefix="adp-space-link-", dir="/tmp")
        os.symlink(os.path.join(shm, "big.img"), link)
        try:
            if shutil.disk_usage("/tmp").free > (too_big + 1) * (1 << 30):  # else the link's side warns as well
                records.clear()
                ADPConnector(card=link, num_workers=1).close()
                warned = [r.getMessage() for r in records if r.levelno == logging.WARNING]
                assert len(warned) == 1 and "but its filesystem has" in warned[0], warned
        finally:
            os.unlink(link)
    finally:
        logging.getLogger("lmcache_adp").removeHandler(handler)
        shutil.rmtree(shm, ignore_errors=True)


# A start that fails in the native part after the card image was made: the connector's eventfd, the descriptor it
# takes after the card's, is refused (EMFILE) under a descriptor limit that leaves exactly one free.
LATE_FAILURE = r"""
import os, resource, sys
from lmcache_adp import ADPConnector
card, size = sys.argv[1], float(sys.argv[2])
lowest = os.dup(0)  # the lowest free descriptor: every one below it is in use
os.close(lowest)
resource.setrlimit(resource.RLIMIT_NOFILE, (lowest + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    ADPConnector(card=card, num_workers=1, **({"card_size_gb": size} if size else {})).close()
    print("started")
except RuntimeError as e:
    print(e)
"""


def test_a_failed_start_removes_only_the_image_it_created(tmp_path):
    """An embedded connector whose start failed after it created its image left the image behind, so the next
    start found an existing card and ignored the size it was given (the gateway already removed its own: audit
    12, finding 9). Now the image goes with the failed start, logged; an image that was there is never removed,
    byte for byte. (metrics_port in use, a failure in Python after the start: tests/ops/test_metrics.py.)"""
    card = tmp_path / "cards" / "card.img"

    def start(size: float) -> subprocess.CompletedProcess:
        env = {**os.environ, "ADP_LOG_LEVEL": "INFO"}
        r = subprocess.run(
            [sys.executable, "-c", LATE_FAILURE, str(card), str(size)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert r.returncode == 0 and "eventfd failed: Too many open files" in r.stdout, (r.stdout, r.stderr[-2000:])
        return r

    r = start(0.0625)
    assert f"created card image {card}" in r.stderr, r.stderr  # made, then the start failed
    assert f"removed the card image {card} this start had created" in r.stderr, r.stderr
    assert not card.exists()
    CardStore(str(card), 64 << 20).close()
    before = card.read_bytes()[:4096]
    r = start(0.125)  # an existing card (another size asked for): the start fails the same way, the card stays
    assert card.exists() and card.read_bytes()[:4096] == before and "removed" not in r.stderr, r.stderr
    r = start(0)
    assert card.exists() and card.read_bytes()[:4096] == before and "removed" not in r.stderr, r.stderr


def test_a_size_an_existing_card_ignores_is_warned_about(card):
    """card_size_gb applies only when the image is created: a new size for an existing card was ignored without
    a word (the operator believed the card had grown; audit 12). The gateway's --card-size-gb: tests/gateway."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # the package's logger does not propagate: listen on it
    logging.getLogger("lmcache_adp").addHandler(handler)
    try:

        def warnings_of(**params) -> list[str]:
            records.clear()
            ADPConnector(card=card, num_workers=1, **params).close()
            return [r.getMessage() for r in records if r.levelno >= logging.WARNING]

        assert warnings_of(card_size_gb=0.0625) == []  # created with it
        assert warnings_of(card_size_gb=0.0625) == [] and warnings_of() == []  # the same size, or none given
        (said,) = warnings_of(card_size_gb=0.125)
        assert said.startswith(
            f"adapter_params['card_size_gb'] = 0.125 ignored: card image {card} exists with 64.00 MiB"
        )
        assert os.path.getsize(card) == 64 << 20
    finally:
        logging.getLogger("lmcache_adp").removeHandler(handler)
