# SPDX-License-Identifier: Apache-2.0
"""DESIGN.md promises recovery "reported progress on a large card"; docs/card_format.md (Recovery): "Progress is
logged every 5 s". tests/cpp/recovery_progress_test.cc opens a card whose walk takes over 5 s (one region header's
read sleeps 5.5 s on a fault device); at ADP_LOG_LEVEL=INFO the open logs the progress line while it walks
(review34: no test looked for it)."""

from __future__ import annotations

import os
import re

from tests.support import cpp, process_group


def test_a_walk_longer_than_5_s_logs_its_progress(tmp_path):
    binary = cpp.build("recovery_progress_test", tmp_path)
    proc = process_group.run([str(binary)], timeout=120, env={**os.environ, "ADP_LOG_LEVEL": "INFO"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "recovery_progress_test: PASS" in proc.stdout, out[-3000:]
    assert re.search(r"recovering card fault-card: \d+/8 regions scanned, \d+ objects so far", proc.stderr), (
        "no progress line during a walk of 5.5 s:\n" + proc.stderr[-3000:]
    )
