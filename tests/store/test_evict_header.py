# SPDX-License-Identifier: Apache-2.0
"""Review 33a's findings F1 and F5 in the card store's eviction (/work/notes/review33a.md), each a C++ program on a
fault device that fails on the code of session 32:

- evict_header_test (F1, and retry_pending): a key evicted while its region's new header is not yet (or never) on
  the card, then deleted (NotFound: nothing written), was back after a reopen; a pending tombstone in that region
  was dropped while the header was in flight, and the superseded copy was the key's value after the reopen;
- bad_region_header_test (F5): a region header block that refuses writes, on a full card, failed every store from
  then on (the region was handed out again at once, its header write failed again);
- free_region_tombstone_test (session 34: card_crash_mt_test's checksum failure during a live run): a tombstone
  pending in a free region (an eviction whose header did not land), written while a store took that region and
  wrote a record there, overwrote that record's header (fails on the code of session 33);
- transient_retire_test (review33d): a failed sync of an eviction's region header (not a refused write: nothing
  about the block) retired the region as a bad block until the reopen, a region's worth of capacity lost each time.
"""

from __future__ import annotations

import pytest

from tests.support import cpp


@pytest.mark.parametrize(
    "name", ["evict_header_test", "bad_region_header_test", "free_region_tombstone_test", "transient_retire_test"]
)
def test_evict_header_program(tmp_path, name):
    cpp.run(cpp.build(name, tmp_path), timeout=300)
