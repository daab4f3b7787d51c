# SPDX-License-Identifier: Apache-2.0
"""The frontier region's header read back with its magic (or card_id) wrong: no valid region names the frontier's
region as the one the frontier came from, so judge_damage does not count it as damage and recovery takes the region
for free, its epoch (the newest) and its records' seqs unseen (docs/card_format.md, Recovery, "A region header not
walked"). The region, free and the lowest, is then the first handed out, under its own old epoch: after a crash
(no close pads the tail) the records of its last opening behind the first new one walk as valid again, a key
deleted after the open (a miss, nothing written) back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lmcache_adp import CardStore
from tests.helpers import MIB

SIZE = 16000  # footprint 20 KiB: 51 records fill a 1 MiB region's 1020 KiB


def value(i: int) -> bytes:
    return bytes([i % 251]) * SIZE


# Opens the card, stores "new" (the first store: the lowest free region, region 1, at 4 KiB over more-0), deletes
# more-1 (not in the index: nothing written) and ends without closing (a crash: the tail is not padded).
AFTER = """
import os, sys
from lmcache_adp import CardStore
s = CardStore(sys.argv[1])
s.put("new", bytes([200]) * 16000)
s.remove("more-1")
os._exit(0)
"""


# The magic's first byte (not this card's: no damage counted), or the reserved field at 48 (the checksum fails:
# damage). The second is unseen_region_test's case, with a crash in place of its clean close, whose pad (19014b4)
# hides the records behind "new" whatever the epoch.
@pytest.mark.parametrize("at", [0, 48], ids=["magic", "checksum"])
def test_a_frontier_region_header_read_back_wrong_is_not_reopened_under_its_old_epoch(card, at):
    s = CardStore(card, MIB + 8 * MIB, region_bytes=MIB)
    for i in range(51):
        s.put(f"fill-{i}", value(i))
    for i in range(5):
        s.put(f"more-{i}", value(51 + i))
    s.close()
    with open(card, "r+b") as f:  # region 1's header
        f.seek(2 * MIB)
        assert f.read(8) == b"ADPREGN1"
        f.seek(2 * MIB + at)
        b = f.read(1)
        f.seek(2 * MIB + at)
        f.write(bytes([b[0] ^ 1]))
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", AFTER, card], cwd=root, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    with open(card, "rb") as f:
        f.seek(2 * MIB + 4096)
        assert f.read(64)[:8] == b"ADPOBJT1"  # "new" is region 1's first record
    s = CardStore(card)
    assert s.get("new") == bytes([200]) * SIZE
    assert s.get("more-1") is None, "more-1, lost with its region's header and deleted after, is back"
    assert s.get("fill-7") == value(7)
    s.close()
