# SPDX-License-Identifier: Apache-2.0
"""Brief stall34 (session 34): what a store waiting for a region blocks, a C++ program on a fault device that fails on
the code of session 33:

- region_wait_test (L1): every region pinned by a load in flight, a store that must open a region waits for one
  (holding frontier_mu_); a load and a delete complete meanwhile, and a store queued behind it gives up with it,
  5 s from its own start (until session 34 its 5 s began when the first gave up: ~5 s after it);
"""

from __future__ import annotations

import pytest

from tests.support import cpp


@pytest.mark.parametrize("name", ["region_wait_test"])
def test_store_stall_program(tmp_path, name):
    cpp.run(cpp.build(name, tmp_path), timeout=300)
