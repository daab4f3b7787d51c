# SPDX-License-Identifier: Apache-2.0
"""What a client's segments (protocol r3) cost the gateway: memory that follows what is used, not the files' stated
size, and address space held to --max-segment-total-gb (review33b F2, session 33)."""

from __future__ import annotations

import os
import struct
import time

from lmcache_adp._native import FEATURE_RING, FEATURE_SEGMENTS, FRAME_TYPES, SEGMENT_RETRY_LATER
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.gateway import wire
from tests.support.gateway import temp_gateway
from tests.support.proc import status_bytes

REGISTER, SEGMENT_OK, ERROR = FRAME_TYPES["REGISTER_SEGMENT"], FRAME_TYPES["SEGMENT_OK"], FRAME_TYPES["ERROR"]
GIB, TIB = 1 << 30, 1 << 40


def _sparse_file(size: int, tag: str) -> tuple[str, int]:
    path = f"/dev/shm/adp-segcost-{os.getpid()}-{tag}-{time.monotonic_ns()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)  # sparse: no page of it is ever allocated
    return path, fd


def test_a_clients_segments_cost_the_gateway_no_memory_in_proportion_to_their_size():
    """review33b F2: ClientSegment::Attach allocated, zeroed (so resident), one bit per 4 KiB page of the segment's
    stated size: 32 MiB of the gateway's own memory for a 1 TiB segment, which any local client makes with one
    sparse /dev/shm file (ftruncate, no page of it ever used); 8 on one connection, 256 MiB of gateway RSS, and
    --max-clients (256) connections of one process 64 GiB. Now the bitmap is made per GiB on first use: 8 untouched
    1 TiB segments grow the gateway's resident memory by far less (the test's reviewer: by 256 MiB on c988e8e)."""
    files = []
    with temp_gateway(extra=("--segment-prefault", "off")) as gw:
        c = wire.RingClient(gw.socket, FEATURE_RING | FEATURE_SEGMENTS, 1 << 20)
        try:
            assert c.features & FEATURE_SEGMENTS
            before = status_bytes(gw.proc.pid, "VmRSS")
            for seg_id in range(1, 9):
                files.append(_sparse_file(TIB, str(seg_id)))
                c.send(REGISTER, struct.pack("<QII", TIB, seg_id, 0), [files[-1][1]])
                ftype, body = c.recv()
                assert ftype == SEGMENT_OK, body
            grown = status_bytes(gw.proc.pid, "VmRSS") - before
            assert grown < 32 << 20, f"8 untouched 1 TiB segments grew the gateway's RSS by {grown >> 20} MiB"
            assert read_gateway_stats(gw.unix_url)["segment_bytes"] == 8 * TIB
        finally:
            c.close()
            for path, fd in files:
                os.close(fd)
                os.unlink(path)


def test_segments_past_the_gateways_total_are_refused_for_now_and_mapped_once_room_is_back():
    """review33b F2, second half: each segment is a mapping of its whole stated size, and the gateway's 128 TiB of
    address space ran out after ~127 segments of 1 TiB (16 connections), and with it every mapping it makes for the
    others (rings, store buffers). --max-segment-total-gb holds the segments mapped together: past it a
    registration gets an Error frame whose reason starts with SEGMENT_RETRY_LATER (protocol r19: the client
    registers that file again later) and names the flag, logged at WARNING; the same file shared by another
    connection costs nothing more; once a segment is unmapped (its connections gone) the room is back."""
    files = [_sparse_file(GIB, "a"), _sparse_file(GIB, "b")]
    try:
        _refused_past_the_total_then_mapped(files)
    finally:
        for path, fd in files:
            os.close(fd)
            os.unlink(path)


def _refused_past_the_total_then_mapped(files: list[tuple[str, int]]) -> None:
    with temp_gateway(extra=("--max-segment-total-gb", "1")) as gw:
        first = wire.RingClient(gw.socket, FEATURE_RING | FEATURE_SEGMENTS, 1 << 20)
        try:
            first.send(REGISTER, struct.pack("<QII", GIB, 1, 0), [files[0][1]])
            assert first.recv()[0] == SEGMENT_OK
            # The same file on a second connection: its mapping is shared, not counted again.
            second = wire.RingClient(gw.socket, FEATURE_RING | FEATURE_SEGMENTS, 1 << 20)
            second.send(REGISTER, struct.pack("<QII", GIB, 1, 0), [files[0][1]])
            assert second.recv()[0] == SEGMENT_OK
            # Another file: past the total, refused for now, the connection closed.
            second.send(REGISTER, struct.pack("<QII", GIB, 2, 0), [files[1][1]])
            ftype, body = second.recv()
            assert ftype == ERROR, (ftype, body)
            reason = body[2:].decode()
            assert reason.startswith(SEGMENT_RETRY_LATER) and "--max-segment-total-gb" in reason, reason
            assert second.recv()[0] is None
            second.close()
            assert "would pass --max-segment-total-gb (1.00 GiB)" in gw.log()
            assert read_gateway_stats(gw.unix_url)["segment_bytes"] == GIB
        finally:
            first.close()
        # Both connections gone: the first file's mapping with them, the room back.
        deadline = time.monotonic() + 30
        while read_gateway_stats(gw.unix_url)["segment_bytes"] and time.monotonic() < deadline:
            time.sleep(0.02)
        third = wire.RingClient(gw.socket, FEATURE_RING | FEATURE_SEGMENTS, 1 << 20)
        try:
            third.send(REGISTER, struct.pack("<QII", GIB, 1, 0), [files[1][1]])
            assert third.recv()[0] == SEGMENT_OK
        finally:
            third.close()
