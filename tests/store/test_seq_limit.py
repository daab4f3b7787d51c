# SPDX-License-Identifier: Apache-2.0
"""A store's seq must fit the index entry's 46 bits (store/key_index.h, kMaxIndexSeq). Recovery sets the next seq
past the highest it walked, and past it by 2^32 at each read-write open that could neither zero nor read what is
behind a region header it did not walk (docs/card_format.md, Recovery, "A region header not walked"); once the next seq is past the 46 bits a
store is refused (NoSpace), not indexed under its seq cut to 46 bits (where its load compared the card's full seq
with the cut one and missed, and its tombstone carried the cut seq)."""

from __future__ import annotations

import struct

import pytest

from lmcache_adp import CardStore
from lmcache_adp._native import crc32c
from tests.helpers import MIB

MAX_INDEX_SEQ = (1 << 46) - 1


def set_first_seq(card: str, key: bytes, seq: int) -> None:
    """Rewrites the seq of region 0's first object (key), its header checksum recomputed."""
    with open(card, "r+b") as f:
        f.seek(MIB + 4096)
        hdr = bytearray(f.read(4096))
        assert hdr[:8] == b"ADPOBJT1" and hdr[64 : 64 + len(key)] == key
        struct.pack_into("<Q", hdr, 24, seq)
        struct.pack_into("<I", hdr, 60, crc32c(key, crc32c(bytes(hdr[:60]))))
        f.seek(MIB + 4096)
        f.write(hdr)


def test_a_store_past_the_index_seq_width_is_refused_not_cut_to_46_bits(card):
    s = CardStore(card, MIB + 16 * MIB, region_bytes=MIB)
    s.put("a", b"a" * 8192)
    s.close()
    set_first_seq(card, b"a", MAX_INDEX_SEQ - 1)
    s = CardStore(card)
    assert s.get("a") == b"a" * 8192
    s.put("b", b"b" * 8192)  # seq MAX_INDEX_SEQ: the last that fits
    assert s.get("b") == b"b" * 8192
    with pytest.raises(Exception, match="sequence"):
        s.put("c", b"c" * 8192)
    assert s.get("c") is None
    with pytest.raises(Exception, match="sequence"):
        s.put("a", b"A" * 8192)  # the old code: the new copy missed and the old one marked deleted, "a" lost
    assert s.get("a") == b"a" * 8192 and s.get("b") == b"b" * 8192
    s.close()
    s = CardStore(card)
    assert s.get("a") == b"a" * 8192 and s.get("b") == b"b" * 8192 and s.get("c") is None
    s.close()


@pytest.mark.parametrize("seq", [1 << 46, (1 << 46) + 5, (1 << 64) - 1], ids=["2^46", "2^46+5", "2^64-1"])
def test_a_record_whose_seq_is_past_the_index_width_is_damage_not_indexed_cut(card, seq):
    """A record found with a seq no build writes (past 46 bits): damage, counted, not indexed under its seq cut to
    46 bits. Before: the key indexed under the cut seq (its load missed: the card's seq differs), the next seq past
    the index width (every store refused for good: 2^46, 2^46+5), or at 2^64-1 wrapped (the seq + 1 of the merge
    is 0) so stores after it ranked below it at the next open."""
    s = CardStore(card, MIB + 16 * MIB, region_bytes=MIB)
    s.put("a", b"a" * 8192)
    s.put("b", b"b" * 8192)
    s.close()
    set_first_seq(card, b"a", seq)
    s = CardStore(card)
    st = s.stats()
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 1)
    assert s.get("a") is None and s.get("b") == b"b" * 8192
    s.put("c", b"c" * 8192)  # before: refused (2^46, 2^46+5)
    s.put("a", b"A" * 8192)
    assert s.get("a") == b"A" * 8192 and s.get("c") == b"c" * 8192
    s.close()
    s = CardStore(card)
    # before, at 2^64-1: the old 'a' (ranked by its full seq) over the new one, which was marked deleted
    assert s.get("a") == b"A" * 8192 and s.get("b") == b"b" * 8192 and s.get("c") == b"c" * 8192
    s.close()
