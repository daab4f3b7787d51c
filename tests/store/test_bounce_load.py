# SPDX-License-Identifier: Apache-2.0
"""CardStore::get_via_bounce with its pieces on a PiecePool, as the gateway's process loads run it:
every byte right at sizes around the 256 KiB piece, from several threads at once (the CRC joined over
pieces done out of order), a sink that refuses a piece, two loaders on one pool.

Builds tests/cpp/bounce_load_test.cc with the store and runs it on a card image on tmpfs (pieces from
the mapping) and on one in tmp_path (staged, then written out in pieces, unless tmp_path is tmpfs
too); under ASan and TSan in tests/sanitizers/test_sanitizers.py.
"""

from __future__ import annotations

from tests.support import cpp


def test_bounce_loads_on_a_piece_pool(tmp_path):
    cpp.run_on_cards(cpp.build("bounce_load_test", tmp_path), tmp_path, tmpfs_says="memory_speed=1")
