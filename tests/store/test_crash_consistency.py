# SPDX-License-Identifier: Apache-2.0
"""Crash consistency of the card store on a fault-injecting device.

Builds tests/cpp/card_crash_test.cc with the store and the test double
src_cpp/testing/fault_device.cc, and runs it: a scripted workload with power
cuts (whole, torn, and keeping a seeded subset of the unsynced writes) and
failed writes at a bounded number of write points spread over it, then the
checks after each reopen (no damage counted among them: a crash cuts writes, it damages nothing recovery can
tell from a cut), and a lost region header over two cuts (see the .cc
file). Set
ADP_CRASH_ALL=1 to cut at every write point (minutes instead of seconds).

tests/cpp/card_crash_aligned_test.cc runs the same harness (tests/cpp/crash_harness.h) on values in 4 KiB-aligned
memory, LMCache's page-aligned buffers: the store's one-write path under 1 MiB, its body-then-header path from
1 MiB, and a memory-backed card's pieces, with supersedes and deletes between them, cut at every write point on a
disk-like device (whole, torn after the first and the 128th block, keeping some unsynced writes, failed) and at
every sync; the memory-backed device at a bounded set of points here, at all of them in the slow test.

tests/cpp/card_crash_fill_test.cc runs it on stores from a fill (PutItem::fill, the gateway's path: one staged write,
or 4 MiB pieces then the header; fills failing at their last piece) with pointer stores between them, on a disk-like
device and on a tmpfs card with its mapping (testing/mapped_fault_device.h: each payload copy into the mapping a write
point, cut there by a process crash): a bounded set of write and sync points here, all of them in the slow test.

tests/cpp/card_format_crash_test.cc crashes a blank card's format (its superblock's write and sync, which the harness
never reaches: it arms its faults after the open): a power cut, a process crash and a failed write at every write
point (whole, torn inside the magic, the fields, the CRC, after the superblock), a failed sync then a cut or a process
crash at every sync point, a cut after it; each card reopened read-only (status, verify: nothing written, never
"foreign data") and by a gateway's open (a valid, empty card that works). A torn superblock over a card with data is
refused untouched, telling to run `lmcache-adp format`; an image file created and left without its superblock, or
with it torn, is formatted at the next open.

tests/cpp/card_crash_mt_test.cc runs several writer threads at once on one card (stores, deletes and loads of shared
keys, each thread with its own IoContext): a power cut and a process crash at every write point of the run, the
device logging the order it saw the writes in and which thread's step made each, the checks made against what each
thread saw acknowledged and what was in flight at the cut, and every load during the run checked too (seed 1, three
threads here; four threads, seeds 1-4 and a cut keeping some unsynced writes too in the slow test); and each sync
run of the run failed in turn (a grouped sync failing several threads' steps at once), the threads going on to the
end, then a power cut losing every unsynced write or keeping some, or (session 31) the failed sync losing for good
the writes the device took before it failed (session 32: those completed while it ran too), then a power cut.

tests/cpp/lost_sync_commit_test.cc: a store whose record a failed sync lost for good, and one behind it in its region,
are not acknowledged though a later sync that succeeded answered them; a store after them is placed past the hole.
"""

from __future__ import annotations

import re

import pytest

from tests.support import cpp


def run_crash_program(name: str, tmp_path, *args: str, split: bool = True) -> str:
    """Builds and runs tests/cpp/<name>.cc with `args`, split over two processes at once (cpp.run_split: each
    crashes at its share of the points, all of them between the two; the CI's second core) unless not `split`;
    asserts no check failed and reopens were checked in each. Returns the outputs joined, shard 0's first (the
    one-off scenarios')."""
    if split:
        outputs = cpp.run_split(cpp.build(name, tmp_path), *args, timeout=1800, shown=20000)
    else:
        outputs = [cpp.run(cpp.build(name, tmp_path), *args, timeout=1800, shown=20000)]
    for output in outputs:
        assert " 0 failures; " in output and "reopens checked for damage counted (none may be)" in output
    return "\n".join(outputs)


def test_crash_consistency_on_fault_device(tmp_path):
    output = run_crash_program("card_crash_test", tmp_path)
    assert "unreadable block: card opened" in output
    cpp.check_sync_points(output, every=True)  # both workloads, every sync


# Each store program: what its workload says it stores, what its default selection says it ran, and whether that
# fails every sync point (the fill test's: 16 spread over each workload's, every one in `all`).
STORE_PROGRAMS = {
    "card_crash_aligned_test": (
        "9 aligned stores under 1 MiB, 12 of 1 MiB or more, 2 staged",
        ("disk: all ", "memory-backed: 12 of "),
        True,
    ),
    "card_crash_fill_test": (
        "13 fills, 3 failing fills, 3 pointer stores",
        ("(every crash at 16)", "(process crash only; "),
        False,
    ),
}


@pytest.mark.parametrize("name", STORE_PROGRAMS)
def test_crash_consistency_stores(name, tmp_path):
    stores, ran, every_sync = STORE_PROGRAMS[name]
    output = run_crash_program(name, tmp_path)
    assert stores in output and all(said in output for said in ran), output[-3000:]
    cpp.check_sync_points(output, every=every_sync)


@pytest.mark.slow
@pytest.mark.parametrize("name", STORE_PROGRAMS)
def test_crash_consistency_stores_every_point(name, tmp_path):
    output = run_crash_program(name, tmp_path, "all")
    assert STORE_PROGRAMS[name][0] in output and "(all)" in output, output[-3000:]
    cpp.check_sync_points(output, every=True)


def test_crash_consistency_of_format(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    output = cpp.run(cpp.build("card_format_crash_test", tmp_path), str(images), timeout=600, shown=20000)
    assert "format of a blank card: 2 writes, 2 syncs" in output, output[-3000:]
    assert "2 write points x 36 crashes, 2 sync points x 2 crashes, a cut after the sync" in output, output[-3000:]
    assert "404 runs, 0 failures" in output, output[-3000:]


def assert_every_sync_failed(output: str) -> None:
    """card_crash_mt_test failed each sync point of each seed with the three sync faults: its summary's runs at sync
    points are three times the sync points its seeds' clean runs counted (the fewest of them: "N-M syncs in a clean
    run")."""
    points = sum(
        int(n) for n in re.findall(r"card_crash_mt_test: seed \d+, \d+ threads: up to \d+ writes, (\d+)-", output)
    )
    runs = sum(int(n) for n in re.findall(r"(\d+) runs at sync points", output))
    assert points > 0 and runs == 3 * points, (points, runs, output[-3000:])
    assert "each sync reached and failed" in output


def test_crash_consistency_concurrent_writers(tmp_path):
    # One seed: the split deals out seeds (each process counts its own run's writes), so it is not split.
    output = run_crash_program("card_crash_mt_test", tmp_path, split=False)
    assert "default: 1 seed(s) from 1, 3 threads, 2 faults at writes, 3 at syncs" in output, output[-3000:]
    assert_every_sync_failed(output)


def test_a_store_whose_record_a_failed_sync_lost_is_not_acknowledged(tmp_path):
    output = cpp.run(cpp.build("lost_sync_commit_test", tmp_path))
    for said in ("A failed, absent", "C failed, absent", "D acknowledged, back"):
        assert f"lost_sync_commit_test: {said} after the reopen" in output, output[-3000:]


def test_a_write_a_failed_sync_may_have_lost_is_not_acknowledged(tmp_path):
    # Review 32 S1 (tests/cpp/late_flush_commit_test.cc): a region header that reached the device while a failed
    # sync's round ran (before its device flush), or before it began but counted after, is lost with it; the store
    # written under that region must not be acknowledged. Red on main 6ad33bc: both "A was acknowledged and is lost".
    output = cpp.run(cpp.build("late_flush_commit_test", tmp_path))
    for scenario in ("written during the failed flush", "completed before the failed flush, counted after"):
        said = re.search(rf"late_flush_commit_test: {scenario}: A (.*) after the reopen", output)
        assert said and (said[1].startswith("failed") or said[1] == "acknowledged (ok), back"), output[-3000:]


@pytest.mark.slow
def test_crash_consistency_concurrent_writers_every_seed(tmp_path):
    output = run_crash_program("card_crash_mt_test", tmp_path, "all")  # seeds 1 and 3 in one process, 2 and 4
    assert output.count("all: 4 seed(s) from 1, 4 threads, 3 faults at writes, 3 at syncs") == 2, output[-3000:]
    assert_every_sync_failed(output)
    assert all(f"card_crash_mt_test: seed {seed}, 4 threads" in output for seed in range(1, 5)), output[-3000:]
