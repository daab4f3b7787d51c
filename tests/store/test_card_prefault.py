# SPDX-License-Identifier: Apache-2.0
"""A tmpfs card's written extents are mapped in the background after open (CardDevice::start_prefault),
so the first pass of loads over a card another process wrote takes no page fault per page.

Builds tests/cpp/card_prefault_test.cc with the store and runs it (also under ASan and TSan, in
tests/sanitizers): after open the mapping's present pages are exactly the image's written extents and its
allocated blocks did not grow; stopping it, or closing the card while it runs, stops it part-way and
cleanly; a disk card, or ADP_CARD_PREFAULT=0, starts no thread. Card images go to /dev/shm (tmpfs) and to tmp_path (disk)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.support import cpp


@pytest.fixture
def shm_dir():
    shm = Path("/dev/shm")
    assert shm.is_dir() and os.access(shm, os.W_OK), "this test needs a writable /dev/shm (tmpfs: the mapped card)"
    d = tempfile.mkdtemp(prefix="adp-prefault-", dir=shm)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_prefault_maps_written_extents_only_and_stops_on_close(shm_dir, tmp_path):
    cpp.run(cpp.build("card_prefault_test", tmp_path), shm_dir, str(tmp_path), timeout=300)
