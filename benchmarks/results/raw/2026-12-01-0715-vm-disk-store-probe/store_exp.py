import sys, time, statistics
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
import bench_connector as b
from lmcache_adp import format_card
MIB = 1 << 20
d = Path("/work/bench-disk/exp"); d.mkdir(parents=True, exist_ok=True)
card = d / "card.img"
for size_mb in (2, 32):
    size = size_mb * MIB
    n = 512 * MIB // size
    src = b.aligned_buffers(n, size); b.fill_sources(src, 7); dst = b.aligned_buffers(n, size)
    b.prefill(card, 3 * 1024 * MIB)
    region = b.region_for(size)
    for rnd in range(2):
        w = statistics.median([b.medium_pass(card, src, 2, True) for _ in range(3)])
        print(f"{size_mb} MiB medium write {n*size/w/1e9:.2f} GB/s", flush=True)
        for durable in (True, False):
            format_card(str(card), 0, region)
            res = b.connector_rounds({"card": str(card), "num_workers": 2, "io_depth": 2, "timeout_ms": 60000, "durable": durable}, src, dst, 3, 4, 4, "x")
            print(f"{size_mb} MiB durable={durable} store {n*size/statistics.median(res['store_s'])/1e9:.2f} GB/s load {n*size/statistics.median(res['load_s'])/1e9:.2f}", flush=True)
card.unlink()
