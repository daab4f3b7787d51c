# SPDX-License-Identifier: Apache-2.0
import sys, time
from pathlib import Path
sys.path.insert(0, ".")
from tests.support import cpp
name, *args = sys.argv[1:]
t = time.time()
outs = cpp.run_split(Path(f"/tmp/ct28/bin/{name}/{name}"), *args, timeout=1800, shown=3000)
for o in outs:
    print("\n".join(l for l in o.splitlines() if "shard" in l or "failures" in l))
print("run_split ok", round(time.time() - t, 1))
