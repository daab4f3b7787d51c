# SPDX-License-Identifier: Apache-2.0
"""An idle connector's status queries (RemoteBackend::reconnect_loop, probe()): once the gateway closed its
connections (--idle-timeout-s), it asks one a second to see the gateway is up (docs/protocol.md, "Failure and
reconnection"). A gateway full to its status-query reserve is up; and the operator's `status_queries` counts the
operator's queries, not these."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from lmcache_adp import ADPConnector, _native
from lmcache_adp.gateway_stats import GatewayError, read_gateway_stats
from tests.gateway import wire
from tests.gateway.test_failures import keys_and_datas
from tests.gateway.test_health import health, metrics_connector
from tests.helpers import RawConnector
from tests.ops.test_metrics import free_port
from tests.support.gateway import TOKEN, Gateway


class HeldConnections:
    """Connections past their Hello (`features` each: 0 a client, FEATURE_STATUS_QUERY a status query; on the
    gateway's Unix socket, or its TCP port with `token`), kept open past the gateway's --idle-timeout-s by a Stats
    request on each every 0.3 s, until close(); and `silent` more connections that send no Hello (in their handshake
    until close(), or the gateway's --handshake-timeout-ms)."""

    def __init__(self, url: str, features: list[int], token: bytes = b"", silent: int = 0):
        self.socks: list[socket.socket] = []
        for f in features:
            self.socks.append(self._hello(url, f, token))
        self.silent = [self._connect(url) for _ in range(silent)]
        self.stop = threading.Event()
        self.error: list[BaseException] = []
        self.thread = threading.Thread(target=self._keep_alive, daemon=True)
        self.thread.start()

    @staticmethod
    def _hello(url: str, features: int, token: bytes) -> socket.socket:
        # An idle connector's status query holds one connection for a moment each second: retried past it.
        give_up = time.monotonic() + 10
        while True:
            s = HeldConnections._connect(url)
            try:
                s.sendall(wire.frame(wire.HELLO, 1, wire.hello(token=token, features=features)))
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused at accept: its Error frame is there to read
            ftype, _, body = wire.recv_frame(s)
            if ftype == wire.HELLO_OK:
                return s
            s.close()
            assert time.monotonic() < give_up, body
            time.sleep(0.05)

    @staticmethod
    def _connect(url: str) -> socket.socket:
        if url.startswith("tcp://"):
            host, port = url.removeprefix("tcp://").rsplit(":", 1)
            return socket.create_connection((host, int(port)), timeout=30)
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(url.removeprefix("unix://"))
        return s

    def _keep_alive(self) -> None:
        request_id = 2
        try:
            while not self.stop.wait(0.3):
                for s in self.socks:
                    s.sendall(wire.frame(_native.FRAME_TYPES["STATS"], request_id, b""))
                    assert wire.recv_frame(s)[0] == _native.FRAME_TYPES["STATS_REPLY"]
                request_id += 1
        except BaseException as e:  # noqa: BLE001 (reported by close())
            self.error.append(e)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for s in self.socks + self.silent:
            s.close()
        assert not self.error, self.error


def idle_closed(gw: Gateway) -> None:
    """Waits until the gateway closed its one client (the connector's connection) for idleness."""
    give_up = time.monotonic() + 10
    while "idle for 1 s" not in gw.log() or read_gateway_stats(gw.unix_url)["clients"]:
        assert time.monotonic() < give_up, gw.log()
        time.sleep(0.05)


class SilentPeer:
    """A TCP connection that never sends its Hello: with --max-handshakes 1 (and a long --handshake-timeout-ms)
    it holds the gateway's one handshake slot until close(). Ready once a new TCP connection is refused at
    accept."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        give_up = time.monotonic() + 10
        while HANDSHAKES_FULL not in refusal_at_accept(port):
            assert time.monotonic() < give_up, "the silent peer holds no handshake slot"
            time.sleep(0.05)

    def close(self) -> None:
        self.sock.close()


HANDSHAKES_FULL = "too many TCP connections in their handshake (1, --max-handshakes)"


def refusal_at_accept(port: int) -> str:
    """What a new TCP connection that sends a status query's Hello reads first: an Error frame's reason, or
    "HelloOk" or "closed" (no frame)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(
                wire.frame(wire.HELLO, 1, wire.hello(token=TOKEN.encode(), features=_native.FEATURE_STATUS_QUERY))
            )
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused at accept: its Error frame is there to read
        try:
            ftype, _, body = wire.recv_frame(s)
        except (ConnectionError, OSError):
            return "closed"
    return body[2:].decode(errors="replace") if ftype == wire.ERROR else "HelloOk"  # after its u16 length


# transport: the connector's, and the limit its status queries meet: (gateway flags, reason, counted in).
FULL = {
    # The reserve held by connections in their handshake: the handshake timeout far off.
    "unix": (
        ("--max-clients", "1", "--handshake-timeout-ms", "60000"),
        "too many local clients",
        "refused_connections",
    ),
    # r15: a status query has a reserve of 2 past --max-tcp-clients, so the probes are answered: no "is full".
    "tcp": (("--max-tcp-clients", "1"), None, "status_probes"),
    "tcp-handshakes": (
        ("--max-handshakes", "1", "--handshake-timeout-ms", "60000"),
        HANDSHAKES_FULL,
        "refused_connections",
    ),
}


@pytest.mark.parametrize("transport", list(FULL))
def test_an_idle_connector_on_a_full_gateway_is_not_down(workdir, capfd, transport):
    """Brief admission item 2: an idle connector whose connections the gateway closed asks a status query every
    kIdleLook (1 s); on a full gateway each was refused, and the connector read that as an outage: WARNING
    "unreachable", gateway_reachable 0, /health 503, although the gateway was up and answered. A refusal for
    being full is an answer now: /health 200 and gateway_reachable 1 throughout 3.5 s of refused queries, one
    INFO line saying so, no WARNING; once there is room, the next batch works. The gateway counts them: refused
    before their Hello in refused_connections, at it in refused_status_queries.
    Unix: --max-clients 1, one client and two connections in their handshake held (the reserve: since r16 a status
    query on it is closed after its answer, or when it asks none in time), each query refused at accept, "too many
    local clients". TCP: --max-tcp-clients 1, one TCP client held; until r15 each query was refused at its
    Hello, "too many TCP clients"; now each is answered on the TCP status-query reserve (counted in status_probes,
    no "is full" line; test_refused_status_queries holds that reserve). TCP past --max-handshakes (brief
    defects item 3): --max-handshakes 1, a silent peer holding the slot, each query refused at accept; until r13
    the gateway closed it with no frame, which the connector read as an outage (a WARNING, 503)."""
    flags, reason, counted_in = FULL[transport]
    tcp = transport != "unix"
    gw = Gateway(workdir, tcp=tcp, extra=(*flags, "--idle-timeout-s", "1")).start()
    port = free_port()
    where = dict(gateway=gw.tcp_url, token_file=gw.token_file) if tcp else dict(gateway=gw.unix_url)
    conn = ADPConnector(**where, num_workers=1, timeout_ms=2000, metrics_port=port)
    c = RawConnector(conn)
    held = None
    try:
        keys, datas = keys_and_datas(2)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        idle_closed(gw)
        capfd.readouterr()
        before = read_gateway_stats(gw.unix_url)[counted_in]
        if transport == "tcp-handshakes":
            held = SilentPeer(gw.port)
        elif tcp:
            held = HeldConnections(gw.tcp_url, [0], token=TOKEN.encode())
        else:
            held = HeldConnections(gw.unix_url, [0], silent=2)
        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            code, doc = health(port)
            assert code == 200 and doc["gateway_reachable"] is True, doc
            assert conn.stats()["gateway_reachable"] == 1
            time.sleep(0.1)
        if not tcp:
            with pytest.raises(GatewayError) as refused:
                read_gateway_stats(gw.unix_url)  # full: a status query past the reserve is refused too
            assert "too many local clients" in str(refused.value)
        held.close()
        held = None
        st = read_gateway_stats(gw.unix_url)
        assert st[counted_in] - before >= 2, (before, st)  # the connector's queries while full, 2 at least
        err = capfd.readouterr().err
        assert "WARNING" not in err, err
        said = [line for line in err.splitlines() if f"is full (gateway refused: {reason or ''}" in line]
        assert (len(said) == 1 and " INFO: " in said[0]) if reason else not said, err
        ok, why, _ = c.set(keys, [memoryview(d) for d in datas])
        assert ok, why
    finally:
        if held:
            held.close()
        conn.close()
        assert gw.stop() == 0


def test_an_idle_connectors_status_queries_are_not_the_operators(workdir):
    """Brief admission item 2: each status query of an idle connector (one a second) was counted in the gateway's
    `status_queries`, the count an operator reads in `lmcache-adp status` as the status queries made. Those that
    ask nothing (the connector's: closed once HelloOk is read) are counted apart now, in `status_probes`; a
    status query is counted in `status_queries` at its first Stats request (its own reply counts it)."""
    gw = Gateway(workdir, extra=("--idle-timeout-s", "1")).start()
    conn, c, _ = metrics_connector(gw, timeout_ms=2000)
    try:
        keys, datas = keys_and_datas(1)
        assert c.set(keys, [memoryview(d) for d in datas])[0]
        reads = 0
        give_up = time.monotonic() + 15
        while True:
            st = read_gateway_stats(gw.unix_url)
            reads += 1
            if st.get("status_probes", 0) >= 2 or st["status_queries"] >= reads + 2:
                break
            assert time.monotonic() < give_up, st
            time.sleep(0.1)
        assert st["status_queries"] == reads, st  # this test's reads only
        assert st["status_probes"] >= 2, st
        assert st["clients"] == 0, st
    finally:
        conn.close()
        assert gw.stop() == 0
