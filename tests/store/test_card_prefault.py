# SPDX-License-Identifier: Apache-2.0
"""A tmpfs card's written extents are mapped in the background after open (CardDevice::start_prefault),
so the first pass of loads over a card another process wrote takes no page fault per page.

Builds tests/cpp/card_prefault_test.cc with the store and runs it (also under ASan and TSan, in
tests/sanitizers): after open the mapping's present pages are exactly the image's written extents and its
allocated blocks did not grow; stopping it, or closing the card while it runs, stops it part-way and
cleanly; a disk card, or ADP_CARD_PREFAULT=0, starts no thread. Card images go to /dev/shm (tmpfs) and to tmp_path (disk)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path

from lmcache_adp import CardStore
from tests.support import cpp

BLOCK = 4096


def test_prefault_maps_written_extents_only_and_stops_on_close(shm_dir, tmp_path):
    cpp.run(cpp.build("card_prefault_test", tmp_path), shm_dir, str(tmp_path), timeout=300)


def test_the_prefault_scans_no_more_than_a_piece_under_the_inode_lock(shm_dir, tmp_path):
    """tmpfs's SEEK_HOLE walks the page cache to the extent's end with the image's inode lock held, which every
    pwritev of the card (a store's header, a pad) takes too: the first store after an 8 GiB card's open waited
    42 ms behind it. tests/cpp/card_prefault_seek_test.cc records the prefault's lseeks (it stands in for the C
    library's) and checks that none scans more than a piece, and that the written pages are still all mapped."""
    cpp.run(cpp.build("card_prefault_seek_test", tmp_path), shm_dir, timeout=300)


# Stores into a tmpfs card and ends without closing it: the frontier's tail is left unpadded, as a crash leaves it.
CRASH = """
import os, sys
from lmcache_adp import CardStore
s = CardStore(sys.argv[1], 64 << 20)
for i in range(5):
    s.put(f"k{i}", bytes([i]) * 300_000)
os._exit(0)
"""


def test_the_open_after_a_crash_pads_the_cut_before_the_prefault_starts(shm_dir, capfd):
    """The pad over a crash's cut is written before the prefault starts (CardStore::Open starts it once the open is
    done): behind a running prefault the pad's write waited ~50 ms on an 8 GiB card. The pad is on the card after
    the open, and the prefault's "mapped in" line comes after the open's "opened card" line (it came before, a small
    card's extents being mapped long before its walk ends, while the prefault started ahead of the open)."""
    card = os.path.join(shm_dir, "card.img")
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", CRASH, card], cwd=root, check=True, capture_output=True)
    crashed = Path(card).read_bytes()
    capfd.readouterr()
    s = CardStore(card)
    padded = Path(card).read_bytes()  # what the open wrote (tmpfs: pwrite and read see the same pages)
    assert s.get("k4") == bytes([4]) * 300_000
    log, deadline = "", time.monotonic() + 30
    while "written extents mapped in" not in log and time.monotonic() < deadline:
        time.sleep(0.01)
        log += capfd.readouterr().err
    s.close()
    changed = [b for b in range(0, len(padded), BLOCK) if padded[b : b + BLOCK] != crashed[b : b + BLOCK]]
    assert len(changed) == 1, f"the open pads one block (the frontier's tail): {changed}"
    pad = padded[changed[0] : changed[0] + BLOCK]
    assert pad[:8] == b"ADPOBJT1" and struct.unpack_from("<I", pad, 48)[0] & 4, "a pad record"
    opened, mapped = log.find("opened card " + card), log.find("written extents mapped in")
    assert 0 <= opened < mapped, log
