# SPDX-License-Identifier: Apache-2.0
"""populate_write (src_cpp/util/populate.h), the one MADV_POPULATE_WRITE of segment loads and tmpfs card stores:
a range it cannot populate (read-only, unaligned) fails that call only, not taken for a kernel that refuses the
call; once refused (the test hook, as a kernel before Linux 5.14) no call is made. The gateway's side, each
refusal logged and asked once per process: tests/gateway/test_segments.py.

Builds tests/cpp/populate_test.cc with src_cpp/util and runs it on a file in /dev/shm."""

from __future__ import annotations

import tempfile

from tests.support import cpp


def test_populate_write(tmp_path):
    with tempfile.TemporaryDirectory(prefix="adppop-", dir="/dev/shm") as shm:
        cpp.run(cpp.build("populate_test", tmp_path, ("util",)), shm, timeout=120)
