# SPDX-License-Identifier: Apache-2.0
"""A child forked while a thread of its parent is inside a native log line logs its own line and exits (fork40 item
2): util/log.cc's lock of a line had no fork handler, so a child forked while a thread held it waited for ever in its
first line. tests/cpp/log_fork_test.cc: two threads log in a loop while the main thread forks children one after
the other, each logging one line and exiting; every child must be gone within its bound (a hang: killed, counted)."""

from __future__ import annotations

from tests.support import cpp


def test_forked_children_log_while_threads_log(tmp_path):
    binary = cpp.build("log_fork_test", tmp_path, dirs=("util",))
    out = cpp.run(binary, "300", timeout=600)
    assert "0 children hung" in out, out[-3000:]
