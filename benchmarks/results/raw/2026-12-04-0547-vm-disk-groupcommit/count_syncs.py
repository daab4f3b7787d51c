"""Stores 2 MiB objects (1 GiB a repetition, 3 repetitions after a warm-up) through an embedded durable
connector, 2 workers, batches of 4 keys, 4 in flight (probe_store_sync's "embedded durable" row), from the
tree whose benchmarks/ is the cwd. Run under `strace -f -c -e trace=fdatasync` to count the fdatasyncs."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import bench_connector as bc  # noqa: E402

work = Path(sys.argv[1])
work.mkdir(parents=True, exist_ok=True)
T, K, size = int(sys.argv[2]) if len(sys.argv) > 2 else 2, 2, 2 * bc.MIB
n = 1024 * bc.MIB // size
src = bc.aligned_buffers(n, size)
bc.fill_sources(src, 7)
dst = bc.aligned_buffers(1, size)
card = work / "card.img"
region = bc.region_for(size)
bc.prefill(card, bc.card_bytes_for(n * size, size, T, region))
bc.format_card(str(card), 0, region)
r = bc.Rounds({"num_workers": T, "io_depth": T, "timeout_ms": 60000, "card": str(card)}, src, dst, T * K, 4, "d")
r.warm()
for i in range(4):
    r.store(i)
print("store s:", " ".join(f"{t:.3f}" for t in r.out["store_s"]), "failed keys:", r.out["failed_keys"])
r.finish()
card.unlink()
