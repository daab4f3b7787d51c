# SPDX-License-Identifier: Apache-2.0
"""py35 item 5: how late a connector's TCP stall check reads a SIGSTOPped gateway stalled during a large put
(loopback). From the tree's root: flock /work/bench.lock env PYTHONPATH=. python <this file> SIZE_MIB"""

import sys
import tempfile
import time

from lmcache_adp import ADPConnector
from tests.helpers import RawConnector
from tests.support.gateway import Gateway

STALL_S = 2
size = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 64 << 20
d = tempfile.mkdtemp(prefix="adpgw-", dir="/dev/shm")
gw = Gateway(d, tcp=True, card_size_gb=1).start()
conn = ADPConnector(
    gateway=gw.tcp_url, token_file=gw.token_file, num_workers=1, timeout_ms=30000, gateway_stall_s=STALL_S
)
c = RawConnector(conn)
try:
    data = bytes(size)
    for i in range(3):  # warm the connection (receive-buffer autotuning on the gateway's side)
        assert c.set([f"warm@{i}"], [memoryview(data)])[0]
    gw.pause()
    t0 = time.monotonic()
    fid = conn.submit_batch_set(["big@0"], [memoryview(data)])
    while not conn.stats()["gateway_stalled"]:
        time.sleep(0.005)
        if time.monotonic() - t0 > 25:
            break
    print(
        f"put of {size >> 20} MiB to a stopped gateway over TCP (loopback): stalled after {time.monotonic() - t0:.3f} s (gateway_stall_s {STALL_S})"
    )
    import subprocess
    import urllib.parse

    port = urllib.parse.urlparse(gw.tcp_url).port
    print(
        subprocess.run(
            ["ss", "-tn", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True
        ).stdout.strip()
    )
    gw.resume()
    c.wait(fid, timeout=30)
finally:
    conn.close()
    gw.resume()
    gw.stop()
