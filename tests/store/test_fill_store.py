# SPDX-License-Identifier: Apache-2.0
"""Stores from a source that fills the pieces (PutItem::fill): a fill that fails part way, a source
that changes while it is read, crash points of a filled store.

Builds tests/cpp/fill_store_test.cc with the store and runs it on a card image on tmpfs (the store
fills the card's mapping), on one in tmp_path (staged, unless tmp_path is tmpfs too) and on the
in-memory fault device.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from tests.support import cpp


def test_filled_stores(tmp_path):
    binary = cpp.build("fill_store_test", tmp_path)
    shm = Path("/dev/shm")
    assert shm.is_dir() and os.access(shm, os.W_OK), "this test needs a writable /dev/shm (tmpfs: the mapped card)"
    out = cpp.run(binary, str(shm / f"adp-fill-{uuid.uuid4().hex}.img"), timeout=300)
    assert "mapped=1" in out, out[-2000:]
    cpp.run(binary, str(tmp_path / "card.img"), timeout=300)
