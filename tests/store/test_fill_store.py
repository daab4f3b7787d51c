# SPDX-License-Identifier: Apache-2.0
"""Stores from a source that fills the pieces (PutItem::fill): a fill that fails part way, a source
that changes while it is read, crash points of a filled store.

Builds tests/cpp/fill_store_test.cc with the store and runs it on a card image on tmpfs (the store
fills the card's mapping), on one in tmp_path (staged, unless tmp_path is tmpfs too) and on the
in-memory fault device.
"""

from __future__ import annotations

from tests.support import cpp


def test_filled_stores(tmp_path):
    cpp.run_on_cards(cpp.build("fill_store_test", tmp_path), tmp_path, tmpfs_says="mapped=1")
