# SPDX-License-Identifier: Apache-2.0
"""PiecePool, the helpers that write the pieces of the gateway's process loads beside the
connections' threads (src_cpp/util/piece_pool.h): every piece once, a slot on one thread at a time,
helpers only where CPUs are spare, a failing piece stops its job only, a stalled helper holds back its
own job only, stop() with pieces in flight, the CRC of pieces joined in order (crc32c_combine).

Builds tests/cpp/piece_pool_test.cc with src_cpp/util and runs it (under ASan and TSan:
tests/sanitizers/test_sanitizers.py)."""

from __future__ import annotations

from tests.support import cpp


def test_piece_pool(tmp_path):
    cpp.run(cpp.build("piece_pool_test", tmp_path, ("util",)), timeout=300)
