# SPDX-License-Identifier: Apache-2.0
"""A load that reads an object's header while a delete writes its tombstone over it is a miss, not
damage: no checksum failure, no WARNING, the entry not dropped by the load, and the delete still done;
a header damaged the same way with no delete in flight is still damage (tests/cpp/tombstone_race_test.cc
on the fault device, the delete's write held). The race behind connector_stress's rare
"header damaged" under ASan (session sixteen)."""

from __future__ import annotations

from tests.support import cpp


def test_load_racing_a_deletes_tombstone_is_a_miss_not_damage(tmp_path):
    cpp.run(cpp.build("tombstone_race_test", tmp_path))


def test_a_retried_tombstone_of_an_older_copy_keeps_its_key_and_a_failed_read_is_counted(tmp_path):
    """tests/cpp/stale_tombstone_test.cc: the open's tombstone of an older copy (no key given: read from its
    header) is written but not synced, then retried: the retry finds it and writes it again with its key, not
    keyless; a retry that cannot read the header counts the failed read in io_errors."""
    cpp.run(cpp.build("stale_tombstone_test", tmp_path))


def test_a_superseded_copy_stays_dead_while_its_tombstone_is_pending(tmp_path):
    """tests/cpp/continuation_guard_test.cc: a key's newer copy continues into the next region and the older
    copy's tombstone cannot be written (pending); stores then evict a region. Every region the newer copy has bytes
    in stays pinned until that tombstone is on the card but the older copy's own (evicting it drops the older copy
    too: session 35), so after a power cut or a close, and when the open finds both copies and its own tombstone
    write fails, the key serves the newer copy or nothing, never the older."""
    cpp.run(cpp.build("continuation_guard_test", tmp_path))


def test_a_store_that_commits_after_its_newer_copy_left_the_index_is_not_held(tmp_path):
    """tests/cpp/outranked_commit_test.cc: store A of a key is held between its write and its commit while newer
    copies of the key are stored and acknowledged, and the newest leaves the index (its region evicted, or dropped
    as damaged at a load); its tombstones of older copies carry seqs above A's. A is acknowledged as superseded,
    not indexed: what the store answers for the key is what the card gives back after a power cut and a reopen.
    Until session 30 A was indexed and held, and lost at the reopen (card_crash_mt_test, seed=4 point=112)."""
    output = cpp.run(cpp.build("outranked_commit_test", tmp_path))
    assert "evicted: A acknowledged, K not held before the power cut and absent after the reopen" in output
    assert "damaged: A acknowledged, K not held before the power cut and absent after the reopen" in output
