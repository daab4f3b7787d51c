# SPDX-License-Identifier: Apache-2.0
"""A gateway stand-in that accepts every connection on a Unix socket, reads its Hello and never answers it: a
gateway up but too loaded to answer the handshake, or one across a link that delivers nothing back. Each
connection is recorded with when its Hello was read, whether it was a status query (Hello feature bit 9 alone:
an idle connector's probe, `lmcache-adp status --gateway`) and when the client gave up on it (closed its end):
the client's own connect bound, measured where the client cannot fake it (tests of adapter_params
connect_timeout_ms and `status --connect-timeout-ms`)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass

from lmcache_adp import _native

HEADER = struct.Struct("<IBBHIIQ")  # magic, version, type, flags, body_bytes, reserved, request_id


@dataclass
class Held:
    """One connection: when its Hello was read and when the client closed it (time.monotonic(); ended 0: not yet)."""

    hello: float
    query: bool
    ended: float = 0.0

    @property
    def held_s(self) -> float:
        return self.ended - self.hello


class SilentGateway:
    """Listens on `path` until closed (a context manager); `url` for adapter_params' gateway."""

    def __init__(self, path: str):
        self.path = path
        self.url = "unix://" + path
        self.held: list[Held] = []
        self._cv = threading.Condition()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(path)
        self._srv.listen(64)
        self._start(self._accept, "silent-accept")

    def _start(self, target, name: str, *args) -> None:
        t = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self._srv.accept()
            except OSError:
                return  # shut down (close())
            self._socks.append(s)
            self._start(self._serve, "silent-conn", s)

    @staticmethod
    def _recv_exact(s: socket.socket, n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            chunk = s.recv(n - len(buf))  # the ring's descriptor (SCM_RIGHTS), not asked for, is closed by the kernel
            if not chunk:
                return None
            buf += chunk
        return buf

    def _serve(self, s: socket.socket) -> None:
        try:
            header = self._recv_exact(s, HEADER.size)
            body = header and self._recv_exact(s, HEADER.unpack(header)[4])
            if not body:
                return
            (features,) = struct.unpack_from("<I", body)
            h = Held(time.monotonic(), features == _native.FEATURE_STATUS_QUERY)
            with self._cv:
                self.held.append(h)
            while s.recv(4096):  # never answered: read until the client gives up and closes its end
                pass
            with self._cv:
                h.ended = time.monotonic()
                self._cv.notify_all()
        except OSError:
            return  # close() shut it down

    def wait_ended(self, n: int, query: bool | None = None, timeout: float = 30.0) -> list[Held]:
        """The first n connections (status queries only with query=True, none with False) once each ended, in the
        order their Hellos came; AssertionError after `timeout`."""
        with self._cv:
            ok = self._cv.wait_for(lambda: len(self._ended(query)) >= n, timeout)
            assert ok, f"{len(self._ended(query))} of {n} connections ended in {timeout} s: {self.held}"
            return self._ended(query)[:n]

    def _ended(self, query: bool | None) -> list[Held]:
        mine = [h for h in self.held if query is None or h.query == query]
        # In Hello order, up to the first still open: a later one that ended sooner is not taken before it.
        done = []
        for h in mine:
            if not h.ended:
                break
            done.append(h)
        return done

    def close(self) -> None:
        try:
            self._srv.shutdown(socket.SHUT_RDWR)  # wakes the accept(2); a close() alone does not
        except OSError:
            pass
        self._srv.close()
        self._threads[0].join(10)  # the accept thread: no connection is added after it
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes its thread's recv(2)
            except OSError:
                pass
            s.close()
        for t in self._threads:
            t.join(10)
        assert not [t.name for t in self._threads if t.is_alive()], "the stand-in's threads outlived it"
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> SilentGateway:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
