import sys, statistics
sys.path.insert(0, "/work/main/benchmarks")
from pathlib import Path
import bench_connector as b
from lmcache_adp import format_card
MIB = 1 << 20
d = Path("/work/bench-disk/exp"); d.mkdir(parents=True, exist_ok=True)
card = d / "card.img"
size = 32 * MIB; n = 512 * MIB // size
src = b.aligned_buffers(n, size); b.fill_sources(src, 7); dst = b.aligned_buffers(n, size)
b.prefill(card, 3 * 1024 * MIB)
for rnd in range(2):
    for w in (1, 2, 4):
        m = statistics.median([b.medium_pass(card, src, w, True) for _ in range(3)])
        format_card(str(card), 0, b.region_for(size))
        res = b.connector_rounds({"card": str(card), "num_workers": w, "io_depth": w, "timeout_ms": 60000, "durable": False}, src, dst, 3, 2*w, 4, "x")
        s = statistics.median(res['store_s'])
        print(f"workers {w}: medium write {n*size/m/1e9:.2f} store {n*size/s/1e9:.2f} GB/s = {m/s:.2f}x", flush=True)
card.unlink()
