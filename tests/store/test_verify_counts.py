# SPDX-License-Identifier: Apache-2.0
"""verify counts as checked only the objects it read and judged: one deleted while it read (none while it holds
the card alone) is counted gone, one it had no memory to read into is counted no_memory, not bad, and --repair
leaves it (tests/cpp/verify_test.cc on the fault device, the address space held with RLIMIT_AS)."""

from __future__ import annotations

from tests.support import cpp


def test_verify_counts_what_it_did_not_judge_apart(tmp_path):
    cpp.run(cpp.build("verify_test", tmp_path))
