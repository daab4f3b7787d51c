# SPDX-License-Identifier: Apache-2.0
"""Clients that hung up before their HelloOk (audit 13 item 7): a stopped gateway's listen backlog fills with
connects that sent their Hello and gave up; resumed, the gateway accepted them all at once and logged two INFO lines
each ("client #N connected (tcp ?, ...)", "gone after 0 batches": 90 lines in a second in the audit). Each is now a
DEBUG line, with one INFO count line. Gone means a full hang-up: a client that shut down only its sending side
(test_hostile_input's raw exchanges) still gets its HelloOk and its replies (session 13's d7b3922 closed on it)."""

from __future__ import annotations

import re
import select
import socket
import threading
import time

import pytest

from lmcache_adp import ADPConnector
from tests.gateway import wire
from tests.gateway.test_hostile_input import exchange
from tests.helpers import RawConnector, eventually
from tests.support.gateway import TOKEN, Gateway

COUNT_LINE = re.compile(r" INFO: gateway: (\d+) clients? gone before (?:its|their) handshake in the last \d+ s")


def frames(reply: bytes) -> list[tuple[int, int]]:
    """(type, request id) of each frame in a reply stream."""
    out = []
    while reply:
        ftype, n, rid = wire.parse_header(reply)
        out.append((ftype, rid))
        reply = reply[wire.HEADER.size + n :]
    return out


def client_lines(log: str, level: str) -> list[str]:
    return [line for line in log.splitlines() if f" {level}: gateway: client #" in line]


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_stopped_gateways_backlog_of_given_up_connects_logs_one_count_line(workdir, transport):
    """K connectors send their batches to a stopped gateway (each connect queues in the listen backlog, sends its
    Hello and gives up at the batch's 300 ms) and close; a raw client queued beside them sends its Hello and a
    batch and shuts down its sending side. Resumed, the gateway logs each given-up connect at DEBUG and one INFO
    count line for them all, not a connected / gone pair each; the half-closed client gets its HelloOk and its reply
    and is logged as any client. Failed before the fix: 2 INFO lines per given-up connect (e.g. 12 "connected (tcp
    ?, ...)" / "gone after 0 batches" for the 6 connectors' 12 connects over TCP) and no count line."""
    gw = Gateway(workdir, tcp=True).start(env={"ADP_LOG_LEVEL": "DEBUG"})
    tcp = transport == "tcp"
    k = 6
    raw: list[bytes] = []
    try:
        gw.pause()
        url, params = (gw.tcp_url, {"token_file": gw.token_file}) if tcp else (gw.unix_url, {})
        conns = [RawConnector(ADPConnector(gateway=url, num_workers=1, timeout_ms=300, **params)) for _ in range(k)]
        hello = wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode() if tcp else b""))
        half = threading.Thread(
            target=lambda: raw.append(
                exchange(gw, hello + wire.frame(wire.BATCH, 2, wire.batch(wire.EXISTS, [b"k"])), tcp, half_close=True)
            )
        )
        half.start()
        for c in conns:
            ok, _, _ = c.exists(["k"])
            assert not ok  # the gateway is stopped
        for c in conns:
            c.conn.close()
        gw.resume()
        half.join(60)
        assert raw and frames(raw[0]) == [(wire.HELLO_OK, 1), (wire.BATCH_REPLY, 2)], raw

        def settled() -> bool:
            log = gw.log()
            gone = log.count("hung up before its HelloOk")
            return gone >= k and sum(int(n) for n in COUNT_LINE.findall(log)) == gone

        assert eventually(settled), gw.log()
        log = gw.log()
        assert all(" DEBUG: " in line for line in log.splitlines() if "hung up before its HelloOk" in line)
        # The half-closed client's pair, and nothing else at INFO about a client.
        info = client_lines(log, "INFO")
        assert len(info) == 2 and "connected (" in info[0] and "gone after 1 batches" in info[1], info
        # One count line for the burst (two if it was accepted over more than the gateway's 1 s gathering).
        assert "tcp ?" not in log and len(COUNT_LINE.findall(log)) <= 2, log
    finally:
        gw.resume()
        assert gw.stop() == 0


def connect_hello_half_closed(gw: Gateway, tcp: bool) -> socket.socket:
    """A client that sent its Hello and shut down its sending side while the gateway was stopped (so its end of
    the stream is there when the gateway reads the Hello), the gateway resumed."""
    gw.pause()
    s = socket.create_connection(("127.0.0.1", gw.port)) if tcp else socket.socket(socket.AF_UNIX)
    s.settimeout(60)
    if not tcp:
        s.connect(gw.socket)
    s.sendall(wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode() if tcp else b"")))
    s.shutdown(socket.SHUT_WR)
    gw.resume()
    return s


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_client_that_shut_down_its_sending_side_after_its_hello_gets_its_hello_ok(workdir, transport):
    """Hello, then shutdown(SHUT_WR), and no request: the client is still there (it reads), so it gets its HelloOk
    and is logged connected and gone at INFO, as any client, once the gateway has waited 200 ms for a hang-up that
    does not come; no count line (d7b3922 took such a client for gone)."""
    gw = Gateway(workdir, tcp=True).start()
    tcp = transport == "tcp"
    try:
        with connect_hello_half_closed(gw, tcp) as s:
            start = time.monotonic()
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
            took = time.monotonic() - start
        assert frames(reply) == [(wire.HELLO_OK, 1)], reply
        assert eventually(lambda: "gone after 0 batches" in gw.log()), gw.log()
        info = client_lines(gw.log(), "INFO")
        assert len(info) == 2 and "connected (" + ("tcp 127.0.0.1" if tcp else "unix pid") in info[0], info
        assert not COUNT_LINE.search(gw.log())
        assert took < 5, took  # 200 ms for the hang-up, not a timeout
    finally:
        assert gw.stop() == 0


@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_a_half_closed_client_that_hangs_up_after_its_hello_ok_was_sent_is_gone_before_it(workdir, transport):
    """Over a network a TCP client that had closed fully looks like one that shut down its sending side until it
    answers the HelloOk with a reset, a round trip later. Stood in for by a half-closed client that closes 300 ms
    after its HelloOk arrived, unread (a reset over TCP), with the gateway's wait for it raised to 5 s: logged at
    DEBUG and counted, no INFO pair. Failed with that wait left out (hung_up(0)): "client #1 connected (...)" /
    "gone after 0 batches"."""
    gw = Gateway(workdir, tcp=True).start(env={"ADP_LOG_LEVEL": "DEBUG", "ADP_TEST_HANG_UP_WAIT_MS": 5000})
    try:
        with connect_hello_half_closed(gw, transport == "tcp") as s:
            p = select.poll()
            p.register(s, select.POLLIN)
            assert p.poll(30000)  # the HelloOk is there, unread
            time.sleep(0.3)
        assert eventually(lambda: COUNT_LINE.search(gw.log())), gw.log()
        assert "gateway: 1 client gone before its handshake" in gw.log()
        assert client_lines(gw.log(), "INFO") == [] and len(client_lines(gw.log(), "DEBUG")) == 1, gw.log()
    finally:
        assert gw.stop() == 0
