# SPDX-License-Identifier: Apache-2.0
"""Reads a running gateway's counters over its own socket: a Hello without a
ring that says it is a status query (r10: the gateway logs it at DEBUG and does
not count it among its clients), then one Stats request (docs/protocol.md,
"Stats"). Used by `lmcache-adp status --gateway unix://...|tcp://...`."""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

from lmcache_adp import _native
from lmcache_adp.config import tcp_address_error

# The protocol's constants come from the binding (src_cpp/protocol/frame.h).
MAGIC, VERSION = _native.FRAME_MAGIC, _native.PROTOCOL_VERSION
HELLO, HELLO_OK, ERROR, STATS, STATS_REPLY = (
    _native.FRAME_TYPES[t] for t in ("HELLO", "HELLO_OK", "ERROR", "STATS", "STATS_REPLY")
)
HEADER = struct.Struct("<IBBHIIQ")  # magic, version, type, flags, body_bytes, reserved, request_id
assert HEADER.size == _native.FRAME_HEADER_BYTES
MAX_REPLY_BYTES = _native.MAX_STATS_BYTES


class GatewayError(RuntimeError):
    """The gateway could not be reached or refused the request."""


class _HandshakeTimeout(Exception):
    """The connect or its handshake ran past the connect's bound (read_gateway_stats' connect_timeout_ms)."""


def _recv_exact(sock: socket.socket, n: int, until: float | None = None) -> bytes:
    """n bytes; with `until` (time.monotonic()), by then in all, not `sock`'s timeout per recv (_HandshakeTimeout)."""
    buf = bytearray()
    while len(buf) < n:
        if until is not None:
            if (left := until - time.monotonic()) <= 0:
                raise _HandshakeTimeout
            sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            if until is None:
                raise
            raise _HandshakeTimeout from None
        if not chunk:
            raise GatewayError("the gateway closed the connection")
        buf += chunk
    return bytes(buf)


def _read_frame(sock: socket.socket, until: float | None = None) -> tuple[int, bytes]:
    magic, version, ftype, _, n, _, _ = HEADER.unpack(_recv_exact(sock, HEADER.size, until))
    if magic != MAGIC or version != VERSION or n > MAX_REPLY_BYTES:
        raise GatewayError("not a protocol-1 gateway reply")
    body = _recv_exact(sock, n, until)
    if ftype == ERROR:
        (length,) = struct.unpack_from("<H", body)
        raise GatewayError("gateway refused: " + body[2 : 2 + length].decode(errors="replace"))
    return ftype, body


def address_error(url: str) -> str | None:
    """Why `url` is no gateway address (unix:///path, tcp://HOST:PORT), or None. `lmcache-adp status` asks first,
    so that a bad address is its usage error (exit 2), not a gateway it could not read (3; review33c C6)."""
    if url.startswith("unix://"):
        return None
    if url.startswith("tcp://"):
        # The connector's and the gateway's check of the address, not a third one of its own (review r15 N4:
        # tcp://h:99999 was an OverflowError traceback).
        why = tcp_address_error(url, 1)
        return f"bad gateway address {url!r}: {why}" if why else None
    # A bare socket path (the gateway's --socket as given) is the likely slip: say what it is then.
    hint = f" (that socket: unix://{url})" if url.startswith("/") else ""
    return f"bad gateway address {url!r}; expected unix:///path or tcp://HOST:PORT{hint}"


def _connect(url: str, timeout: float) -> socket.socket:
    if why := address_error(url):
        raise GatewayError(why)
    if url.startswith("unix://"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        target: Any = url[len("unix://") :]
    else:
        host, _, port = url[len("tcp://") :].rpartition(":")
        sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM)
        target = (host.strip("[]"), int(port))
    sock.settimeout(timeout)
    try:
        sock.connect(target)
    except TimeoutError:
        sock.close()
        raise _HandshakeTimeout from None
    except OSError as e:
        sock.close()
        raise GatewayError(f"cannot reach the gateway at {url}: {e.strerror or e}") from None
    return sock


def read_gateway_stats(
    url: str, token: str = "", timeout: float = 5.0, connect_timeout_ms: int | None = None
) -> dict[str, Any]:
    """The gateway's StatsReply. The connect and its handshake (Hello to HelloOk) end within connect_timeout_ms in
    all (`timeout` if None; `lmcache-adp status --connect-timeout-ms`), else GatewayError "did not answer its
    connect within N ms"; the Stats request then has `timeout` per read."""
    bound_ms = round(timeout * 1000) if connect_timeout_ms is None else connect_timeout_ms
    until = time.monotonic() + bound_ms / 1000
    try:
        sock = _connect(url, bound_ms / 1000)
    except _HandshakeTimeout:
        raise GatewayError(f"the gateway at {url} did not answer its connect within {bound_ms} ms") from None
    try:
        name, tok = b"lmcache-adp status", token.encode()
        hello = struct.pack("<IIQHHI", _native.FEATURE_STATUS_QUERY, 0, 0, len(tok), len(name), 0) + tok + name
        try:
            sock.sendall(HEADER.pack(MAGIC, VERSION, HELLO, 0, len(hello), 0, 1) + hello)
        except (BrokenPipeError, ConnectionResetError):
            # A gateway over a limit writes its reason and closes before it reads the Hello (as the C++ client
            # knows: gateway_client.cc): the reason is still in this socket's receive queue (review r15 N3: the
            # status command said "Broken pipe" instead, 1 run in 3).
            pass
        ftype, _ = _read_frame(sock, until)
        if ftype != HELLO_OK:
            raise GatewayError(f"unexpected reply type {ftype} to hello")
        sock.settimeout(timeout)
        sock.sendall(HEADER.pack(MAGIC, VERSION, STATS, 0, 0, 0, 2))
        ftype, body = _read_frame(sock)
        if ftype != STATS_REPLY:
            raise GatewayError(f"unexpected reply type {ftype} to stats")
        return json.loads(body)
    except _HandshakeTimeout:
        raise GatewayError(f"the gateway at {url} did not answer its connect within {bound_ms} ms") from None
    except (OSError, struct.error, ValueError) as e:
        raise GatewayError(f"talking to the gateway at {url}: {e}") from None
    finally:
        sock.close()
