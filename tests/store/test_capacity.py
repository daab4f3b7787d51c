# SPDX-License-Identifier: Apache-2.0
"""Capacity of a card (issue 8, item 1), one test per object size class.

Format 3 shares one write frontier between writers and lets a record continue
into the next region, so a card loses no region tail to the object size and
no region to a writer holding it open. On a 2 GiB card (the smallest the
target names), for each size class from 256 KiB to 64 MiB, powers of two and
not, smaller than a region, about one region and several regions:
  - before the first eviction the card holds every object that fits in its
    regions' bytes (each object costs its payload rounded up to 4 KiB and one
    4 KiB header; each region one 4 KiB header): at least 97% of the card
    where whole objects allow it (31 objects of 64 MiB are 96.9% of 2 GiB),
    for sizes a multiple of 4 KiB (docs/card_format.md, Capacity: a size that
    is not pays up to a block of padding more, 256 KiB + 1 byte 96.4-96.9%;
    5 MiB + 12345 here pays 0.08% and holds 97%);
  - after 1.25x the card has been stored (steady state), at least 95%;
  - objects that continue into other regions read back byte-exact, also after
    a reopen; after the reopen the card holds the same objects.
The card's fill at its first eviction (stats' first_eviction_*: the payload
held then, stores then in flight and acknowledged later included) is every
object that fits, with one writer or sixteen; tests/cpp/first_eviction_test.cc
checks on a fault device that it counts a key once, no failed store and not
the store that evicted.
Card images on /dev/shm (sparse, removed after each test) where it exists.
"""

from __future__ import annotations

import mmap
import os
import threading

import pytest

from lmcache_adp import ADPConnector, CardStore
from tests.helpers import MIB, RawConnector
from tests.support import cpp

GIB = 1 << 30
BLOCK = 4096
CARD = 2 * GIB


@pytest.fixture
def big_card(tmp_path):
    base = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    path = os.path.join(base, f"adp-capacity-test-{os.getpid()}-{threading.get_ident()}.img")
    yield path
    if os.path.exists(path):
        os.unlink(path)


def aligned_value(size: int, tag: int) -> mmap.mmap:
    """A page-aligned buffer (the store's zero-copy path), marked with `tag`."""
    m = mmap.mmap(-1, size)
    m[:8] = tag.to_bytes(8, "little")
    m[size - 8 :] = tag.to_bytes(8, "little")
    return m


def footprint(size: int) -> int:
    return BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK


SIZES = [256 << 10, 1 * MIB, 3 * MIB, 5 * MIB + 12345, 16 * MIB, 32 * MIB, 48 * MIB, 64 * MIB]


@pytest.mark.parametrize("size", SIZES, ids=[f"{s / MIB:g}MiB" for s in SIZES])
def test_card_holds_its_capacity(big_card, size):
    s = CardStore(big_card, CARD, durable=False)
    st = s.stats()
    regions, region = st["num_regions"], st["region_bytes"]
    fits = regions * (region - BLOCK) // footprint(size)  # every object that fits in the regions
    buf = aligned_value(size, 0)
    first = 0
    stored = 0
    i = 0
    while stored < 1.25 * CARD:
        buf[:8] = i.to_bytes(8, "little")
        buf[size - 8 :] = i.to_bytes(8, "little")
        s.put(f"obj-{i}", buf)
        stored += size
        i += 1
        st = s.stats()
        if st["evicted_objects"] == 0:
            first = st["objects"]
    assert first == fits, f"before the first eviction {first} objects of {size} bytes, {fits} fit"
    # One writer: nothing is in flight when the card fills.
    assert (st["first_eviction_held_bytes"], st["first_eviction_inflight_stores"]) == (fits * size, 0)
    assert first * size >= min(0.97 * CARD, fits * size)
    # The layout's own cost (a 4 KiB header per object and per region). 96.5%, not DESIGN's 97%, only for whole
    # 64 MiB objects on a 2 GiB card (review34 F6): 32 of them are the card's every byte, so headers leave room for
    # 31, 96.9%; every other size here fits 98.4% or more (128 regions of 16769024 bytes). The bound is the 64 MiB
    # case's with 0.4% to spare: a layout costing more than that (e.g. a lost region) fails it at every size.
    assert fits * size >= 0.965 * CARD
    held = st["objects"]
    assert held * size >= 0.95 * CARD, f"steady state holds {held * size / CARD:.1%} of the card"
    # The newest objects (several of them continue into other regions) read
    # back intact, before and after a reopen, and the card holds the same.
    newest = range(i - min(held, 6), i)
    for k in newest:
        got = s.get(f"obj-{k}")
        assert got is not None and len(got) == size
        assert got[:8] == k.to_bytes(8, "little") and got[-8:] == k.to_bytes(8, "little")
    s.close()
    s = CardStore(big_card)
    assert s.stats()["objects"] == held
    for k in newest:
        got = s.get(f"obj-{k}")
        assert got is not None and got[:8] == k.to_bytes(8, "little") and got[-8:] == k.to_bytes(8, "little")
    s.close()


@pytest.mark.parametrize("size", [3 * MIB, 48 * MIB], ids=["3MiB", "48MiB"])
def test_sixteen_writers_share_the_frontier(big_card, size):
    """16 workers storing at once hold no region each: steady >= 95%."""
    c = ADPConnector(card=big_card, card_size_gb=CARD / GIB, num_workers=16)
    raw = RawConnector(c)
    bufs = [aligned_value(size, w) for w in range(16)]
    stored, i, inflight = 0, 0, []
    while stored < 1.25 * CARD:
        while len(inflight) < 16 and stored < 1.25 * CARD:
            inflight.append(c.submit_batch_set([f"obj-{i}"], [memoryview(bufs[i % 16])]))
            i += 1
            stored += size
        ok, err, _ = raw.wait(inflight.pop(0), timeout=120)
        assert ok, err
    for fid in inflight:
        ok, err, _ = raw.wait(fid, timeout=120)
        assert ok, err
    st = c.stats()
    assert st["objects"] * size >= 0.95 * CARD, f"steady state holds {st['objects'] * size / CARD:.1%}"
    # At the first eviction the card held every object that fits: those
    # indexed then and those being written then, all acknowledged since.
    regions, region = st["num_regions"], st["region_bytes"]
    fits = regions * (region - BLOCK) // footprint(size)
    assert st["first_eviction_held_bytes"] == fits * size, (
        f"held at the first eviction: {st['first_eviction_held_bytes'] / size:g} objects, {fits} fit"
    )
    assert st["first_eviction_inflight_acked"] == st["first_eviction_inflight_stores"]
    assert st["first_eviction_inflight_failed"] == 0
    assert st["first_eviction_held_bytes"] >= min(0.97 * CARD, fits * size)
    # The newest objects read back whole (most continue into another region;
    # on a tmpfs card a load copies from the mapping, piece by piece).
    out = bytearray(size + 1)
    dst = memoryview(out)[1:]  # not 4 KiB aligned: the copying path
    for k in range(i - 4, i):
        ok, err, _ = raw.get([f"obj-{k}"], [dst])
        assert ok, err
        assert dst == memoryview(bufs[k % 16]), f"obj-{k} differs"
    c.close()


def test_first_eviction_stat_counts_what_the_card_held(tmp_path):
    """tests/cpp/first_eviction_test.cc on a fault device: stores in flight at
    the first eviction count once acknowledged, a failed one (its write
    failed, or its caller gave up) not at all, a re-stored key once, the
    store whose reservation evicted not at all."""
    cpp.run(cpp.build("first_eviction_test", tmp_path), timeout=120)
