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
"""

from __future__ import annotations

import pytest

from tests.support import cpp


def test_crash_consistency_on_fault_device(tmp_path):
    output = cpp.run(cpp.build("card_crash_test", tmp_path), timeout=1800, shown=20000)
    assert "unreadable block: card opened" in output
    assert " 0 failures; " in output and "reopens checked for damage counted (none may be)" in output


def check_aligned_output(output: str) -> None:
    assert "9 aligned stores under 1 MiB, 12 of 1 MiB or more, 2 staged" in output
    assert " 0 failures; " in output and "reopens checked for damage counted (none may be)" in output


def test_crash_consistency_aligned_stores(tmp_path):
    output = cpp.run(cpp.build("card_crash_aligned_test", tmp_path), timeout=1800, shown=20000)
    check_aligned_output(output)
    assert "disk: all " in output and "memory-backed: 12 of " in output


@pytest.mark.slow
def test_crash_consistency_aligned_stores_every_point(tmp_path):
    output = cpp.run(cpp.build("card_crash_aligned_test", tmp_path), "all", timeout=1800, shown=20000)
    check_aligned_output(output)
    assert "(all)" in output
