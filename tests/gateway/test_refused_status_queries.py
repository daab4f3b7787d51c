# SPDX-License-Identifier: Apache-2.0
"""Status queries refused for being full are not clients turned away (brief defects item 2). Over TCP a status
query takes a --max-tcp-clients slot, so on a gateway full of TCP clients each idle connector's probe (one a second,
docs/protocol.md "Failure and reconnection") was refused at its Hello and counted in refused_connections, whose
alert (`rate(refused_connections) > 0`, docs/stats.md) then fired for a gateway merely full while idle connectors
probed it (test_idle_probes' TCP case: 2 or more in 3.5 s from one connector). They are counted in
refused_status_queries now, shown beside in `lmcache-adp status`; a client refused the same way still counts in
refused_connections. Since r15 2 TCP status queries are admitted past --max-tcp-clients (their reserve): they are
held here first (a long --handshake-timeout-ms: a reserve query that asks nothing is closed at it)."""

from __future__ import annotations

import socket

from lmcache_adp import ADPConnector, _native
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway import wire
from tests.gateway.test_limits import roundtrip, tcp_hello
from tests.helpers import RawConnector
from tests.support.gateway import TOKEN, Gateway


def refused_hello(port: int, features: int) -> str:
    """The reason of the Error frame a TCP Hello with `features` (and the token) is answered with."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode(), features=features)))
        ftype, _, body = wire.recv_frame(s)
    assert ftype == wire.ERROR, ftype
    return body.decode(errors="replace")


def test_status_queries_refused_for_being_full_are_not_refused_clients(workdir):
    gw = Gateway(workdir, tcp=True, extra=("--max-tcp-clients", "1", "--handshake-timeout-ms", "60000")).start()
    held = RawConnector(ADPConnector(gateway=gw.tcp_url, token_file=gw.token_file, timeout_ms=3000, num_workers=1))
    reserve: list[socket.socket] = []
    try:
        roundtrip(held, "held")  # the one TCP slot taken
        for _ in range(2):  # and the status-query reserve's 2 (r15)
            s, ftype, body = tcp_hello(gw.port, _native.FEATURE_STATUS_QUERY)
            reserve.append(s)
            assert ftype == wire.HELLO_OK, body
        for _ in range(3):
            assert "too many TCP clients (1, --max-tcp-clients)" in refused_hello(gw.port, _native.FEATURE_STATUS_QUERY)
        assert "too many TCP clients (1, --max-tcp-clients)" in refused_hello(gw.port, 0)  # a client's Hello
        st = read_gateway_stats(gw.unix_url)  # a local status query: takes no TCP slot
        assert (st["refused_status_queries"], st["refused_connections"]) == (3, 1), st
    finally:
        held.conn.close()
        for s in reserve:
            s.close()
        assert gw.stop() == 0
