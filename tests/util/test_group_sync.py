# SPDX-License-Identifier: Apache-2.0
"""GroupSync, the group commit of a card's fdatasync (src_cpp/util/group_sync.h): callers that come
while a flush runs share the next one, each caller's flush began after its call, a failed flush fails
every caller it covered and no other; FaultDevice syncing through it still loses at a power cut only
writes no successful sync covered.

Builds tests/cpp/group_sync_test.cc with src_cpp/util and src_cpp/testing and runs it (under TSan:
tests/sanitizers/test_sanitizers.py)."""

from __future__ import annotations

from tests.support import cpp


def test_group_sync(tmp_path):
    cpp.run(cpp.build("group_sync_test", tmp_path, ("util", "testing")), timeout=300)
