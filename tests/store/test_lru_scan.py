# SPDX-License-Identifier: Apache-2.0
"""Review 33a's findings F2-F4 in the card store (/work/notes/review33a.md; F1 and F5: test_evict_header.py), each
a C++ program on a fault device that failed on the code of session 32:

- lru_span_test (F2): exists(), get and get_via_bounce refreshed only the region of an object's header, so the
  object used most recently was evicted with a region it continues into (LRU was FIFO for objects spanning
  regions).
- unreadable_header_test (F4): an object header block that cannot be read at open cost every object behind it in
  its region (the walk ended there, the open padded to the region's end); now its own record only, the pad over the
  span the walk stepped over hiding what that open could not see (also when the block is the card's last record, and
  when the pad cannot be written).
- fill_promise_test (F3): what a card holds before its first eviction, as docs/card_format.md (Capacity) states it:
  97% for chunk sizes a multiple of 4 KiB from 256 KiB up to 1/35 of the card, 96% for 256 KiB + 1 and 260 KiB + 1
  (a block of padding each; the format is kept).
"""

from __future__ import annotations

import pytest

from tests.support import cpp


@pytest.mark.parametrize("name", ["lru_span_test", "unreadable_header_test", "fill_promise_test"])
def test_lru_scan_program(tmp_path, name):
    cpp.run(cpp.build(name, tmp_path), timeout=300)
