# SPDX-License-Identifier: Apache-2.0
"""A segment registration refused for the gateway's state, not the file's, is tried again (protocol r19, review33b
F5, session 33)."""

from __future__ import annotations

import mmap
import os
import resource
import socket
import struct
import time

import pytest

from lmcache_adp import ADPConnector, _native
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway import wire
from tests.helpers import RawConnector
from tests.support.gateway import temp_gateway
from tests.support.proc import status_bytes


def test_a_transient_refusal_of_a_segment_does_not_turn_in_place_loads_off_for_good():
    """review33b F5: RemoteSession::try_in_place marked a file `refused` for the life of the process on ANY Error
    frame answering its registration: "buffers in that shared memory file go through the ring from now on". Errors
    that say nothing about the file - mmap's ENOMEM (address space or vm.max_map_count used up), the gateway's
    segments past --max-segment-total-gb, the fault handler's table full, no memory - are transient, yet LMCache's
    L1 pool then loaded through the ring (half speed on a memory-speed card) until the MP server restarted. Here
    the gateway's RLIMIT_AS is lowered for one registration (mmap fails: ENOMEM, refused for now), then restored:
    later loads into the same /dev/shm file must go in place again (segment_loads). The file (sparse: at most
    4 MiB written) is made larger than the lowered limit itself, so its mapping fails whatever else the gateway maps
    or unmaps meanwhile (py35: the limit was its VmSize + 16 MiB read just before, against a 64 MiB file, so 48 MiB
    unmapped in between - a ring, threads' stacks - would have let the mapping through, and 16 MiB left the
    gateway's other allocations little room); the limit leaves 1 GiB above its VmSize for those (~0.5 GiB here: a
    2 GiB file). The first retry comes after 1 s, in place again within a few seconds; 30 s bounds only a failure
    (the old code never went in place again), so that a loaded host's slow gets do not fail it (session 34: 10 s, a
    fixed deadline a loaded 2-core VM could miss)."""
    size = 4 << 20
    path = f"/dev/shm/adp-segrefusal-{os.getpid()}-{time.monotonic_ns()}"
    with temp_gateway() as gw:
        c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=5000, process_memory=False))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            assert c.set(["refused@1"], [memoryview(b"\x11" * size)])[0]
            pid = gw.proc.pid
            soft, hard = resource.prlimit(pid, resource.RLIMIT_AS)
            limit = status_bytes(pid, "VmSize") + (1 << 30)
            os.ftruncate(fd, ((limit >> 30) + 1) << 30)  # the segment the gateway maps whole: more than the limit
            with mmap.mmap(fd, 64 << 20) as m:
                view = memoryview(m)[:size]
                resource.prlimit(pid, resource.RLIMIT_AS, (limit, hard))
                try:
                    c.get(["refused@1"], [view])  # its registration refused: mmap ENOMEM (the load may take the ring)
                finally:
                    resource.prlimit(pid, resource.RLIMIT_AS, (soft, hard))
                assert "cannot map the segment" in gw.log()
                # A get may still fail just after the restore (the ring connection the refused batch reconnected
                # with, under the lowered limit, may have been refused too, and the connector then waits out its
                # back-off): what must hold is that loads go in place again, and hit.
                deadline = time.monotonic() + 30
                in_place, results = 0, []
                while time.monotonic() < deadline and not in_place:
                    results.append(c.get(["refused@1"], [view])[2])
                    in_place = read_gateway_stats(gw.unix_url)["segment_loads"]
                    time.sleep(0.1)
                assert in_place, (
                    f"loads into the file still go through the ring 30 s after the gateway could map it again "
                    f"(results {results[:5]}...{results[-3:]}); gateway log:\n{gw.log()[-3000:]}"
                )
                assert c.get(["refused@1"], [view])[2] == [True]
                assert bytes(view[:64]) == b"\x11" * 64
                view.release()
        finally:
            c.conn.close()
            os.close(fd)
            os.unlink(path)


class RefusingGateway:
    """A gateway stand-in on a Unix socket: grants the ring and segments at each Hello and answers every segment
    registration with an Error frame of `reason`, then closes the connection (as a gateway that refuses a file); any
    other frame closes it too."""

    def __init__(self, path: str, reason: bytes):
        self.path, self.reason = path, reason
        self.registrations = 0
        self.listener = socket.socket(socket.AF_UNIX)
        self.listener.bind(path)
        self.listener.listen(16)
        wire.serve_connections(self.listener, self._client)

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    @staticmethod
    def _recv(conn: socket.socket) -> tuple[int, int, bytes]:
        head, fds, _, _ = socket.recv_fds(conn, wire.HEADER.size, 4)
        for fd in fds:
            os.close(fd)  # the ring or the segment's file: not mapped here
        if len(head) < wire.HEADER.size:
            raise ConnectionError("closed")
        ftype, n, rid = wire.parse_header(head)
        body = b""
        while len(body) < n:
            chunk = conn.recv(n - len(body))
            if not chunk:
                raise ConnectionError("closed")
            body += chunk
        return ftype, rid, body

    def _client(self, conn: socket.socket) -> None:
        with conn:
            try:
                ftype, rid, body = self._recv(conn)
                if ftype != wire.HELLO:
                    return
                features = struct.unpack_from("<I", body)[0]
                granted = features & (_native.FEATURE_RING | _native.FEATURE_SEGMENTS)
                name = b"refusing test gateway"
                limits = (_native.MAX_BATCH_KEYS, 1 << 20, _native.MAX_INLINE_PAYLOAD_BYTES)
                conn.sendall(
                    wire.frame(wire.HELLO_OK, rid, struct.pack("<IIQQII", granted, *limits, len(name), 0) + name)
                )
                ftype, rid, _ = self._recv(conn)
                if ftype == _native.FRAME_TYPES["REGISTER_SEGMENT"]:
                    self.registrations += 1
                    conn.sendall(wire.frame(wire.ERROR, rid, struct.pack("<H", len(self.reason)) + self.reason))
            except (ConnectionError, OSError):
                return

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize(
    "verdict,said_as",
    [
        ("segment not mapped: ", "buffers in that shared memory file (1048576 bytes) go through the ring from now on"),
        (
            "segment refused for now, register it again later: ",
            "buffers in that shared memory file (1048576 bytes) go through the ring for now",
        ),
    ],
)
def test_a_long_segment_refusal_reaches_the_connectors_log_whole(verdict, said_as, tmp_path, capfd):
    """debt39 item 3: the connector's INFO line for a shared memory file the gateway refused ("gateway refused:
    <reason>; buffers in that shared memory file ... go through the ring from now on") passed the message through
    log_safe's default 200 bytes, and a gateway's Error frame carries up to 256 (a segment's refusal runs that long:
    debt38b): the line lost the reason's end, the part that says what to do. A stand-in gateway refuses the file
    with a 256-byte reason (printable ASCII, a backslash escape in it as a segment's escaped path has): the line
    carries it whole, the escape as the frame has it. Both lines: refused for good, and for now (protocol r19)."""
    reason = (verdict + "caf\\xc3\\xa9 " + "r" * 150 + " what to do: ").encode()
    reason += b"x" * (_native.MAX_MESSAGE_BYTES - len(reason) - 4) + b" END"
    assert len(reason) == _native.MAX_MESSAGE_BYTES
    gw = RefusingGateway(str(tmp_path / "gw.sock"), reason)
    path = f"/dev/shm/adp-longrefusal-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    conn = ADPConnector(gateway=gw.url, num_workers=1, timeout_ms=2000, process_memory=False)
    try:
        os.ftruncate(fd, 1 << 20)
        with mmap.mmap(fd, 1 << 20) as m:
            view = memoryview(m)[: 64 << 10]
            capfd.readouterr()
            RawConnector(conn).get(["k"], [view])  # fails: the stand-in serves no batch
            view.release()
        err = capfd.readouterr().err
        said = [line for line in err.splitlines() if said_as in line]
        assert gw.registrations >= 1 and len(said) == 1, err
        assert f"gateway refused: {reason.decode()}; {said_as}" in said[0], said[0]
    finally:
        conn.close()
        gw.close()
        os.close(fd)
        os.unlink(path)
