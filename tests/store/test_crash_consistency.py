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
"""

from __future__ import annotations

from tests.support import cpp


def test_crash_consistency_on_fault_device(tmp_path):
    output = cpp.run(cpp.build("card_crash_test", tmp_path), timeout=1800, shown=20000)
    assert "unreadable block: card opened" in output
    assert " 0 failures; " in output and "reopens checked for damage counted (none may be)" in output
