# SPDX-License-Identifier: Apache-2.0
"""A durable embedded card's connector worker writes its next store while its last one's flush runs.

Builds tests/cpp/sync_overlap_test.cc with the store, the connector, the embedded backend and the fault
device, and runs it: one worker, the flush of batch 1 held; batch 2 is written meanwhile, neither batch
visible or completed before that flush returns; released, both are acknowledged and on the card after a
reopen; the held flush failed instead, both fail (batch 2 written while it ran) and a later batch is
acknowledged (session 36, brief behind36; see the .cc file).
"""

from __future__ import annotations

from tests.support import cpp


def test_next_store_written_during_the_flush(tmp_path):
    dirs = ("store", "util", "connector", "testing")
    binary = cpp.build("sync_overlap_test", tmp_path, dirs, ("transport/embedded_backend.cc",))
    cpp.run(binary, timeout=300)
