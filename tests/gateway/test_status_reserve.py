# SPDX-License-Identifier: Apache-2.0
"""Protocol r16 (brief gwreserve item 1): the status-query reserve of each transport is held briefly. Since r15 a TCP
status query admitted past --max-tcp-clients was closed once its first Stats was answered, or after
--handshake-timeout-ms without one; a local one past --max-clients (the reserve of r11) was served until
--idle-timeout-s, so two idle status clients that never closed kept an operator's `lmcache-adp status` out of a full
gateway. Now a local status query is within --max-clients while the local clients and the status queries within it
are fewer, and is then served as before, not counted at accept; past it, it is on the reserve and closed as over TCP.
Over TCP, a status query on the reserve was counted with the clients: once a client left, it held that client's slot
(a client refused "too many TCP clients" under --max-tcp-clients); it is counted apart now."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import time
from collections.abc import Iterator

import pytest

from lmcache_adp import ADPConnector, _native
from lmcache_adp.gateway_stats import GatewayError, read_gateway_stats
from tests.gateway import wire
from tests.gateway.test_limits import closed_by_gateway, roundtrip, tcp_hello
from tests.helpers import RawConnector
from tests.support.gateway import Gateway

FULL = "too many local clients (1, --max-clients)"


def local_hello(url: str, features: int) -> tuple[socket.socket, int, bytes]:
    """A local connection that sent its Hello (`features`), and the gateway's reply (type, body); the caller closes
    the socket."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(url.removeprefix("unix://"))
    try:
        s.sendall(wire.frame(wire.HELLO, 1, wire.hello(features=features)))
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused at accept: the Error frame is in the receive queue
    ftype, _, body = wire.recv_frame(s)
    return s, ftype, body


def answered_and_held(url: str) -> socket.socket:
    """A local status query that asked one Stats, read its answer, and does not close its connection."""
    s, ftype, body = local_hello(url, _native.FEATURE_STATUS_QUERY)
    assert ftype == wire.HELLO_OK, body
    s.sendall(wire.frame(_native.FRAME_TYPES["STATS"], 2, b""))
    ftype, _, body = wire.recv_frame(s)
    assert ftype == _native.FRAME_TYPES["STATS_REPLY"], body
    return s


def stats_within(url: str, seconds: float) -> dict:
    """The gateway's stats by a status query, asked again while it is refused for being full, for `seconds`."""
    give_up = time.monotonic() + seconds
    while True:
        try:
            return read_gateway_stats(url)
        except GatewayError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.05)


@contextlib.contextmanager
def full_local_gateway(workdir: str, timeout_ms: int) -> Iterator[tuple[Gateway, RawConnector, list[socket.socket]]]:
    """A gateway with --max-clients 1, its one client connected (DEBUG lines: a status query's are DEBUG), and a list
    for the sockets the test holds; all closed, and the gateway stopped, at the end."""
    gw = Gateway(workdir, extra=("--max-clients", "1", "--handshake-timeout-ms", str(timeout_ms)))
    gw.start(env={"ADP_LOG_LEVEL": "debug"})
    client = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=3000))
    held: list[socket.socket] = []
    try:
        roundtrip(client, "full")
        yield gw, client, held
    finally:
        client.conn.close()
        for s in held:
            s.close()
        assert gw.stop() == 0


def test_a_full_local_gateway_closes_its_reserve_after_the_answer(workdir):
    """Two status queries on the local reserve that read their answer and stay connected (a status client that never
    closes): the gateway closes each after its answer, so a third status query is answered. Red before r16: both
    held the reserve until --idle-timeout-s (600 s), the third refused "too many local clients" (at accept)."""
    with full_local_gateway(workdir, 30000) as (gw, client, held):  # the handshake timeout far off
        held += [answered_and_held(gw.unix_url) for _ in range(2)]
        st = stats_within(gw.unix_url, 5)
        assert st["clients"] == 1 and st["refused_connections"] == 0, st
        assert all(closed_by_gateway(s, 5) for s in held), "a status query on the local reserve stayed open"
        roundtrip(client, "still")
    said = r"DEBUG: gateway: client #\d+ gone \(a status query on the reserve: closed after its answer\)"
    assert len(re.findall(said, gw.logs[-1])) >= 2, gw.logs[-1]  # the two held (and the third, unless it closed)


def test_a_local_reserve_holder_that_never_asks_is_closed_at_the_handshake_timeout(workdir):
    """Two status queries on the local reserve that ask nothing after their HelloOk: a third is refused while they
    hold it, and the gateway closes them after --handshake-timeout-ms (1 s here), at INFO; the third is then answered.
    Red before r16: they held the reserve until --idle-timeout-s."""
    with full_local_gateway(workdir, 1000) as (gw, client, held):
        for _ in range(2):
            s, ftype, body = local_hello(gw.unix_url, _native.FEATURE_STATUS_QUERY)
            held.append(s)
            assert ftype == wire.HELLO_OK, body
        with pytest.raises(GatewayError, match=re.escape(FULL)):
            read_gateway_stats(gw.unix_url)
        assert all(closed_by_gateway(s, 15) for s in held), "a status query on the local reserve held it"
        st = stats_within(gw.unix_url, 10)
        assert st["clients"] == 1 and st["status_probes"] == 2, st
        roundtrip(client, "still")
    said = r"INFO: gateway: client #\d+ \(unix pid \d+ uid \d+\) gone \(a status query on the reserve: closed, no "
    said += r"Stats within the handshake timeout, 1000 ms\)"
    assert len(re.findall(said, gw.logs[-1])) == 2, gw.logs[-1]
    assert "refusing a local connection: 1 clients and 2 status queries on the reserve connected already" in gw.logs[-1]


def test_a_client_past_max_clients_is_refused_as_before(workdir):
    """The reserve is for status queries only: a Hello without bit 9 past --max-clients is refused at its Hello, the
    same Error frame and WARNING line as before r16 (no reserve taken by it: a status query is still answered)."""
    with full_local_gateway(workdir, 30000) as (gw, _, held):
        s, ftype, body = local_hello(gw.unix_url, 0)
        held.append(s)
        assert ftype == wire.ERROR and body[2:].decode() == FULL, body
        st = read_gateway_stats(gw.unix_url)
        assert (st["clients"], st["refused_connections"]) == (1, 1), st
    said = rf"WARNING: gateway: client #\d+ \(unix pid \d+ uid \d+\): {re.escape(FULL)}; closing the connection"
    assert re.search(said, gw.logs[-1]), gw.logs[-1]


def test_a_status_query_within_max_clients_takes_no_reserve_slot(workdir):
    """A status query held open since before the clients filled the gateway (within --max-clients then) is served
    until --idle-timeout-s as before r16, not closed after its answer, and no longer counted at accept: with one
    more held on the reserve, an operator's status query still gets in. Red before r16: the first counted at accept,
    so the one client and the two held took --max-clients plus the reserve, the operator's refused."""
    gw = Gateway(workdir, extra=("--max-clients", "1", "--handshake-timeout-ms", "30000")).start()
    held = []
    client = None
    try:
        held.append(answered_and_held(gw.unix_url))  # no client yet: within --max-clients
        client = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=3000))
        roundtrip(client, "full")
        s, ftype, body = local_hello(gw.unix_url, _native.FEATURE_STATUS_QUERY)  # on the reserve, asks nothing
        held.append(s)
        assert ftype == wire.HELLO_OK, body
        assert read_gateway_stats(gw.unix_url)["clients"] == 1
        assert not closed_by_gateway(held[0], 0.5), "a status query within --max-clients was closed"
        held[0].sendall(wire.frame(_native.FRAME_TYPES["STATS"], 3, b""))  # and still answered
        assert json.loads(wire.recv_frame(held[0])[2])["clients"] == 1
    finally:
        if client:
            client.conn.close()
        for s in held:
            s.close()
        assert gw.stop() == 0


def test_a_tcp_status_query_on_the_reserve_holds_no_client_slot(workdir):
    """--max-tcp-clients 1: one client, and a status query on the TCP reserve that asks nothing (held, the handshake
    timeout far off). The client leaves: a new client is admitted. Red before r16: the reserve query was counted
    with the clients, so it held the freed slot and the client was refused "too many TCP clients" with none there."""
    gw = Gateway(workdir, tcp=True, extra=("--max-tcp-clients", "1", "--handshake-timeout-ms", "30000")).start()
    tcp = dict(gateway=gw.tcp_url, token_file=gw.token_file, timeout_ms=3000, num_workers=1)
    first = RawConnector(ADPConnector(**tcp))
    second = None
    s = None
    try:
        roundtrip(first, "first")
        s, ftype, body = tcp_hello(gw.port, _native.FEATURE_STATUS_QUERY)
        assert ftype == wire.HELLO_OK, body
        first.conn.close()
        give_up = time.monotonic() + 30
        while read_gateway_stats(gw.unix_url)["clients"]:  # the gateway saw it go
            assert time.monotonic() < give_up
            time.sleep(0.02)
        second = RawConnector(ADPConnector(**tcp))
        roundtrip(second, "second")
        assert read_gateway_stats(gw.unix_url)["refused_connections"] == 0
    finally:
        first.conn.close()
        if second:
            second.conn.close()
        if s:
            s.close()
        assert gw.stop() == 0
    assert "too many TCP clients" not in gw.logs[-1]
