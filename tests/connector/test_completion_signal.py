# SPDX-License-Identifier: Apache-2.0
"""The connector's completion hand-off (convoy36): each completion is queued before the eventfd write that
signals it, and the write is made with the connector's mutex released (it was made under it, and the driver
it woke queued on the mutex in drain(): tmpfs loads' `done` 30-55 us a 256 KiB slice, load36).

tests/cpp/completion_signal_test.cc interposes write(): at each eventfd write a probe thread's drain() must
take the mutex (10 s, else the program fails: the write was made holding it) and the completions drained by
then must number the writes seen (a write before its completion finds one short); the driver waits on the
eventfd alone, so a lost wake-up fails its 30 s poll. 8 workers with stores, loads and lookups submitted from
two threads, loads past a 5 ms deadline (the deadline thread's completions), loads pending at close(). Also
under ASan and TSan (tests/sanitizers/test_sanitizers.py)."""

from __future__ import annotations

from tests.support import cpp


def test_every_completion_is_queued_before_its_signal_written_unlocked(tmp_path):
    binary = cpp.build("completion_signal_test", tmp_path, ("store", "util", "connector", "testing"),
                       ("transport/embedded_backend.cc",))  # fmt: skip
    cpp.run(binary, timeout=300)
