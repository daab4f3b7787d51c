# SPDX-License-Identifier: Apache-2.0
"""tests/support/throttle_proxy.py passes a server's end of a connection on to its client: a server that closes
while the client is still sending (through a slow link) is seen by the client at once, as a reset where the server
reset the connection, not as a send that stalls until the client's own deadline. Until session 33 the proxy stopped
forwarding once the server's side was gone but kept the client's socket open and unread: the client's send stalled
on a full window (a red gateway test then waited 30 s for its batch instead of failing)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pytest

from tests.support.throttle_proxy import ThrottleProxy

RATE = 2 << 20  # the link's up rate: the client's bytes reach the server at 2 MiB/s (a slow link)
GUARD_S = 20  # a guard against a hang only: a send the proxy leaves stalled ends here (socket.timeout)
BOUND_S = 5  # what the client may take to see the server's end


def server(how: str) -> tuple[socket.socket, threading.Thread, list]:
    """A listener on 127.0.0.1 that accepts one connection, reads its first 4 KiB and then ends it: `reset` (SO_LINGER
    0: an RST) or `close` (what has come read, then close(): a FIN, and an RST from its kernel for the client's bytes
    that come after)."""
    lst = socket.create_server(("127.0.0.1", 0))
    ended: list = []

    def serve() -> None:
        conn, _ = lst.accept()
        got = 0
        while got < 4096:
            got += len(conn.recv(4096 - got))
        time.sleep(0.5)  # not reading: the client's bytes fill the proxy's buffers (the window shut)
        if how == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            with contextlib.suppress(BlockingIOError):
                while conn.recv(1 << 20, socket.MSG_DONTWAIT):
                    pass
        ended.append(time.monotonic())
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return lst, t, ended


@pytest.mark.parametrize("how", ["reset", "close"])
def test_a_server_that_ends_a_connection_mid_send_ends_the_clients_send(how):
    """The client sends without end through the proxy (RATE up); the server reads 4 KiB and resets or closes its
    connection. The client's send fails (a reset: ConnectionResetError or BrokenPipeError) within BOUND_S of the
    server's end. Red before session 33: the send stalled until the GUARD_S guard (socket.timeout). (The server's
    pause before its end only lets the client fill the proxy's window, the case the old proxy stalled; what is
    asserted does not depend on how full it got.)"""
    lst, t, ended = server(how)
    with lst, ThrottleProxy(lst.getsockname()[1], up=RATE) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as c:
            c.settimeout(GUARD_S)
            chunk = b"x" * 65536
            with pytest.raises((ConnectionResetError, BrokenPipeError)):
                while True:
                    c.sendall(chunk)
            failed_at = time.monotonic()
        t.join(GUARD_S)
    assert ended and failed_at - ended[0] < BOUND_S, (ended, failed_at)


def test_a_server_that_closes_after_its_reply_is_read_as_the_end():
    """A server that sends a reply and closes (nothing of the client's unread): the client reads the reply and then
    the end (b""), as with no proxy between."""
    lst = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = lst.accept()
        with conn:
            assert conn.recv(5) == b"hello"
            conn.sendall(b"bye")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with lst, ThrottleProxy(lst.getsockname()[1]) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port)) as c:
            c.settimeout(GUARD_S)
            c.sendall(b"hello")
            got = b""
            while chunk := c.recv(100):
                got += chunk
            assert got == b"bye"
        t.join(GUARD_S)
