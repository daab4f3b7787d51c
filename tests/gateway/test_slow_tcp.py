# SPDX-License-Identifier: Apache-2.0
"""A frame's pace over TCP (session 31, brief slowtcp31; docs/protocol.md "Timing of a frame"): once a frame's
first byte came (or went), the byte after its first `done` is due within 10 s + done / 1 MiB/s. Until then the
whole rest of a frame had to come within 10 s, so a live TCP peer on a slow link (a 32 MiB object at 2.5 MB/s takes
13 s) had its put or its load cut and its connection dropped. The defence stays: a peer that trickles (a few bytes
a second) is cut after about 10 s, whichever side it is on, with a logged reason saying how far the frame got.

The link is tests/support/throttle_proxy.py: its token buckets are the rates these tests rely on, with a margin of
2x or more either way (a slow peer at 2 MiB/s, twice the rule's 1 MiB/s; a trickler at a few bytes a second,
against a rule that cuts at 10 s and a bound checked at twice that).

Session 32 (brief gwedge32): the idle limit (--idle-timeout-s) waits for a next frame's first byte only, so a frame
that takes longer than it to arrive is served (its pace governs it), and a reply cut part-way is followed by no
Error frame (its bytes would land inside the frame the client is reading)."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

from lmcache_adp import ADPConnector
from tests.gateway import wire
from tests.gateway.test_hostile_input import error_reason
from tests.helpers import RawConnector, eventually, payload
from tests.support.gateway import TOKEN, Gateway
from tests.support.throttle_proxy import ThrottleProxy

MIB = 1 << 20
FRAME_TIMEOUT_S = 10  # proto::kFrameTimeout
RULE_RATE = MIB  # proto::kFrameMinBytesPerSecond
LINK_RATE = 2 * MIB  # a slow live link: twice the rule's rate
# An object whose frame takes 12 s at LINK_RATE: past the 10 s that cut it before (the shortest such test), well
# inside the 10 s + 24 s the pace allows it.
SIZE = 24 * MIB
TRICKLE = 4  # bytes a second: a slowloris peer
TIMEOUT_MS = 120_000  # the batches' own deadline: never what ends them here


def connector(url: str, gw: Gateway) -> RawConnector:
    return RawConnector(ADPConnector(gateway=url, token_file=gw.token_file, num_workers=1, timeout_ms=TIMEOUT_MS))


@pytest.mark.slow
def test_a_slow_live_peer_puts_and_loads_objects_that_take_longer_than_10_s(gateway, capfd):
    """A put and a load, each one frame of SIZE bytes at LINK_RATE (about 12 s), at once on two connections: both
    succeed and the bytes are the object's. Red before session 31: the put was cut by the gateway ("frame not
    completed within 10000 ms") and the load by the connector's read of the reply ("gateway did not answer in
    time", 10 s after the reply's first byte). Nor does the connector read the gateway as stalled meanwhile
    (gateway_stall_s, 5 s): the bytes of a frame moving are heard from it (red before: "a request waited 5000 ms with
    nothing heard from the gateway" while the reply came at 2 MiB/s). The put's side is the one that needs a
    request's bytes heard: since session 32 only those its socket takes once it was full count (with none counted
    the putter logs that line: checked then with a local build, reverted)."""
    gw = gateway
    with ThrottleProxy(gw.port) as proxy:
        putter, loader = connector(proxy.url, gw), connector(proxy.url, gw)
        try:
            stored, fresh = "m@slow@0@1", "m@slow@0@2"
            ok, why, _ = loader.set([stored], [memoryview(payload(stored, SIZE))])  # at full speed
            assert ok, why
            proxy.set_rates(LINK_RATE, LINK_RATE)
            put: list = []
            t = threading.Thread(target=lambda: put.append(putter.set([fresh], [memoryview(payload(fresh, SIZE))])))
            start = time.monotonic()
            t.start()
            out = bytearray(SIZE)
            ok, why, hits = loader.get([stored], [memoryview(out)])
            assert ok and hits == [True], why
            assert out == payload(stored, SIZE)
            t.join(TIMEOUT_MS / 1000)
            elapsed = time.monotonic() - start
            ok, why, _ = put[0]
            assert ok, why
            # The test's premise, measured at the proxy: each frame's bytes went at the link's rate, for longer
            # than the old whole-frame limit.
            spans = sorted((f.snapshot() for link in proxy.links for f in link), reverse=True)[:2]
            for moved, span in spans:
                assert moved >= SIZE and span > FRAME_TIMEOUT_S, (spans, elapsed)
                assert moved / span < 1.1 * LINK_RATE, spans
            proxy.set_rates(None, None)
            out = bytearray(SIZE)
            ok, why, hits = loader.get([fresh], [memoryview(out)])
            assert ok and hits == [True], why
            assert out == payload(fresh, SIZE)
        finally:
            putter.conn.close()
            loader.conn.close()
    assert "frame not" not in gw.log()
    assert "nothing heard from the gateway" not in capfd.readouterr().err


def rule_bound(done: int) -> float:
    """When the pace cuts a frame whose first `done` bytes went (from its first byte)."""
    return FRAME_TIMEOUT_S + done / RULE_RATE


def cut_in_bound(took: float, done: int) -> bool:
    """Whether a cut logged at `took` s (to 0.1 s) after its frame's first byte, `done` bytes along, was the pace's:
    not before it (a live peer's time taken away), not later than twice it."""
    return rule_bound(done) - 0.05 <= took < 2 * rule_bound(done)


@pytest.mark.slow
@pytest.mark.parametrize("idle_s", [None, 2], ids=["idle-default", "idle-2s"])
def test_a_trickling_client_is_cut_within_the_pace(workdir, idle_s):
    """A client that sends its Batch frame at TRICKLE bytes a second is cut by the gateway once behind the pace:
    about 10 s after the frame's first byte (not before, not later than twice the bound), with an Error frame and
    a WARNING saying which frame and how far it got. Red before session 31 by the reason: "frame not completed
    within 10000 ms" said neither. With --idle-timeout-s 2 (session 32), the same: a frame begun is held to its
    pace, not to the idle limit; red before by the cut, 2 s after the Hello, logged "idle for 2 s" with no Error
    frame."""
    gw = Gateway(workdir, tcp=True, extra=("--idle-timeout-s", str(idle_s)) if idle_s else ()).start()
    try:
        with ThrottleProxy(gw.port) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as s:
            s.settimeout(120)  # a guard against a hang only
            s.sendall(wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode())))
            assert wire.recv_frame(s)[0] == wire.HELLO_OK
            proxy.set_rates(TRICKLE, None)
            body = wire.batch(wire.PUT, [b"k"], [4096], [0], b"x" * 4096)
            start = time.monotonic()
            threading.Thread(target=lambda: s.sendall(wire.frame(wire.BATCH, 2, body)), daemon=True).start()
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
            elapsed = time.monotonic() - start
    finally:
        assert gw.stop() == 0
    assert reply, gw.log()  # (before session 32, with the idle limit: closed 2 s in, no Error frame)
    reason = error_reason(reply)
    line = re.search(
        r"client #\d+ \(tcp 127\.0\.0\.1\): frame not completed: (\d+) of (\d+) bytes of a Batch frame \(request 2\) "
        r"in ([\d.]+) s \(a frame's rest is due within 10 s \+ 1 s/MiB: peer stalled or too slow\); closing the "
        r"connection",
        gw.log(),
    )
    assert line, gw.log()
    done, total, took = int(line[1]), int(line[2]), float(line[3])
    assert total == wire.HEADER.size + len(body) and 0 < done < total
    assert cut_in_bound(took, done), line[0]
    assert FRAME_TIMEOUT_S <= elapsed < 2 * rule_bound(done) + 1, elapsed
    assert reason.startswith(f"frame not completed: {done} of {total} bytes of a Batch frame (request 2)"), reason


@pytest.mark.slow
def test_a_connector_reading_a_reply_at_a_trickle_cuts_it_before_the_batch_deadline(gateway):
    """A connector's load whose reply reaches it at TRICKLE bytes a second: the connector's read of it is cut by its
    pace (about 10 s after the reply's first byte), long before the batch's deadline (TIMEOUT_MS), and the batch
    fails saying how far the reply got. Red before session 31 by the reason: "gateway did not answer in time"."""
    gw = gateway
    with ThrottleProxy(gw.port) as proxy:
        c = connector(proxy.url, gw)
        try:
            key = "m@slow@0@3"
            ok, why, _ = c.set([key], [memoryview(payload(key, SIZE))])
            assert ok, why
            proxy.set_rates(None, TRICKLE)
            start = time.monotonic()
            ok, why, _ = c.get([key], [memoryview(bytearray(SIZE))])
            elapsed = time.monotonic() - start
        finally:
            c.conn.close()
    assert not ok
    # (An Alive frame may come first: its 24 bytes take 6 s at the trickle, within its own pace.)
    mine = re.search(
        r"frame not completed: (\d+) of (?:the 24 bytes of a frame header|\d+ bytes of a BatchReply frame "
        r"\(request \d+\)) in ([\d.]+) s \(a frame's rest is due within 10 s \+ 1 s/MiB: peer stalled or too slow\)",
        why,
    )
    assert mine, why
    assert cut_in_bound(float(mine[2]), int(mine[1])), why
    assert elapsed < 2 * rule_bound(64) + 24 / TRICKLE, elapsed


@pytest.mark.slow
def test_a_client_that_reads_its_reply_at_a_trickle_is_cut_by_the_gateway(gateway):
    """A client (raw frames, over the proxy) whose load's reply it takes at TRICKLE bytes a second: the gateway's
    write of the reply is cut once behind the pace (10 s + what its socket took, at 1 MiB/s), logged with how much
    of which frame went. Red before session 31 by the reason: the gateway logged its own write's cut as "gateway
    did not answer in time", 10 s after the write began whatever had gone."""
    gw = gateway
    with ThrottleProxy(gw.port) as proxy, socket.create_connection(("127.0.0.1", proxy.port)) as s:
        s.settimeout(60)  # a guard against a hang only
        s.sendall(wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode())))
        assert wire.recv_frame(s)[0] == wire.HELLO_OK
        s.sendall(wire.frame(wire.BATCH, 2, wire.batch(wire.PUT, [b"k"], [SIZE], [0], b"y" * SIZE)))
        ftype, rid, body = wire.recv_frame(s)  # (no Alive frames: its Hello did not ask for them)
        assert (ftype, rid, body[8]) == (wire.BATCH_REPLY, 2, 0), (ftype, rid, body)  # the put's status: ok
        proxy.set_rates(None, TRICKLE)
        s.sendall(wire.frame(wire.BATCH, 3, wire.batch(wire.GET, [b"k"], [SIZE])))
        pattern = (
            r"frame not taken: (\d+) of (\d+) bytes of a BatchReply frame \(request 3\) in ([\d.]+) s \(a frame's "
            r"rest is due within 10 s \+ 1 s/MiB: peer not reading or too slow\); closing the connection"
        )
        assert eventually(lambda: re.search(pattern, gw.log()), 2 * rule_bound(SIZE)), gw.log()
    line = re.search(pattern, gw.log())
    sent, total, took = int(line[1]), int(line[2]), float(line[3])
    assert total > SIZE and 0 < sent < total
    assert cut_in_bound(took, sent), line[0]


IDLE_S = 2  # --idle-timeout-s of the idle test
# An object whose frame takes twice IDLE_S at LINK_RATE (4 s), far inside its pace (10 s + 8 s).
IDLE_SIZE = 2 * IDLE_S * LINK_RATE


@pytest.mark.slow
def test_a_frame_that_takes_longer_than_the_idle_limit_is_served(workdir):
    """--idle-timeout-s 2: a put whose one frame takes 4 s to arrive (its first byte at once, the rest at LINK_RATE:
    within its pace) is served and verifies, and so is a load whose reply takes 4 s to go; the connection, idle
    after them, is still closed at the limit. Red before session 32: the gateway awaited the whole request until the
    idle limit, so it closed the connection 2 s into the put's frame, logged as "idle for 2 s: closing the
    connection", and the put never completed (the wait for it gave up after 30 s: through the proxy, which stops
    forwarding once the gateway's side is closed, the connector's send of the rest stalled)."""
    gw = Gateway(workdir, tcp=True, extra=("--idle-timeout-s", str(IDLE_S))).start()
    try:
        with ThrottleProxy(gw.port) as proxy:
            c = connector(proxy.url, gw)
            try:
                key = "m@idle@0@1"
                proxy.set_rates(LINK_RATE, None)
                ok, why, _ = c.set([key], [memoryview(payload(key, IDLE_SIZE))])
                assert ok, why
                # The premise, measured at the proxy: the put's frame took longer than the idle limit to arrive.
                moved, span = max(up.snapshot() for up, _ in proxy.links)
                assert moved >= IDLE_SIZE and span > IDLE_S, (moved, span)
                proxy.set_rates(None, LINK_RATE)
                out = bytearray(IDLE_SIZE)
                ok, why, hits = c.get([key], [memoryview(out)])
                assert ok and hits == [True], why
                assert out == payload(key, IDLE_SIZE)
                moved, span = max(down.snapshot() for _, down in proxy.links)
                assert moved >= IDLE_SIZE and span > IDLE_S, (moved, span)
                # Idle from here: closed at the limit, as before.
                idle_line = f"idle for {IDLE_S} s: closing the connection"
                closed = gw.log().count(idle_line)
                assert eventually(lambda: gw.log().count(idle_line) > closed, 10 * IDLE_S), gw.log()
            finally:
                c.conn.close()
    finally:
        assert gw.stop() == 0
    assert "frame not" not in gw.log()


# A client reading a reply at an eighth of the pace's rate: cut after about 10 s / (1 - 1/8) plus what the sockets
# hold; it reads on meanwhile, so the gateway's socket has room for more (an Error frame's, before session 32) when
# the cut comes.
READ_RATE = RULE_RATE // 8
CUT_SIZE = 16 * MIB  # a reply that cannot go whole before the cut (about 2 MiB read by then, plus the sockets')


def reply_to(s: socket.socket, request_id: int) -> bytes:
    """The whole frame (header and body) the gateway sends next on s, read at full speed."""
    head = b""
    while len(head) < wire.HEADER.size:
        head += s.recv(wire.HEADER.size - len(head))
    _, n, rid = wire.parse_header(head)
    assert rid == request_id, rid
    body = bytearray()
    while len(body) < n:
        body += s.recv(n - len(body))
    return head + bytes(body)


@pytest.mark.slow
def test_a_reply_cut_part_way_is_followed_by_no_error_frame(gateway):
    """A client (raw frames, TCP, a small receive buffer) that takes its load's reply at READ_RATE is cut by the
    gateway once behind the pace (WARNING "frame not taken: D of T bytes of a BatchReply frame ..."); it then reads
    on at full speed to the end: it gets exactly the D bytes the gateway sent, the start of the reply the same load
    got at full speed, and then the connection's end. Red before session 32: refuse() sent its Error frame after the
    D bytes, into the reply the client was reading (the client got D bytes and then the Error frame's)."""
    gw = gateway
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # before connect: its window
        s.connect(("127.0.0.1", gw.port))
        s.settimeout(60)  # a guard against a hang only
        s.sendall(wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode())))
        assert wire.recv_frame(s)[0] == wire.HELLO_OK
        s.sendall(wire.frame(wire.BATCH, 2, wire.batch(wire.PUT, [b"k"], [CUT_SIZE], [0], b"y" * CUT_SIZE)))
        ftype, _, body = wire.recv_frame(s)
        assert (ftype, body[8]) == (wire.BATCH_REPLY, 0), body  # the put's status: ok
        s.sendall(wire.frame(wire.BATCH, 3, wire.batch(wire.GET, [b"k"], [CUT_SIZE])))
        whole = reply_to(s, 3)  # the reply at full speed: what the slow one's bytes must be the start of
        assert len(whole) > CUT_SIZE
        s.sendall(wire.frame(wire.BATCH, 4, wire.batch(wire.GET, [b"k"], [CUT_SIZE])))
        pattern = (
            r"frame not taken: (\d+) of (\d+) bytes of a BatchReply frame \(request 4\) in ([\d.]+) s \(a frame's "
            r"rest is due within 10 s \+ 1 s/MiB: peer not reading or too slow\); closing the connection"
        )
        got = bytearray()
        start = looked = time.monotonic()
        while True:  # at READ_RATE until the gateway says it cut the reply
            now = time.monotonic()
            if now - looked >= 0.1:
                looked = now
                if re.search(pattern, gw.log()):
                    break
                assert now - start < 2 * rule_bound(CUT_SIZE), gw.log()
            due = start + len(got) / READ_RATE
            if now < due:
                time.sleep(min(due - now, 0.05))
                continue
            chunk = s.recv(4096)
            if not chunk:  # the end before its line was read: the line is there by now
                break
            got += chunk
        while chunk := s.recv(1 << 20):  # the rest at full speed, to the connection's end
            got += chunk
    line = re.search(pattern, gw.log())
    assert line, gw.log()
    sent, total = int(line[1]), int(line[2])
    assert total == len(whole) and 0 < sent < total, line[0]
    tail = bytes(got[sent:])
    assert not tail, f"{len(tail)} bytes after the {sent} the gateway sent of its reply: {tail[:64]!r}..."
    # The same reply but its request id (the header's last 8 bytes): 4, not 3.
    expected = whole[: wire.HEADER.size - 8] + (4).to_bytes(8, "little") + whole[wire.HEADER.size : sent]
    assert len(got) == sent and bytes(got) == expected, "the bytes received are not the start of the reply"
