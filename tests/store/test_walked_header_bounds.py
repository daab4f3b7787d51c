# SPDX-License-Identifier: Apache-2.0
"""A record header recovery's walk meets is bounded before its length is used (docs/card_format.md, Recovery): one
of this card and the region's epoch, its checksum valid, whose payload_bytes no record can have (over a largest
region, which the index entry's 29 bits hold) is damage, counted and logged as a header that fails its checksum,
not indexed with its length cut to 29 bits."""

from __future__ import annotations

import struct

from lmcache_adp import CardStore
from lmcache_adp._native import crc32c
from tests.helpers import MIB

REGIONS = 600  # 1 MiB each: the card holds more than 512 MiB, so a crafted length over it is within the card


def craft_oversized_record(card: str, key: bytes, payload_bytes: int) -> None:
    """Rewrites the header of region 0's first object (key) to `payload_bytes`, continuing into the regions behind
    it, and writes the headers of those regions so that the continuation checks out (the frontier's chain)."""
    with open(card, "r+b") as f:
        f.seek(MIB)
        rh = f.read(56)
        card_id, epoch = struct.unpack_from("<QQ", rh, 8)
        at = MIB + 4096
        f.seek(at)
        hdr = bytearray(f.read(4096))
        assert hdr[:8] == b"ADPOBJT1" and hdr[64 : 64 + len(key)] == key
        struct.pack_into("<Q", hdr, 40, payload_bytes)
        struct.pack_into("<I", hdr, 48, 2)  # kObjectContinues
        struct.pack_into("<I", hdr, 60, crc32c(key, crc32c(bytes(hdr[:60]))))
        f.seek(at)
        f.write(hdr)
        rem = 4096 + 4096 + (payload_bytes + 4095) // 4096 * 4096 - MIB  # past region 0's end
        r = 0
        while rem:
            take = min(rem, MIB - 4096)
            nx = bytearray(56)
            nx[:8] = b"ADPREGN1"
            struct.pack_into("<QQIIQQI", nx, 8, card_id, epoch + r + 1, r + 1, r, epoch + r, take, 0)
            struct.pack_into("<I", nx, 52, crc32c(bytes(nx[:52])))
            f.seek(MIB + (r + 1) * MIB)
            f.write(nx)
            rem -= take
            r += 1
        assert r + 1 < REGIONS


def test_a_header_whose_length_is_over_a_largest_record_is_damage_not_indexed(card, capfd):
    s = CardStore(card, MIB + REGIONS * MIB, region_bytes=MIB)
    s.put("big", b"x" * 8192)
    s.put("next", b"y" * 8192)
    s.close()
    with open(card, "rb") as f:
        f.seek(MIB)
        assert f.read(8) == b"ADPREGN1"
    # 512 MiB + 8 KiB: the index's 29 bits would keep 8 KiB of it, the size the object really has.
    craft_oversized_record(card, b"big", (1 << 29) + 8192)
    capfd.readouterr()
    s = CardStore(card)
    st = s.stats()
    err = capfd.readouterr().err
    assert st["recovery_damaged_regions"] == 1, st
    assert "region 0, offset 4096: damage, not a crash's cut" in err and "beyond the card or a largest record" in err
    assert s.get("big") is None and st["objects"] == 1, st  # "next", behind it, is found by the resumed walk
    assert s.get("next") == b"y" * 8192
    s.close()
