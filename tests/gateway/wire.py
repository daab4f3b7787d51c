# SPDX-License-Identifier: Apache-2.0
"""Protocol v1 frames built by hand (docs/protocol.md), for hostile-input tests and the fuzzer."""

from __future__ import annotations

import fcntl
import mmap
import os
import socket
import struct
import threading

from lmcache_adp import _native

# The protocol's constants, from the binding (src_cpp/protocol/frame.h); the
# layouts below are written out, which is what these tests check.
MAGIC, VERSION = _native.FRAME_MAGIC, _native.PROTOCOL_VERSION
HELLO, HELLO_OK, BATCH, BATCH_REPLY, ERROR = (
    _native.FRAME_TYPES[t] for t in ("HELLO", "HELLO_OK", "BATCH", "BATCH_REPLY", "ERROR")
)
PUT, GET, EXISTS, DELETE = (_native.OPS[o] for o in ("PUT", "GET", "EXISTS", "DELETE"))
IO_ERROR = 4  # BatchReply status (docs/protocol.md)
HEADER = struct.Struct("<IBBHIIQ")  # magic, version, type, flags, body_bytes, reserved, request_id
assert HEADER.size == _native.FRAME_HEADER_BYTES


def frame(ftype: int, request_id: int, body: bytes, version: int = VERSION, body_bytes: int | None = None) -> bytes:
    n = len(body) if body_bytes is None else body_bytes
    return HEADER.pack(MAGIC, version, ftype, 0, n, 0, request_id) + body


def hello(token: bytes = b"", name: bytes = b"test", features: int = 0, ring_bytes: int = 0) -> bytes:
    return struct.pack("<IIQHHI", features, 0, ring_bytes, len(token), len(name), 0) + token + name


def batch(
    op: int,
    keys: list[bytes],
    sizes: list[int] | None = None,
    offsets: list[int] | None = None,
    payload: bytes = b"",
    timeout_ms: int = 5000,
    segments: list[int] | None = None,
) -> bytes:
    sizes = sizes or [0] * len(keys)
    offsets = offsets or [0] * len(keys)
    segments = segments or [0] * len(keys)
    out = struct.pack("<BBHIII", op, 0, 0, len(keys), timeout_ms, 0)
    for k, s, o, g in zip(keys, sizes, offsets, segments, strict=True):
        out += struct.pack("<HHIQQ", len(k), 0, g, s, o)
    return out + b"".join(keys) + payload


def parse_header(data: bytes) -> tuple[int, int, int]:
    """(type, body_bytes, request_id) of a received frame header."""
    magic, version, ftype, _, n, _, rid = HEADER.unpack(data[: HEADER.size])
    assert magic == MAGIC and version == VERSION
    return ftype, n, rid


class RingClient:
    """One hand-driven Unix connection with a sealed ring (a memfd of ring_bytes) and the given
    hello features; the tests that speak the ring's own features subclass it."""

    def __init__(self, socket_path: str, features: int, ring_bytes: int):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(30)
        self.sock.connect(socket_path)
        self.ring = os.memfd_create("test-ring", os.MFD_ALLOW_SEALING)
        os.ftruncate(self.ring, ring_bytes)
        fcntl.fcntl(self.ring, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        self.map = mmap.mmap(self.ring, ring_bytes)
        self.rid = 0
        self.send(HELLO, hello(features=features, ring_bytes=ring_bytes), [self.ring])
        ftype, body = self.recv()
        assert ftype == HELLO_OK, body
        self.features = struct.unpack_from("<I", body)[0]

    def send(self, ftype: int, body: bytes, fds: list[int] = ()) -> int:
        self.rid += 1
        data = frame(ftype, self.rid, body)
        if fds:
            socket.send_fds(self.sock, [data], list(fds))
        else:
            self.sock.sendall(data)
        return self.rid

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                return out
            out += chunk
        return out

    def recv(self) -> tuple[int | None, bytes]:
        """The next frame (type, body), or (None, b"") once the gateway closed the connection."""
        head = self._exact(HEADER.size)
        if len(head) < HEADER.size:
            return None, b""
        ftype, n, _ = parse_header(head)
        return ftype, self._exact(n)

    def close(self) -> None:
        self.map.close()
        os.close(self.ring)
        self.sock.close()


def recv_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    head = b""
    while len(head) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(head))
        if not chunk:
            raise ConnectionError("peer closed")
        head += chunk
    ftype, n, rid = parse_header(head)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    return ftype, rid, body


def serve_connections(listener: socket.socket, client) -> None:
    """Accepts on `listener` on a daemon thread until it is closed, each connection served by client(conn) on a daemon
    thread of its own (the gateway stand-ins of the tests)."""

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=client, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()


class FailingGateway:
    """Speaks protocol v1 over TCP (no token check) and answers every batch with an error per key: status
    `code` (an I/O error by default), its message `message`, and `error_class` in each item's byte 1 (0, as a
    gateway of r8 or older, by default). `grant`: FEATURE_ERROR_CLASS granted to a Hello that asks (an r9
    gateway); a class sent without it is a broken gateway's. The features of each Hello are in `hellos`."""

    def __init__(
        self, message: bytes = b"injected I/O error", code: int = IO_ERROR, error_class: int = 0, grant: bool = False
    ):
        self.message, self.code, self.error_class, self.grant = message, code, error_class, grant
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.batches: list[int] = []
        self.hellos: list[int] = []
        serve_connections(self.listener, self._client)

    def _client(self, conn: socket.socket):
        with conn:
            try:
                ftype, rid, body = recv_frame(conn)
                assert ftype == HELLO
                features = struct.unpack_from("<I", body)[0]
                self.hellos.append(features)
                granted = features & _native.FEATURE_ERROR_CLASS if self.grant else 0
                name = b"failing test gateway"
                limits = (_native.MAX_BATCH_KEYS, 1 << 20, _native.MAX_INLINE_PAYLOAD_BYTES)
                ok = struct.pack("<IIQQII", granted, *limits, len(name), 0) + name
                conn.sendall(frame(HELLO_OK, rid, ok))
                while True:
                    ftype, rid, body = recv_frame(conn)
                    op, _, _, count = struct.unpack_from("<BBHI", body)
                    self.batches.append(op)
                    msg = self.message
                    reply = struct.pack("<II", count, 0)
                    reply += struct.pack("<BBHIQ", self.code, self.error_class, len(msg), 0, 0) * count + msg * count
                    conn.sendall(frame(BATCH_REPLY, rid, reply))
            except (ConnectionError, OSError):
                return

    def close(self):
        self.listener.close()
