"""Stores objects of SIZE_KB through an embedded connector (2 workers, batches of 2 keys a worker, 4 in flight:
probe_store_sync's "embedded durable" row), 1 GiB a repetition, a warm-up + 3 repetitions, from the tree whose
benchmarks/ is the cwd. Run under `strace -f -T -e trace=fdatasync -o FILE` to see every fdatasync and its time.
usage: count_syncs.py DIR SIZE_KB [durable 0|1]"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import bench_connector as bc  # noqa: E402

work = Path(sys.argv[1])
work.mkdir(parents=True, exist_ok=True)
T, K, size = 2, 2, int(sys.argv[2]) * 1024
durable = len(sys.argv) < 4 or sys.argv[3] == "1"
n = 1024 * bc.MIB // size
src = bc.aligned_buffers(n, size)
bc.fill_sources(src, 7)
dst = bc.aligned_buffers(1, size)
card = work / "card.img"
region = bc.region_for(size)
bc.prefill(card, bc.card_bytes_for(n * size, size, T, region))
bc.format_card(str(card), 0, region)
params = {"num_workers": T, "io_depth": T, "timeout_ms": 60000, "card": str(card), "durable": durable}
r = bc.Rounds(params, src, dst, T * K, 4, "d")
r.warm()
print("MARK timed start", flush=True)
for i in range(3):
    r.store(i)
print(f"size {size} objects/rep {n} batches/rep {n // (T * K)} durable {durable}")
print("store s:", " ".join(f"{t:.3f}" for t in r.out["store_s"]),
      "GB/s:", " ".join(f"{n * size / t / 1e9:.2f}" for t in r.out["store_s"]), "failed keys:", r.out["failed_keys"])
r.finish()
card.unlink()
