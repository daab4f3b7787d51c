# SPDX-License-Identifier: Apache-2.0
"""The C++ tests' helper wait_for (tests/cpp/test_connector.h) keeps the completions of other futures
it drains for their own wait: two futures completing together, waited for in the reverse order, and a
future pending across run(), each return (tests/cpp/wait_for_test.cc; a lost completion fails there
after 5 s, not at the 60 s default)."""

from __future__ import annotations

from tests.support import cpp


def test_wait_for_keeps_other_futures_completions(tmp_path):
    binary = cpp.build("wait_for_test", tmp_path, ("store", "util", "connector", "testing"),
                       ("transport/embedded_backend.cc",))  # fmt: skip
    cpp.run(binary, timeout=120)
