# SPDX-License-Identifier: Apache-2.0
"""A load or store that fails for want of this process's memory (staging, a bounce buffer) is counted in
memory_failures, not io_errors: the card did not fail, and the card stays healthy
(tests/cpp/memory_failure_test.cc, the address space held with RLIMIT_AS)."""

from __future__ import annotations

from tests.support import cpp


def test_memory_failures_are_not_card_io_errors(tmp_path):
    cpp.run(cpp.build("memory_failure_test", tmp_path))
