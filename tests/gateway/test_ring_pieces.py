# SPDX-License-Identifier: Apache-2.0
"""Loads through the ring in pieces (protocol r4, docs/protocol.md "Ring
progress"): on a memory-speed card the gateway publishes each piece of a get
in the ring's control page as it lands, and the client copies it into
LMCache's buffer while the next one is read. The unhappy paths: a client that
stops reading mid-object, a gateway that dies mid-object, a deadline during a
piece, a gateway that publishes progress past an item's end."""

from __future__ import annotations

import mmap
import os
import shutil
import socket
import struct
import tempfile
import threading
import time

import pytest

from lmcache_adp import ADPConnector
from lmcache_adp._native import FEATURE_RING, FEATURE_RING_PROGRESS, FEATURE_SEGMENTS
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway import wire
from tests.helpers import RawConnector, eventually, payload
from tests.support import cpp
from tests.support.gateway import Gateway

MIB = 1 << 20
CONTROL = 4096  # the ring's control page (r3/r4)
TICKET_AT, SLOTS_AT = 64, 128
TIMED_OUT = 6  # Status::Code::kTimedOut on the wire (src_cpp/util/status.h)


def tmpfs_gateway(monkeypatch, piece_delay_ms: int = 0) -> tuple[str, Gateway]:
    """A gateway on a tmpfs card (memory-speed: r4 is granted); with a delay,
    it sleeps that long before each piece it reads into a ring."""
    d = tempfile.mkdtemp(prefix="adppc-", dir="/dev/shm")
    if piece_delay_ms:
        monkeypatch.setenv("ADP_TEST_RING_PIECE_DELAY_MS", str(piece_delay_ms))
    gw = Gateway(d).start()
    monkeypatch.delenv("ADP_TEST_RING_PIECE_DELAY_MS", raising=False)
    return d, gw


@pytest.fixture
def fast_gateway(monkeypatch):
    d, gw = tmpfs_gateway(monkeypatch)
    yield gw
    if gw.proc:
        gw.kill()
    shutil.rmtree(d, ignore_errors=True)


def store(gw: Gateway, keys: list[str], sizes: list[int]) -> None:
    w = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=2, timeout_ms=20000))
    assert w.set(keys, [memoryview(payload(k, s)) for k, s in zip(keys, sizes, strict=True)])[0]
    w.conn.close()


@pytest.mark.parametrize("pieces", [True, False])
def test_loads_in_pieces_deliver_whole_objects_and_leave_misses_untouched(fast_gateway, pieces):
    gw = fast_gateway
    # Sizes across piece boundaries (1 MiB pieces) and an odd tail.
    sizes = [3 * MIB + 123, 64 << 10, 1 * MIB, 2 * MIB + 4096]
    keys = [f"pc@{i}" for i in range(len(sizes))]
    store(gw, keys, sizes)
    c = RawConnector(
        ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000, ring_pieces=pieces, process_memory=False)
    )
    try:
        # A miss between the hits: its buffer must be left as it was.
        order = [keys[0], "pc@missing", *keys[1:]]
        outs = [bytearray(b"\x5a" * s) for s in [sizes[0], MIB, *sizes[1:]]]
        ok, _, per_key = c.get(order, [memoryview(o) for o in outs])
        assert ok and per_key == [True, False, True, True, True]
        assert bytes(outs[1]) == b"\x5a" * MIB
        for k, o in zip(keys, [outs[0], *outs[2:]], strict=True):
            assert bytes(o) == payload(k, len(o))
        assert (read_gateway_stats(gw.unix_url)["ring_piece_loads"] > 0) == pieces
    finally:
        c.conn.close()


class RawClient(wire.RingClient):
    """A hand-driven ring connection asking for ring progress."""

    def __init__(self, gw: Gateway, ring_bytes: int = 16 * MIB, features: int = FEATURE_RING | FEATURE_RING_PROGRESS):
        super().__init__(gw.socket, features, ring_bytes)

    def slot(self, i: int) -> int:
        return struct.unpack_from("<I", self.map, SLOTS_AT + 4 * i)[0]


def test_client_that_stops_reading_mid_object(monkeypatch):
    """A client asks for an object in pieces, then reads neither the ring nor
    the socket. The gateway does not wait on it: it publishes every piece,
    replies, and serves everyone else meanwhile."""
    d, gw = tmpfs_gateway(monkeypatch, piece_delay_ms=100)
    try:
        size = 4 * MIB + 100
        store(gw, ["idle@obj", "bystander"], [size, 64 << 10])
        c = RawClient(gw)
        assert c.features & FEATURE_RING_PROGRESS
        c.send(wire.BATCH, wire.batch(wire.GET, [b"idle@obj"], [size], [CONTROL]))
        time.sleep(0.25)  # the gateway is part way through the object; the client reads nothing from here on
        by = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000, process_memory=False))
        out = bytearray(64 << 10)
        assert by.get(["bystander"], [memoryview(out)])[2] == [True] and bytes(out) == payload("bystander", len(out))
        assert by.set(["bystander2"], [memoryview(out)])[0]
        by.conn.close()
        # The reply was sent while the client read nothing; every piece was published.
        ftype, body = c.recv()
        assert ftype == wire.BATCH_REPLY
        assert struct.unpack_from("<IIBBHIQ", body)[2] == 0  # ok
        assert c.slot(0) == size
        assert struct.unpack_from("<I", c.map, TICKET_AT)[0] >= 5  # 5 pieces, then the reply
        assert c.map[CONTROL : CONTROL + size] == payload("idle@obj", size)
        c.close()
        assert gw.proc.poll() is None
    finally:
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_client_without_the_feature_gets_the_whole_object_and_no_progress(fast_gateway):
    """An r3 client (no ring-progress bit) on an r4 gateway: not granted, nothing written into the
    control page but the alive word (r7), the object at its offset in the ring once the reply came."""
    gw = fast_gateway
    size = 3 * MIB + 5
    store(gw, ["old@obj"], [size])
    c = RawClient(gw, features=FEATURE_RING | FEATURE_SEGMENTS)
    try:
        assert c.features == FEATURE_RING | FEATURE_SEGMENTS
        c.send(wire.BATCH, wire.batch(wire.GET, [b"old@obj"], [size], [CONTROL]))
        ftype, body = c.recv()
        assert ftype == wire.BATCH_REPLY and struct.unpack_from("<IIBBHIQ", body)[2] == 0
        # No ticket, no slot; the alive word at 72 (r7, any control page) is bumped after the item.
        assert c.map[8:72] == b"\0" * 64 and c.map[76:CONTROL] == b"\0" * (CONTROL - 76)
        assert c.map[CONTROL : CONTROL + size] == payload("old@obj", size)
    finally:
        c.close()


def test_gateway_that_dies_mid_object_fails_the_load_at_once(monkeypatch):
    """The gateway is killed while it reads an object in pieces: the client,
    waiting on the next piece, finds the socket closed and fails the future
    then, not at its deadline (20 s)."""
    d, gw = tmpfs_gateway(monkeypatch, piece_delay_ms=150)
    try:
        size = 8 * MIB
        store(gw, ["dies@obj"], [size])
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000, process_memory=False))
        out = bytearray(size)
        fid = c.conn.submit_batch_get(["dies@obj"], [memoryview(out)])
        time.sleep(0.5)  # a few pieces in
        gw.kill()
        ok, err, per_key = c.wait(fid, timeout=15)
        assert not ok and per_key == [False]
        assert "timed out" not in err, err
        c.conn.close()
    finally:
        if gw.proc:
            gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_no_piece_copied_after_the_deadline(monkeypatch):
    """The deadline passes while the gateway is still publishing pieces the client has not copied yet
    (each delivery into the buffer takes 150 ms, the gateway publishes a piece every 100 ms): the future
    fails, and the pieces published but not copied by then never reach the buffer. Fails when the client
    copies after its deadline outside the guard (both of its protections out, each alone: see
    test_session_and_connector_each_keep_late_pieces_out); the gateway's own deadline has its test below.
    The deadline (1 s) is the load's alone (connected before it): the first piece has ~0.75 s of room, and the
    last is not published before 1.2 s (twelve pieces of 100 ms). It was 500 ms with a piece every 50 ms, a connect
    inside it: 300 ms of room for the connect and the first piece, and a connect took 350 ms on a loaded CI host
    (session 13)."""
    d, gw = tmpfs_gateway(monkeypatch, piece_delay_ms=100)
    try:
        size = 12 * MIB
        store(gw, ["deadline@obj"], [size])
        monkeypatch.setenv("ADP_TEST_DELIVERY_DELAY_MS", "150")  # read by the connector at construction
        c = RawConnector(
            ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=1000, ring_mb=32, process_memory=False)
        )
        monkeypatch.delenv("ADP_TEST_DELIVERY_DELAY_MS")
        assert eventually(lambda: c.exists(["deadline@warm-up"])[0]), "the gateway answers a lookup"
        out = bytearray(b"\x11" * size)
        ok, _, per_key = c.get(["deadline@obj"], [memoryview(out)])
        assert not ok and per_key == [False]
        at_completion = bytes(out)
        assert at_completion[0:MIB] == payload("deadline@obj", size)[0:MIB]  # the first pieces came
        assert at_completion[-MIB:] == b"\x11" * MIB  # the last had not
        time.sleep(0.1 * 12 + 0.5)  # the gateway has published every piece it would by now
        assert bytes(out) == at_completion, "bytes landed after the future failed"
        c.conn.close()
        assert gw.proc.poll() is None
    finally:
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_gateway_publishes_no_piece_past_the_request_deadline(monkeypatch):
    """The gateway's own protection, alone (a client that reads nothing): once the request's deadline
    (timeout_ms) has passed it starts no piece, writes nothing more into the ring and answers the item
    TimedOut. Fails when the gateway goes on reading pieces past the deadline."""
    d, gw = tmpfs_gateway(monkeypatch, piece_delay_ms=100)
    try:
        size = 12 * MIB  # 1.2 s of pieces against a 0.5 s deadline
        store(gw, ["late@obj"], [size])
        c = RawClient(gw, ring_bytes=16 * MIB)
        c.map[CONTROL : CONTROL + size] = b"\xee" * size
        c.send(wire.BATCH, wire.batch(wire.GET, [b"late@obj"], [size], [CONTROL], timeout_ms=500))
        ftype, body = c.recv()
        assert ftype == wire.BATCH_REPLY
        code, _, msg_len, _, _ = struct.unpack_from("<BBHIQ", body, 8)
        assert code == TIMED_OUT, f"item answered code {code}, not TimedOut: {body[24 : 24 + msg_len]!r}"
        time.sleep(0.1 * 12 - 0.5 + 0.3)  # until the gateway would have read the whole object
        published = c.slot(0)
        assert 0 < published < size
        assert c.map[CONTROL : CONTROL + published] == payload("late@obj", size)[:published]
        assert c.map[CONTROL + published : CONTROL + size] == b"\xee" * (size - published), "written past the slot"
        c.close()
        assert gw.proc.poll() is None
    finally:
        gw.kill()
        shutil.rmtree(d, ignore_errors=True)


def fake_gateway(
    path: str,
    slot_values,
    every: float = 0.2,
    done: threading.Event | None = None,
    greeted: threading.Event | None = None,
) -> socket.socket:
    """A gateway double that grants r4, takes one get and publishes slot 0 =
    each of slot_values(size) in turn (bumping the ticket, `every` seconds
    apart), never replying, whatever the request's deadline; sets `greeted`
    once its HelloOk is sent and `done` after the last piece."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 1)
            ring_bytes = struct.unpack_from("<IIQ", data, wire.HEADER.size)[2]
            ring = mmap.mmap(fds[0], ring_bytes)
            name = b"fake"
            ok = struct.pack("<IIQQII", FEATURE_RING | FEATURE_RING_PROGRESS, 4096, 256 << 20, 64 << 20, len(name), 0)
            conn.sendall(wire.frame(wire.HELLO_OK, 1, ok + name))
            if greeted:
                greeted.set()
            _, n, _ = wire.parse_header(conn.recv(wire.HEADER.size, socket.MSG_WAITALL))
            body = conn.recv(n, socket.MSG_WAITALL)
            _, _, _, size, offset = struct.unpack_from("<HHIQQ", body, 16)
            for ticket, v in enumerate(slot_values(size), 1):
                ring[offset : offset + v] = b"\x77" * v  # the piece, then its slot
                struct.pack_into("<I", ring, SLOTS_AT, v)
                struct.pack_into("<I", ring, TICKET_AT, ticket)
                time.sleep(every)
            if done:
                done.set()
            conn.recv(1)  # until the client hangs up
            ring.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv


BAD_PROGRESS = {
    "past the end": lambda size: [size + 4096],
    "going back": lambda size: [size // 2, size // 4],
}


@pytest.mark.parametrize("bad", sorted(BAD_PROGRESS))
def test_progress_outside_an_item_is_rejected(workdir, bad):
    """A gateway that publishes a slot past its item's end, or lowers one:
    the client fails that load (and drops the connection) and copies nothing
    outside the buffer."""
    path = os.path.join(workdir, "fake.sock")
    size = 256 << 10
    srv = fake_gateway(path, BAD_PROGRESS[bad])
    try:
        c = RawConnector(ADPConnector(gateway=f"unix://{path}", num_workers=1, timeout_ms=5000, ring_mb=1))
        out = bytearray(b"\x11" * size + b"\x22" * 8192)
        ok, err, per_key = c.get(["k"], [memoryview(out)[:size]])
        assert not ok and per_key == [False]
        assert "gateway published progress outside item 0" in err, err
        assert bytes(out[size:]) == b"\x22" * 8192  # nothing past the buffer
        c.conn.close()
    finally:
        srv.close()


def test_no_piece_copied_after_the_deadline_whatever_the_gateway_publishes(workdir, monkeypatch):
    """A gateway (double) that goes on publishing pieces after the request's deadline, every 20 ms for
    1 s, while each delivery into the buffer takes 50 ms (so the client always finds a piece waiting
    and never idles): once the future failed, none of them reaches the buffer. Fails when the client
    copies after its deadline outside the guard; each of those two protections alone is
    test_session_and_connector_each_keep_late_pieces_out's. The deadline (600 ms) is the load's alone: the
    connector's start-up connect has had its HelloOk before the load is sent (a connect inside a short deadline
    took 350 ms on a loaded CI host, session 13), so the first piece has ~0.5 s of room, and the last one is not
    published before ~1 s."""
    path = os.path.join(workdir, "fake.sock")
    pieces, piece = 50, 4096
    size = pieces * piece
    published, greeted = threading.Event(), threading.Event()
    srv = fake_gateway(
        path, lambda size: [piece * i for i in range(1, pieces + 1)], every=0.02, done=published, greeted=greeted
    )
    try:
        monkeypatch.setenv("ADP_TEST_DELIVERY_DELAY_MS", "50")  # read by the connector at construction
        c = RawConnector(ADPConnector(gateway=f"unix://{path}", num_workers=1, timeout_ms=600, ring_mb=1))
        monkeypatch.delenv("ADP_TEST_DELIVERY_DELAY_MS")
        assert greeted.wait(10), "the connector did not connect at its start"
        out = bytearray(b"\x11" * size)
        ok, _, per_key = c.get(["k"], [memoryview(out)])
        assert not ok and per_key == [False]
        at_completion = bytes(out)
        assert at_completion[:piece] == b"\x77" * piece  # the first piece came
        assert at_completion[-piece:] == b"\x11" * piece  # the last had not
        assert published.wait(10)  # the double has published the whole object
        time.sleep(0.1)  # the client's last look at the ring
        assert bytes(out) == at_completion, "bytes landed after the future failed"
        c.conn.close()
    finally:
        srv.close()


def test_session_and_connector_each_keep_late_pieces_out(tmp_path):
    """The two client-side protections against pieces published after the deadline, each on its own
    (tests/cpp/ring_deadline_test.cc): the session's check of the deadline before each piece, against a
    gateway double that always has the next piece waiting, with a delivery that accepts everything; and
    the connector declining deliveries after the future completed, with a session that delivers a piece
    every 20 ms whatever the deadline."""
    dirs = ("store", "util", "testing", "connector", "transport", "protocol")
    output = cpp.run(cpp.build("ring_deadline_test", tmp_path, dirs), str(tmp_path), timeout=120)
    assert "0 after the deadline" in output and "declined after" in output


def test_a_batch_as_large_as_the_ring_goes_in_one_round_trip(fast_gateway):
    """r12: the ring's payload area is ring_mb exactly, its control page beside it (the connector maps one page
    more): a worker's batch of two ring_mb / 2 objects is one request to the gateway, for a store and for a load.
    Before r12 the control page took the ring's first 4 KiB, so the second object went in a second round trip
    (two 32 MiB objects in the default 64 MiB ring), and an object of ring_mb, which ring_mb is documented to
    bound, failed as "larger than the ring (raise ring_mb)". The gateway counts the payload area in its
    ring_bytes."""
    gw = fast_gateway
    c = RawConnector(
        ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000, ring_mb=2, process_memory=False)
    )
    try:
        keys = ["round@0", "round@1"]
        assert c.exists(["round@warm-up"])[0]  # connected, its ring mapped
        before = read_gateway_stats(gw.unix_url)
        assert before["ring_bytes"] == 2 * MIB  # the payload area; the control page is not counted
        assert c.set(keys, [memoryview(payload(k, MIB)) for k in keys])[0]
        outs = [bytearray(MIB) for _ in keys]
        ok, _, per_key = c.get(keys, [memoryview(o) for o in outs])
        assert ok and per_key == [True, True]
        assert [bytes(o) for o in outs] == [payload(k, MIB) for k in keys]
        after = read_gateway_stats(gw.unix_url)
        assert after["ring_piece_loads"] - before["ring_piece_loads"] == 2  # the control page was in use
        assert (after["batch_puts"] - before["batch_puts"], after["batch_gets"] - before["batch_gets"]) == (1, 1)
        whole = payload("round@whole", 2 * MIB)  # as large as the ring
        ok, err, _ = c.set(["round@whole"], [memoryview(whole)])
        assert ok, err
        out = bytearray(2 * MIB)
        assert c.get(["round@whole"], [memoryview(out)])[2] == [True] and bytes(out) == whole
    finally:
        c.conn.close()
