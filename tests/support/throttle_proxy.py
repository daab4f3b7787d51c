# SPDX-License-Identifier: Apache-2.0
"""A bandwidth-throttling TCP proxy: a link of a set rate between a client and a TCP server (a gateway), for tests
of what a slow but live peer, or a trickling one, gets.

Each connection accepted is forwarded to the upstream port by two threads, one per direction, each through a token
bucket of its own: `up` (client -> server) and `down` (server -> client) bytes a second, None for no limit. The
rates are read as the bytes go, so a test stores its fixtures at full speed and then slows the link. The proxy's
sockets take little ahead of the bucket (small receive buffers), so a sender feels the rate after a few hundred
KiB, not after the kernel's megabytes: what the bucket lets through is what the far side gets, when it gets it.
Each direction of each connection records its bytes and when its first and last went (`links`): the rate a test
relies on is measured there, not assumed.

A side's end goes on to the other side as it came: an end of its bytes (FIN) as a shutdown of the other's writing
side, a reset (or a write to it failing) as a reset of the other (SO_LINGER 0), and a connection both of whose
directions ended has its sockets closed. Until session 33 a proxy whose server went away only shut its sockets
down and kept them open: the client's bytes it had taken but not forwarded sat unread, so a client sending through
a full window was never reset and its send stalled until its own deadline (a red gateway test waited 30 s)."""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

# What a proxy socket takes ahead of the bucket (SO_RCVBUF; the kernel doubles it).
RECV_BUFFER = 64 << 10


class Aborted(Exception):
    """A pump's connection was reset by the other pump: it stops."""


@dataclass
class Link:
    """One forwarded connection: its two sockets, and how many of its two pumps still run (the last one out closes
    both sockets); `aborted` once one side's reset was passed on to the other."""

    client: socket.socket
    server: socket.socket
    pumps: int = 2
    aborted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass
class Flow:
    """One direction of one forwarded connection: `up` or `down`, its bytes and the time of its first and last."""

    direction: str
    bytes: int = 0
    first_at: float | None = None
    last_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def moved(self, n: int) -> None:
        with self.lock:
            now = time.monotonic()
            self.first_at = self.first_at or now
            self.last_at = now
            self.bytes += n

    def reset(self) -> None:
        with self.lock:
            self.bytes, self.first_at, self.last_at = 0, None, None

    def snapshot(self) -> tuple[int, float]:
        """(bytes, seconds from the first byte to the last)."""
        with self.lock:
            span = (self.last_at - self.first_at) if self.first_at is not None else 0.0
            return self.bytes, span


class ThrottleProxy:
    """Listens on 127.0.0.1 (an ephemeral port: `port`, `url`) in front of 127.0.0.1:upstream_port. `up` and `down`
    may be changed at any time; `burst` is the most a bucket holds (bytes), by default a 20th of a second at its
    rate (at least 1 byte, at most 64 KiB). close() ends every connection and thread."""

    def __init__(self, upstream_port: int, up: float | None = None, down: float | None = None):
        self.upstream = ("127.0.0.1", upstream_port)
        self.up = up
        self.down = down
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Set on the listener, so accepted sockets advertise the small window from their first segment.
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.links: list[tuple[Flow, Flow]] = []  # (up, down) of each connection, in the order accepted
        self.closed = False
        self._start(self._accept)

    def _start(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=f"proxy-{target.__name__}")
        with self.lock:
            self.threads.append(t)
        t.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            up_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            up_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECV_BUFFER)  # before connect: its window
            try:
                up_sock.connect(self.upstream)
            except OSError:
                conn.close()
                up_sock.close()
                continue
            for s in (conn, up_sock):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            flows = (Flow("up"), Flow("down"))
            link = Link(conn, up_sock)
            with self.lock:
                if self.closed:
                    conn.close()
                    up_sock.close()
                    return
                self.sockets += [conn, up_sock]
                self.links.append(flows)
            self._start(self._pump, link, conn, up_sock, flows[0])
            self._start(self._pump, link, up_sock, conn, flows[1])

    def _rate(self, flow: Flow) -> float | None:
        return self.up if flow.direction == "up" else self.down

    def _pump(self, link: Link, src: socket.socket, dst: socket.socket, flow: Flow) -> None:
        tokens, last = 0.0, time.monotonic()
        poller = select.poll()
        poller.register(src, select.POLLIN)
        try:
            while not self.closed and not link.aborted:
                # The rate is read once bytes are there to move: one read at a rate set before they came (a
                # megabyte, unlimited) would let a frame sent after a slow-down through at once.
                if not poller.poll(50):
                    continue
                rate = self._rate(flow)
                if rate is None:
                    want, tokens = 1 << 20, 0.0
                else:
                    burst = min(max(1.0, rate / 20), 64 << 10)
                    now = time.monotonic()
                    tokens, last = min(burst, tokens + (now - last) * rate), now
                    if tokens < 1:
                        time.sleep(min((1 - tokens) / rate, 0.05))  # rate re-read at least every 50 ms
                        continue
                    want = int(tokens)
                try:
                    data = src.recv(want)
                except OSError:  # src reset: so is dst
                    self._abort(link, dst)
                    return
                if not data:  # src's end of its bytes: dst's too, after what went before it
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                if rate is not None:
                    tokens -= len(data)
                try:
                    self._send(link, dst, data)
                except Aborted:
                    return
                except OSError:  # dst reset or closed (its kernel answered the bytes with a reset): src is reset
                    self._abort(link, src)
                    return
                flow.moved(len(data))
        finally:
            self._pump_ended(link)

    @staticmethod
    def _send(link: Link, dst: socket.socket, data: bytes) -> None:
        """sendall, but a wait for room that looks every 50 ms whether the other pump reset the connection (a
        blocking send to a peer that does not read would never see it)."""
        view = memoryview(data)
        poller = select.poll()
        poller.register(dst, select.POLLOUT)
        while view:
            if link.aborted:
                raise Aborted
            try:
                view = view[dst.send(view, socket.MSG_DONTWAIT) :]
            except BlockingIOError:
                poller.poll(50)

    @staticmethod
    def _abort(link: Link, reset: socket.socket) -> None:
        """The connection's other side went away with a reset (or failed a write): `reset` is reset when its
        socket is closed (SO_LINGER 0: an RST, not a FIN after its unread bytes), once both pumps stopped."""
        with contextlib.suppress(OSError):
            reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        link.aborted = True

    def _pump_ended(self, link: Link) -> None:
        """The last of a connection's two pumps out closes its sockets: a side reset is reset then; a side whose
        bytes the proxy took and did not forward is reset by its kernel (unread data); else a FIN went already.
        Under the proxy's lock, and not once close() began (it closes them after its own shutdowns): a socket
        closed while close() shuts it down could have its number reused by another socket meanwhile."""
        with link.lock:
            link.pumps -= 1
            last = link.pumps == 0
        if last:
            with self.lock:
                if not self.closed:
                    link.client.close()
                    link.server.close()

    def set_rates(self, up: float | None, down: float | None) -> None:
        """Both rates, and every flow's counts started again: what the flows say from here is at these rates."""
        self.up, self.down = up, down
        with self.lock:
            flows = [f for link in self.links for f in link]
        for f in flows:
            f.reset()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            sockets = list(self.sockets)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept(2)
        self.listener.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(10)
        for s in sockets:
            s.close()
        alive = [t.name for t in threads if t.is_alive()]
        assert not alive, f"threads of the proxy outlived it: {alive}"

    def __enter__(self) -> ThrottleProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
