# SPDX-License-Identifier: Apache-2.0
"""review33b F1: a batch whose guard a worker holds past its deadline (a load into a segment or process memory
whose gateway was stopped mid-object: the revoke waits out the WRITING lease) holds back that future only, as
docs/protocol.md says; a future queued behind it still completes, failed, by its own deadline
(tests/cpp/held_guard_deadline_test.cc, a fake backend, part 1); and close(), waiting for that batch, lets
drain() (called by the binding with the GIL held) return meanwhile (part 2). On c988e8e the deadline thread
waits for the held guard in Batch::mark_completed, so the queued future is still pending 10 s past its 300 ms
deadline; close() waits for it holding the connector's lock, so drain() blocks 10 s. The held future itself stays
pending while its guard is held (its buffer may still be written: review33b N2) and completes once let go: timed
out, or "connector closed" when close() came first. Also under ASan and TSan (tests/sanitizers)."""

from __future__ import annotations

from tests.support import cpp


def test_a_held_guard_holds_back_no_other_futures_deadline(tmp_path):
    binary = cpp.build("held_guard_deadline_test", tmp_path, ("store", "util", "connector"))
    cpp.run(binary, timeout=120)
