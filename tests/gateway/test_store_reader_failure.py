# SPDX-License-Identifier: Apache-2.0
"""A connection's store reader that cannot be made, or whose job throws (session 26, gwexc26 item 2;
ADP_TEST_STORE_READER_FAIL, docs/testing.md): the store takes the buffer path, or fails with the reason, and the
connection goes on (tests/cpp/store_reader_fail_test.cc; under ASan and TSan: tests/sanitizers/test_sanitizers.py).
Each allocation on the reader failed in turn: tests/store/test_no_thread.py."""

from __future__ import annotations

import shutil
import tempfile

from tests.support import cpp


def test_a_store_reader_failure_fails_that_store_only(tmp_path):
    binary = cpp.build("store_reader_fail_test", tmp_path, ("store", "util", "gateway", "protocol"))
    shm = tempfile.mkdtemp(prefix="adp-store-reader-fail-", dir="/dev/shm")
    try:
        out = cpp.run(binary, shm, timeout=120)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    assert "store_reader_fail_test: PASS" in out, out[-3000:]
