import os, sys, time, shutil, tempfile
sys.path.insert(0, os.getcwd())
from tests.gateway.test_segments import ShmPool
from tests.helpers import RawConnector, payload
from tests.support.gateway import Gateway
from lmcache_adp import ADPConnector
from lmcache_adp.gateway_stats import read_gateway_stats
d = tempfile.mkdtemp(prefix="adpprep-", dir="/dev/shm")
gw = Gateway(d).start(env={"ADP_LOAD_PROFILE": 1})
SIZE = 2 << 20; N = 16
pool = ShmPool(N, SIZE)
for v in pool.views: v[:] = b"\1" * SIZE
c = RawConnector(ADPConnector(gateway=gw.unix_url, num_workers=1, timeout_ms=20000))
try:
    keys = [f"p@{i}" for i in range(N)]
    src = [memoryview(bytearray(payload(k, SIZE))) for k in keys]
    assert c.set(keys, src)[0]
    for p in range(4):
        s0 = read_gateway_stats(gw.unix_url)
        assert c.get(keys, pool.views)[0]
        s = read_gateway_stats(gw.unix_url)
        n = s["load_profile_seg_item_n"] - s0["load_profile_seg_item_n"]
        print(f"pass {p}: objects {n}, prepare {(s['load_profile_seg_prepare_ns'] - s0['load_profile_seg_prepare_ns']) / n / 1e3:.1f} us/object, copy {(s['load_profile_seg_copy_ns'] - s0['load_profile_seg_copy_ns']) / n / 1e3:.1f} us/object, populates {s['segment_populates'] - s0['segment_populates']}")
finally:
    c.conn.close(); pool.close(); gw.kill(); shutil.rmtree(d, ignore_errors=True)
