# SPDX-License-Identifier: Apache-2.0
# Runs the real test function on a prebuilt (deliberately buggy) binary: cpp.build returns it.
import sys, tempfile, traceback
from pathlib import Path
sys.path.insert(0, ".")
from tests.support import cpp
from tests.store import test_crash_consistency as t
binary = Path(sys.argv[1])
cpp.build = lambda name, out, *a, **k: binary
try:
    t.test_crash_consistency_stores("card_crash_fill_test", Path(tempfile.mkdtemp()))
    print("RESULT: PASSED")
except AssertionError as e:
    msg = str(e)
    print("RESULT: FAILED (AssertionError)")
    print("\n".join(l for l in msg.splitlines() if "DELIBERATE" in l or "shard=" in l or "failures" in l or "PASS" in l or l.startswith("(") or "assert" in l)[:4000])
