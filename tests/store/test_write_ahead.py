# SPDX-License-Identifier: Apache-2.0
"""A disk store's copy and CRC off the write's path: put_each prepares item i+1 (fill or copy, and CRC) while
item i's write is in flight, then waits for it and settles it as before (session 37, brief aio37).

Builds tests/cpp/write_ahead_test.cc with the store and the fault device (a DeferredWriteDevice: each submitted
write held until its wait) and runs it: the order of fills and waits, staged copies made before the write ahead of
them was waited for, and every outcome when the write in flight fails, the next item's fill throws (its own
exception, std::bad_alloc), or the next item is refused or its source fails; then on a card image in tmp_path
(Linux AIO where tmp_path is a disk) (see the .cc file).
"""

from __future__ import annotations

from tests.support import cpp


def test_next_store_prepared_while_a_write_is_in_flight(tmp_path, monkeypatch):
    binary = cpp.build("write_ahead_test", tmp_path)
    out = cpp.run(binary, str(tmp_path / "card.img"), timeout=300)
    assert "writes_overlapped" in out, out[-2000:]
    # The card's synchronous writer (what a failed io_setup falls back to): the same stores, none overlapped.
    monkeypatch.setenv("ADP_CARD_AIO", "0")
    cpp.run(binary, str(tmp_path / "card.img"), timeout=300)
