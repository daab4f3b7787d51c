# SPDX-License-Identifier: Apache-2.0
"""tests/gateway/test_gateway_death_in_place.py's client, run in a PID namespace of its own (unshare --pid) or in
the gateway's: stores one object, then loads it into a /dev/shm buffer (a segment: the gateway writes it in place
under the load lease) again and again, printing each result, until stdin closes or a load fails. In its own
namespace the gateway's pid is not visible here: SO_PEERCRED gives the connector pid 0 for it."""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time

from lmcache_adp import ADPConnector
from tests.helpers import RawConnector

url, size, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]  # the caller removes the file
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.ftruncate(fd, size)
buf = mmap.mmap(fd, size)  # kept by name: the connector opens the file by its name to register it
c = RawConnector(ADPConnector(gateway=url, num_workers=1, timeout_ms=3000, process_memory=False))
assert c.set(["pidns@obj"], [memoryview(b"\x5a" * size)])[0]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    t0 = time.monotonic()
    ok, err, per_key = c.get(["pidns@obj"], [memoryview(buf)])
    print(f"load ok={ok} hit={per_key} in {time.monotonic() - t0:.3f} s {err}", flush=True)
    if not ok:
        break
print("done", flush=True)
