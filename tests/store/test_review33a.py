# SPDX-License-Identifier: Apache-2.0
"""Review 33a's findings in the card store (/work/notes/review33a.md), each a C++ program on a fault device
that fails on the code of session 32:

- evict_header_test (F1): a key evicted while its region's new header is not yet (or never) on the card, then
  deleted (NotFound: nothing written), is back after a reopen;
- lru_span_test (F2): a load refreshes only the region of an object's header, so the object read most
  recently is evicted with a region it continues into;
- fill_promise_test (F3): 256 KiB + 1 byte chunks fill 96.4% of a card before its first eviction, under
  DESIGN.md's 97% for chunks of 256 KiB and up;
- unreadable_header_test (F4): one unreadable object header block at open costs every object behind it in its
  region, not only its own;
- bad_region_header_test (F5): a region header block that refuses writes, on a full card, fails every store from
  then on (the region is handed out again at once, its header write fails again).
"""

from __future__ import annotations

import pytest

from tests.support import cpp


@pytest.mark.parametrize(
    "name",
    [
        "evict_header_test",
        "lru_span_test",
        "fill_promise_test",
        "unreadable_header_test",
        "bad_region_header_test",
    ],
)
def test_review33a_program(tmp_path, name):
    cpp.run(cpp.build(name, tmp_path), timeout=300)
