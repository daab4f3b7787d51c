# SPDX-License-Identifier: Apache-2.0
"""Damage recovery can prove is counted, logged and reported by verify (docs/card_format.md, Recovery, "Damaged
media"): bytes written into a card image behind the store's back. A header of this card that fails its checksum,
or a region header the frontier's chain names that is not one, is no crash's cut (every write is of whole 4 KiB
blocks, each a valid record); foreign bytes in a region nothing names, and the crashes of
tests/cpp/card_crash_test.cc (which checks that nothing is counted after each), are not damage."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from lmcache_adp import CardStore, crc32c
from tests.helpers import corrupt, object_byte, payload
from tests.support import cpp

MIB = 1 << 20
SIZE = 200 << 10  # footprint 204 KiB: five fill a 1 MiB region after its header, so keys 5r..5r+4 are region r's
KEYS = [f"obj{i:02d}" for i in range(20)]  # regions 0-3


def fill(card) -> dict:
    s = CardStore(card, 64 * MIB)
    for k in KEYS:
        s.put(k, payload(k, SIZE))
    st = s.stats()
    s.close()
    assert st["region_bytes"] == MIB
    return st


def region_at(r: int) -> int:
    return MIB + r * MIB  # the data area starts at 1 MiB


def write_at(card, at: int, data: bytes) -> None:
    with open(card, "r+b") as f:
        f.seek(at)
        f.write(data)


def served(s) -> list[str]:
    return [k for k in KEYS if s.get(k) == payload(k, SIZE)]


def flip_region_epoch(card, r: int) -> None:
    """Flips a bit of region r's epoch field (offset 16): its header checksum no longer matches."""
    with open(card, "r+b") as f:
        f.seek(region_at(r) + 16)
        b = f.read(1)
        f.seek(region_at(r) + 16)
        f.write(bytes([b[0] ^ 0x04]))


def test_flipped_bit_in_a_mid_chain_region_header_is_counted_logged_and_the_rest_served(card, capfd):
    fill(card)
    flip_region_epoch(card, 2)
    capfd.readouterr()
    s = CardStore(card)
    st = s.stats()
    err = capfd.readouterr().err
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 5), st
    assert st["recovery_lost_bytes"] == 5 * SIZE and st["media_errors"] == 0, st
    assert served(s) == KEYS[:10] + KEYS[15:]  # region 2's five lost, the others served
    (line,) = [ln for ln in err.splitlines() if "ERROR" in ln]
    assert f"card {card}: region 2, offset 0: damage, not a crash's cut: a region header of this card that " in line
    assert "does not check out (its checksum or region index); the region is taken as free; " in line, line
    assert "lost: 5 objects (0.98 MiB) found behind it. The rest of the card is served" in line, line
    s.put("after", payload("after", SIZE))  # the card works on
    s.close()


def test_garbage_region_header_is_damage_where_the_chain_names_it_and_foreign_bytes_elsewhere(card, capfd):
    fill(card)
    garbage = os.urandom(4096)
    write_at(card, region_at(1), garbage)  # region 2's header names region 1: the frontier came from there
    write_at(card, region_at(40), garbage)  # no region names region 40: bytes from before the format, say
    capfd.readouterr()
    s = CardStore(card)
    st = s.stats()
    err = capfd.readouterr().err
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 5), st
    assert (
        "region 1, offset 0: damage, not a crash's cut: not a region header of this card, though region 2 names" in err
    )
    assert "region 40" not in err
    assert served(s) == KEYS[:5] + KEYS[10:]
    assert s.verify()["damaged_spans"] == [
        f"region 1, offset 0 (its header) to {MIB}: not a region header of this card, though region 2 names it as "
        "the region the frontier came from (the region taken as free: 5 objects found behind it lost)"
    ]
    s.close()


def test_behind_a_damaged_region_header_a_header_whose_length_disagrees_with_its_flag_is_not_followed(card, capfd):
    """What a damaged region header cost is looked for behind it (find_behind_damage), with the walk's check of a
    header since session 21: a block that decodes as a header of this card and the region's epoch but whose length
    runs past the region's end with no continue flag is no record the card wrote (its flag always agrees: the walk
    does not follow one). Here obj10's header (region 2's first record) is made one (payload_bytes 2 MiB, its checksum
    made good) and region 2's header damaged. Red before: the look checked only the checksum and the length's bound,
    followed it past the region's end and counted 1 object of 2 MiB lost where obj11-obj14 (4 of 200 KiB) were."""
    fill(card)
    at = region_at(2) + 4096
    with open(card, "rb") as f:
        f.seek(at)
        hdr = bytearray(f.read(4096))
    assert hdr[:8] == b"ADPOBJT1"
    assert struct.unpack_from("<I", hdr, 48)[0] & 2 == 0  # flags: no kObjectContinues
    struct.pack_into("<Q", hdr, 40, 2 * MIB)  # payload_bytes: past the region's end
    (key_bytes,) = struct.unpack_from("<I", hdr, 52)
    struct.pack_into("<I", hdr, 60, crc32c(bytes(hdr[64 : 64 + key_bytes]), crc32c(bytes(hdr[:60]))))
    write_at(card, at, bytes(hdr))
    flip_region_epoch(card, 2)
    capfd.readouterr()
    s = CardStore(card)
    st = s.stats()
    err = capfd.readouterr().err
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 4), st
    assert st["recovery_lost_bytes"] == 4 * SIZE, st
    assert "lost: 4 objects (0.78 MiB) found behind it" in err, err
    assert served(s) == KEYS[:10] + KEYS[15:]
    s.close()


def offset_in_region(card, key: str) -> int:
    """Offset of key's header block in its region."""
    with open(card, "rb") as f:
        return (object_byte(f.read(), key, 0) - MIB) % MIB


@pytest.mark.parametrize("at", [40, 64])  # payload_bytes (the record's length unknown), the key's first byte
def test_a_damaged_object_header_costs_its_object_only_and_verify_checks_the_rest(card, capfd, at):
    fill(card)
    corrupt(card, "obj07", at)  # region 1's third object of five: its header checksum fails
    capfd.readouterr()
    s = CardStore(card)
    st = s.stats()
    err = capfd.readouterr().err
    assert served(s) == [k for k in KEYS if k != "obj07"]  # obj08 and obj09, behind it, load (bytes checked)
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"], st["recovery_lost_bytes"]) == (1, 1, SIZE)
    assert st["objects"] == 19 and st["checksum_failures"] == 0, st
    offset = 4096 + 2 * (4096 + SIZE)
    (line,) = [ln for ln in err.splitlines() if "ERROR" in ln]
    assert f"region 1, offset {offset}: damage, not a crash's cut: an object header of this card" in line, line
    assert f"; the walk resumed at offset {offset + 4096 + SIZE}, the next header of the region's epoch" in line, line
    assert "lost: 1 objects (0.20 MiB), the record of each damaged header" in line, line
    assert "; 4 records of the region kept. The rest of the card is served" in line, line
    s.put("after", payload("after", SIZE))  # the card works on
    s.close()
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "verify", "--card", card], capture_output=True, text=True
    )
    assert r.returncode == 1, r.stdout + r.stderr
    first = r.stdout.splitlines()[0]
    assert ": 20 objects, " in first and first.endswith(": not clean (below)"), r.stdout  # obj08, obj09 checked
    assert (
        "not checked: 1 regions were found damaged when the card was opened (recovery_damaged_regions: a header that "
        "reads back wrong, no crash's cut): 1 objects (200.0 KiB) are lost, the record of each damaged object header "
        "(the walk resumed behind it: what it found is checked above)" in r.stdout
    ), r.stdout
    assert (
        f"\ndamaged at open: region 1, offset {offset} to {offset + 4096 + SIZE}: an object header of this card under "
        "the region's epoch 2 that fails its checksum (or names a key over 1024 bytes) (its record lost; the walk "
        f"resumed at {offset + 4096 + SIZE})\n" in r.stdout
    ), r.stdout
    assert f"region 1, offset {offset}: damage" in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "status", "--card", card], capture_output=True, text=True
    )
    assert "damaged at open" in r.stdout and "1 regions (1 objects, 200.0 KiB lost to the damage)" in r.stdout


@pytest.mark.parametrize("victims", [("obj06", "obj08"), ("obj06", "obj07"), ("obj09",)])
def test_damaged_headers_apart_adjacent_or_last_in_the_region_cost_their_objects_only(card, capfd, victims):
    fill(card)
    for k in victims:
        corrupt(card, k, 40)
    capfd.readouterr()
    s = CardStore(card)
    st = s.stats()
    err = capfd.readouterr().err
    n = len(victims)
    assert served(s) == [k for k in KEYS if k not in victims]
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"], st["recovery_lost_bytes"]) == (1, n, n * SIZE)
    (line,) = [ln for ln in err.splitlines() if "ERROR" in ln]
    if victims == ("obj09",):  # the region's last: nothing behind it
        assert "; no header of the region's epoch checks out behind it; lost: 1 objects" in line, line
    else:  # the second damaged header is its own span, the walk resumed behind it
        assert f"; then offset {offset_in_region(card, victims[1])}: an object header of this card" in line, line
    s.close()


def test_the_walk_resumed_behind_the_damage_keeps_a_record_that_spans_into_the_next_region(card, capfd):
    """300 KiB objects (footprint 304 KiB): three fit a region after its header, the fourth continues into the
    region the frontier opens next. Damage to its header costs it alone; damage to the one before it, too: the
    walk resumed behind it follows the record into the next region, whose objects load as well."""
    big = 300 << 10
    keys = [f"big{i:02d}" for i in range(12)]
    s = CardStore(card, 64 * MIB)
    for k in keys:
        s.put(k, payload(k, big))
    s.close()
    spanning = keys[3]
    assert offset_in_region(card, spanning) + 4096 + big > MIB
    for victim in (spanning, keys[2]):
        corrupt(card, victim, 40)
        capfd.readouterr()
        s = CardStore(card)
        st = s.stats()
        assert [k for k in keys if s.get(k) == payload(k, big)] == [k for k in keys if k != victim]
        assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 1), (victim, st)
        assert st["recovery_lost_bytes"] == big, (victim, st)  # its part in both regions
        assert "ERROR" in capfd.readouterr().err
        s.close()
        corrupt(card, victim, 40)  # its header back as it was: the next round damages another one


def test_a_stale_header_of_an_older_epoch_in_the_damaged_span_is_not_resurrected(card, capfd):
    """A region reused under a new epoch with larger objects, the first of which lost some payload blocks to a cut
    (its header landed): those blocks hold the headers of the evicted objects, whole, of the older epoch. The walk
    resumed behind that record's damaged header steps over them to the next header of the region's epoch: the
    evicted keys stay gone."""
    s = CardStore(card, 64 * MIB)
    regions = s.stats()["capacity_bytes"] // MIB
    old = [f"old{i:03d}" for i in range(5 * regions)]  # every region full of 200 KiB objects
    for k in old:
        s.put(k, payload(k, SIZE))
    with open(card, "rb") as f:
        before = f.read()
    new = [f"new{i:02d}" for i in range(4)]
    for k in new:  # 500 KiB each: the first evicts the oldest region and is stored after its new header
        s.put(k, payload(k, 500 << 10))
    st = s.stats()
    s.close()
    assert st["evicted_regions"] >= 1, st
    with open(card, "rb") as f:
        start = object_byte(f.read(), "new00", 0)
    assert (start - MIB) % MIB == 4096, "new00 is not the first record of its region"
    olds = [b for b in range(start + 4096, start + 4096 + (500 << 10), 4096) if before[b : b + 8] == b"ADPOBJT1"]
    for b in olds:  # the older bytes that a cut left in place of new00's payload blocks
        write_at(card, b, before[b : b + 4096])
    stale = [before[b + 64 : b + 70].decode() for b in olds]
    assert len(stale) == 2 and all(k in old for k in stale), stale
    corrupt(card, "new00", 40)
    capfd.readouterr()
    s = CardStore(card)
    st = s.stats()
    err = capfd.readouterr().err
    assert not any(s.exists(k) for k in stale), [k for k in stale if s.exists(k)]
    assert [k for k in new if s.get(k) == payload(k, 500 << 10)] == new[1:]
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 1), st
    assert f"the walk resumed at offset {4096 + 504 * 1024}, the next header" in err, err
    s.close()


def test_a_cut_still_ends_the_walk(card):
    """Older bytes in place of a header (here zeros: a store cut before its header landed) are no damage: the
    walk ends there, as before, and the stores behind it (never acknowledged) are not found."""
    fill(card)
    with open(card, "rb") as f:
        at = object_byte(f.read(), "obj07", 0)
    write_at(card, at, bytes(4096))
    s = CardStore(card)
    st = s.stats()
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (0, 0), st
    assert served(s) == KEYS[:7] + KEYS[10:]
    s.close()


def test_superseded_copies_behind_the_damage_are_resolved_as_any_other(card):
    """Older copies behind the damage (marked deleted when their key was stored again) are found by the resumed
    walk and lose to their newer copies, as anywhere."""
    fill(card)
    s = CardStore(card)
    for k in KEYS[8:10]:  # newer copies of region 1's last two objects, elsewhere
        s.put(k, payload(k, SIZE))
    s.close()
    corrupt(card, "obj07", 40)
    s = CardStore(card)
    st = s.stats()
    assert served(s) == KEYS[:7] + KEYS[8:] and st["objects"] == 19, st
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 1), st
    s.close()


def test_an_undamaged_card_counts_nothing_and_verify_is_clean(card):
    fill(card)
    write_at(card, region_at(50) + 8192, os.urandom(4096))  # bytes in a free region: nothing reads them
    s = CardStore(card)
    st = s.stats()
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"], st["recovery_lost_bytes"]) == (0, 0, 0)
    s.close()
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "verify", "--card", card], capture_output=True, text=True
    )
    assert r.returncode == 0 and "recovery_damaged_regions" not in r.stdout, r.stdout


def test_damage_resume_on_a_fault_device(tmp_path):
    """tests/cpp/damage_resume_test.cc: two damaged headers in a region (one of a record continuing into the
    next) cost their records only; a store that failed behind a hole that could not be marked is voided on the
    card, so a walk resumed behind damage in front of the hole does not bring back a key deleted after it; an
    unreadable block inside a read-ahead window behind damage costs nothing in front of it."""
    cpp.run(cpp.build("damage_resume_test", tmp_path), timeout=300)


def test_unseen_region_header_on_a_fault_device(tmp_path):
    """tests/cpp/unseen_region_test.cc: a region header recovery could not walk at a read-write open (unreadable,
    then readable again; reading back wrong in the frontier's region) does not bring the region's records back
    over what was stored or deleted after that open: the header is zeroed, the next epoch is set past the unseen
    one, and where the zeroing fails the object headers behind it are zeroed and the next seq set past the highest
    found (the 2^32 margin only where a block behind cannot be read)."""
    cpp.run(cpp.build("unseen_region_test", tmp_path), timeout=300)


def test_open_after_a_clean_close_writes_nothing(tmp_path):
    """tests/cpp/clean_reopen_test.cc: a clean close pads the frontier's tail, so an open after it writes and syncs
    nothing (open and close leave the image byte-identical); after a power cut the open still pads it."""
    cpp.run(cpp.build("clean_reopen_test", tmp_path), timeout=300)
