# SPDX-License-Identifier: Apache-2.0
"""Frame fuzzing shared by the test suite (seconds) and scripts/fuzz_protocol.py (as long as asked).

Valid frames of every type are mutated (bit flips, cut, extended, length and
count fields overwritten, random bytes) and fed to the C++ frame parser, or
sent to a live gateway, which must refuse them without harm to anyone else.
"""

from __future__ import annotations

import random
import socket
import struct
import time

from lmcache_adp import _native
from tests.gateway import wire

INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF, 4096, 4097, 1 << 30]


def seeds() -> list[bytes]:
    keys = [b"model/a@00000000@0@abc", b"k" * 1024, b"x"]
    return [
        wire.frame(wire.HELLO, 1, wire.hello(b"tok", b"name")),
        wire.frame(wire.HELLO, 1, wire.hello(features=1, ring_bytes=1 << 20)),
        wire.frame(wire.BATCH, 2, wire.batch(wire.PUT, keys, [3, 2, 1], [0, 3, 5], b"abcdef")),
        wire.frame(wire.BATCH, 3, wire.batch(wire.GET, keys, [10, 10, 10], [0, 4096, 8192])),
        wire.frame(wire.BATCH, 4, wire.batch(wire.EXISTS, keys)),
        wire.frame(wire.BATCH, 5, wire.batch(wire.DELETE, keys[:1])),
        wire.frame(wire.BATCH_REPLY, 5, struct.pack("<II", 1, 0) + struct.pack("<BBHIQ", 4, 0, 2, 0, 0) + b"no"),
        # r9: an I/O error with its class (2: the gateway's memory), then a miss.
        wire.frame(
            wire.BATCH_REPLY,
            6,
            struct.pack("<II", 2, 0)
            + struct.pack("<BBHIQ", 4, 2, 2, 0, 0)
            + struct.pack("<BBHIQ", 1, 0, 0, 0, 0)
            + b"no",
        ),
        wire.frame(wire.HELLO_OK, 1, struct.pack("<IIQQII", 1, 4096, 1 << 20, 1 << 26, 2, 0) + b"gw"),
        wire.frame(wire.ERROR, 1, struct.pack("<H", 3) + b"bad"),
        # r5: a registration, its answer, and a get of process memory
        wire.frame(_native.FRAME_TYPES["REGISTER_PROCESS"], 2, struct.pack("<IIQ", 77, 16, 1 << 40) + bytes(16)),
        wire.frame(_native.FRAME_TYPES["PROCESS_OK"], 2, struct.pack("<IHH", 16, 3, 0) + b"why"),
        wire.frame(wire.BATCH, 6, wire.batch(wire.GET, keys[:1], [10], [1 << 40], segments=[_native.PROCESS_SEGMENT])),
    ]


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(6)
        if choice == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif choice == 1 and b:
            del b[rng.randrange(len(b)) :]
        elif choice == 2:
            b += rng.randbytes(rng.randint(1, 64))
        elif choice == 3 and len(b) >= 8:
            i = rng.randrange(len(b) - 3)
            b[i : i + 4] = struct.pack("<I", rng.choice(INTERESTING) & 0xFFFFFFFF)
        elif choice == 4 and len(b) >= 2:
            i = rng.randrange(len(b) - 1)
            b[i : i + 2] = struct.pack("<H", rng.choice(INTERESTING) & 0xFFFF)
        else:
            b = bytearray(rng.randbytes(rng.randint(0, 128)))
    # Keep the body length honest half of the time, so the body decoders are reached.
    if len(b) >= wire.HEADER.size and rng.random() < 0.5:
        b[8:12] = struct.pack("<I", len(b) - wire.HEADER.size)
    return bytes(b)


def run_parser(seconds: float = float("inf"), seed: int = 0, frames: int | None = None) -> tuple[int, int]:
    """Feeds mutated frames to the parser for `seconds` or `frames` frames,
    whichever ends first; returns (accepted, refused)."""
    rng = random.Random(seed)
    base = seeds()
    for s in base:
        _native.parse_frame(s)  # the seeds themselves are valid
    accepted = refused = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and (frames is None or accepted + refused < frames):
        try:
            _native.parse_frame(mutate(rng, rng.choice(base)))
            accepted += 1
        except ValueError:
            refused += 1
    return accepted, refused


def run_network(socket_path: str, seconds: float = float("inf"), seed: int = 0, frames: int | None = None) -> int:
    """Sends mutated frames to a gateway, each on a fresh connection after a valid
    hello, for `seconds` or `frames` frames; returns how many were sent. The
    gateway must stay up and serving."""
    rng = random.Random(seed)
    base = seeds()[2:6]
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and (frames is None or sent < frames):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(socket_path)
            s.sendall(wire.frame(wire.HELLO, 1, wire.hello()))
            s.recv(65536)
            try:
                s.sendall(mutate(rng, rng.choice(base)))
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
            except OSError:
                pass  # the gateway closed first: fine
        sent += 1
    return sent
