# SPDX-License-Identifier: Apache-2.0
"""Stores from 4 KiB-aligned memory on a disk card: the body written while its
CRC is computed beside it, the header last (tests/cpp/disk_store_test.cc on the
fault device: round trip, a power cut at every write of such a store, whole and
torn, and a failed write of its body or header)."""

from __future__ import annotations

from tests.support import cpp


def test_aligned_disk_store_survives_cuts_and_failed_writes(tmp_path):
    cpp.run(cpp.build("disk_store_test", tmp_path))
