# SPDX-License-Identifier: Apache-2.0
import os
import struct

import pytest

from lmcache_adp import _native

google_crc32c = pytest.importorskip("google_crc32c")


def test_known_vector():
    assert _native.crc32c(b"123456789") == 0xE3069283
    assert _native.crc32c(b"") == 0


@pytest.mark.parametrize("size", [1, 7, 8, 9, 4095, 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 1, 5 * 12288 + 77, 1 << 20])
@pytest.mark.parametrize("misalign", [0, 1, 5])
def test_matches_reference_library(size, misalign):
    data = os.urandom(size + misalign)[misalign:]
    assert _native.crc32c(data) == google_crc32c.value(data)


@pytest.mark.parametrize("size", [511, 512, 513, 527, 528, 575, 576, 577, 639, 640, 655, 4096 + 63, (2 << 20) + 4095])
def test_folding_edges_match_reference_library(size):
    """Around the folding paths' steps (none under 512 bytes, then 64 bytes a step, 16-byte lanes, the last
    bytes by the CRC32 instruction), from an odd address, with and without an initial CRC."""
    data = os.urandom(size + 3)[3:]
    assert _native.crc32c(data) == google_crc32c.value(data)
    head = os.urandom(37)
    assert _native.crc32c(data, _native.crc32c(head)) == google_crc32c.value(head + data)


def test_extend_equals_whole():
    data = os.urandom(100_000)
    part = _native.crc32c(data[:33_333])
    assert _native.crc32c(data[33_333:], part) == _native.crc32c(data)


def test_uses_hardware_here():
    assert _native.crc32c_implementation() in ("vpclmulqdq", "pclmul", "sse4.2", "armv8")


def object_header(image: bytes, key: str) -> tuple[int, int]:
    """(payload offset, payload_crc field) of key's object on a card image (docs/card_format.md)."""
    pos = image.find(key.encode())
    assert pos > 0, f"{key} not on the card"
    header = pos - 64  # ObjectHeader (64 bytes) then the key
    assert image[header : header + 8] == b"ADPOBJT1"
    (payload_crc,) = struct.unpack_from("<I", image, header + 56)
    return header + 4096, payload_crc


@pytest.mark.parametrize("size", [1, 5, 4096, 3 * 4096 + 9, 1000_000])
def test_store_reads_check_while_copying(card, size):
    """put() stages through crc32c_copy and get() checks through it: the CRC on
    the card is the reference library's, and a flipped byte anywhere (first,
    middle, last, in the last partial block) is a checksum failure, not a hit."""
    from lmcache_adp import CardStore

    s = CardStore(card, 64 << 20)
    data = os.urandom(size)
    offsets = sorted({0, size // 2, size - 1})
    for off in offsets:
        s.put(f"crc-{off}-end", data)
    s.put("clean", data)
    image = open(card, "rb").read()
    for key in [f"crc-{off}-end" for off in offsets] + ["clean"]:
        assert object_header(image, key)[1] == google_crc32c.value(data), key
    with open(card, "r+b") as f:
        for off in offsets:
            start, _ = object_header(image, f"crc-{off}-end")
            f.seek(start + off)
            f.write(bytes([image[start + off] ^ 0x01]))
        f.flush()
        os.fsync(f.fileno())
    for i, off in enumerate(offsets):
        assert s.get(f"crc-{off}-end") is None, f"a flipped byte at {off} of {size} was served"
        assert s.stats()["checksum_failures"] == i + 1
    assert s.get("clean") == data
