# SPDX-License-Identifier: Apache-2.0
"""The gateway populates a registered segment's written pages in the background (proto::SegmentPrefaulter,
issue 10 item 2), so the first loads into them need not.

Builds tests/cpp/segment_prefault_test.cc with the segment code and runs it (also under ASan and TSan, in
tests/sanitizers) on files in /dev/shm: after a segment is added, exactly its written pages are present in
the mapping and nothing was allocated; a load's prepare() over them makes no call, over a hole it does; a file
registered twice is gone over once; a piece a load populated first is skipped; released by its last holder,
stopped, or destroyed while it runs, it lets go within a piece and the mapping goes; a file shrunk under it
stops it with a WARNING; where the kernel refuses MADV_POPULATE_WRITE it does nothing. Through a live
gateway: tests/gateway/test_segments.py."""

from __future__ import annotations

from tests.support import cpp

SOURCES = ("util",), ("protocol/client_segment.cc",)


def test_segment_prefault_populates_written_pages_and_lets_go(shm_dir, tmp_path):
    out = cpp.run(cpp.build("segment_prefault_test", tmp_path, *SOURCES), shm_dir, timeout=300)
    shrunk = [line for line in out.splitlines() if "in the background stopped at offset 16777216" in line]
    assert len(shrunk) == 1 and "WARNING" in shrunk[0] and "Bad address" in shrunk[0], out[-3000:]
    assert "seg-shrunk" in shrunk[0] and "loads populate their own pages from there" in shrunk[0], shrunk
