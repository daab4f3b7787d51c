# SPDX-License-Identifier: Apache-2.0
"""Damage recovery can prove is counted, logged and reported by verify (docs/card_format.md, Recovery, "Damaged
media"): bytes written into a card image behind the store's back. A header of this card that fails its checksum,
or a region header the frontier's chain names that is not one, is no crash's cut (every write is of whole 4 KiB
blocks, each a valid record); foreign bytes in a region nothing names, and the crashes of
tests/cpp/card_crash_test.cc (which checks that nothing is counted after each), are not damage."""

from __future__ import annotations

import os
import subprocess
import sys

from lmcache_adp import CardStore
from tests.helpers import corrupt, payload

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


def test_flipped_bit_in_a_mid_chain_region_header_is_counted_logged_and_the_rest_served(card, capfd):
    fill(card)
    with open(card, "r+b") as f:  # region 2's epoch field (offset 16): its checksum no longer matches
        f.seek(region_at(2) + 16)
        b = f.read(1)
        f.seek(region_at(2) + 16)
        f.write(bytes([b[0] ^ 0x04]))
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
    s.close()


def test_corrupt_object_header_in_a_finished_region_is_counted_and_verify_reports_it(card, capfd):
    fill(card)
    corrupt(card, "obj07", 40)  # payload_bytes of region 1's third object: its header checksum fails
    capfd.readouterr()
    s = CardStore(card)
    st = s.stats()
    err = capfd.readouterr().err
    # Behind it: obj08 and obj09 (obj07's own header is what is damaged).
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 2), st
    offset = 4096 + 2 * (4096 + SIZE)
    assert f"region 1, offset {offset}: damage, not a crash's cut: an object header of this card" in err, err
    assert "2 records before it are kept" in err and "lost: the record there and 2 objects" in err, err
    assert served(s) == KEYS[:7] + KEYS[10:]
    s.close()
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "verify", "--card", card], capture_output=True, text=True
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.splitlines()[0].endswith(": not clean (below)"), r.stdout
    assert (
        "not checked: 1 regions were found damaged when the card was opened (recovery_damaged_regions: a header that "
        "reads back wrong, no crash's cut): the 2 objects (400.0 KiB) found behind the damage are lost" in r.stdout
    ), r.stdout
    assert f"region 1, offset {offset}: damage" in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "status", "--card", card], capture_output=True, text=True
    )
    assert "damaged at open" in r.stdout and "1 regions (2 objects, 400.0 KiB lost behind the damage)" in r.stdout


def test_superseded_objects_behind_the_damage_are_no_loss(card):
    """Older copies behind the damage (marked deleted when their key was stored again) cost nothing."""
    fill(card)
    s = CardStore(card)
    for k in KEYS[8:10]:  # newer copies of region 1's last two objects, elsewhere
        s.put(k, payload(k, SIZE))
    s.close()
    corrupt(card, "obj07", 40)
    s = CardStore(card)
    st = s.stats()
    assert (st["recovery_damaged_regions"], st["recovery_lost_objects"]) == (1, 0), st
    assert served(s) == KEYS[:7] + KEYS[8:]
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
