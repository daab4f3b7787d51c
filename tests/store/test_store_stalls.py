# SPDX-License-Identifier: Apache-2.0
"""Brief stall34 (session 34): what a store waiting for a region blocks, and the back-off of a tombstone whose block
refuses writes, each a C++ program on a fault device that fails on the code of session 33:

- region_wait_test (L1): every region pinned by a load in flight, a store that must open a region waits for one
  (holding frontier_mu_); a load and a delete complete meanwhile, and a store queued behind it gives up with it,
  5 s from its own start (until session 34 its 5 s began when the first gave up: ~5 s after it); and a put larger
  than the card (its earlier objects' regions pinned by itself) waits for none of them, also where a load pins one
  of them too (15 s for 3 objects past the card before review34b, 5 s before session 35), and still waits for a
  region a load alone pins;
- tombstone_backoff_test (L4): a superseded copy's tombstone refused by its block is retried by the next store,
  then every 2nd, 4th, .. (8 writes over 200 stores; 201 before, one a store), the newer copy and a delete still
  hold after the reopen, and a delete writes its own key's pending void whatever its back-off; a backed-off
  tombstone whose older copy's region is reused lets go of its guards at the next store (review34b: until its
  back-off ran out, 24 of 61 objects' room held); a key stored anew into its older copy's region pins no guard there
  (session 35: that region was never evicted while the tombstone was refused).
"""

from __future__ import annotations

import pytest

from tests.support import cpp


@pytest.mark.parametrize("name", ["region_wait_test", "tombstone_backoff_test"])
def test_store_stall_program(tmp_path, name):
    cpp.run(cpp.build(name, tmp_path), timeout=300)
