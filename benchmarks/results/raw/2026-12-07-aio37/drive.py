# aio37: store36's driver (raw/2026-12-07-store36/drive.py), with process CPU an object and writes_overlapped
import sys, os, time, statistics, resource
from pathlib import Path
sys.path.insert(0, "benchmarks")
from tools import use_own_tree
use_own_tree(Path("benchmarks").absolute().parents[0])
import bench_connector as bc
d = Path(sys.argv[1]); durable = sys.argv[2] == "1"; reps = int(sys.argv[3]); size = int(float(sys.argv[4]) * bc.MIB) if len(sys.argv) > 4 else 256 << 10
T, K = 2, 2
d.mkdir(parents=True, exist_ok=True)
n = 256 * bc.MIB // size
src = bc.aligned_buffers(n, size); bc.fill_sources(src, 7); dst = bc.aligned_buffers(1, size)
card = d / "card.img"; region = bc.region_for(size)
bc.prefill(card, bc.card_bytes_for(n * size, size, T, region)); bc.format_card(str(card), 0, region)
r = bc.Rounds({"num_workers": T, "io_depth": T, "timeout_ms": 60000, "card": str(card), "durable": durable}, src, dst, T * K, 4, "x")
r.warm()
if os.environ.get("PAUSE"): print("ready", os.getpid(), flush=True); time.sleep(float(os.environ["PAUSE"]))
import gc
if os.environ.get("NOGC"): gc.collect(); gc.disable()
for i in range(reps): r.store(i)
out = r.finish()
print("n", n, "cpu_us_per_object", " ".join(f"{c/n*1e6:.1f}" for c in out["store_cpu_s"]))
print("GB/s", " ".join(f"{n*size/t/1e9:.2f}" for t in out["store_s"]), "cpu_s", " ".join(f"{c:.3f}" for c in out["store_cpu_s"]), "failed", out["failed_keys"])
st = out["stats"]
for k in sorted(st):
    if k.startswith("worker_put_run"): print(k, st[k], "per slice us %.1f" % (st[k]/max(1,st["worker_put_slices"])/1e3))
print("writes_overlapped", st.get("writes_overlapped", "-"), "stores", st.get("stores"))
card.unlink()
