# put256's store driver: bench_connector's Rounds (2 workers, batches of 2 x 2 keys, 4 in flight) storing REPS x
# 256 MiB of SIZE_MB objects on a fresh card in DIR, as aio37's driver (raw/2026-12-07-aio37/drive.py) does, with
# two markers for tracers: a 0-byte pwrite64 to /dev/null at offset 1 before the timed stores and 2 after; with PAUSE
# set, "ready PID" is printed and PAUSE seconds slept before the first marker, "done" and PAUSE seconds after the
# second (probe.sh attaches `perf trace` / `perf record` in between). Prints GB/s and process CPU an object of each
# repetition and the change of every store stat over the timed stores.
# usage (from the tree's root): python drive.py DIR DURABLE(0/1) REPS [SIZE_MB]
import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
from tools import use_own_tree  # noqa: E402

use_own_tree(Path("benchmarks").absolute().parents[0])
import bench_connector as bc  # noqa: E402

WORKERS, KEYS_PER_WORKER, WINDOW = 2, 2, 4


def numeric_stats(conn) -> dict:
    return {k: v for k, v in conn.stats().items() if isinstance(v, (int, float))}


def rounds_on_fresh_card(where: Path, durable: bool, size: int):
    """(Rounds, card path, objects a repetition): the card prefilled and formatted as bench_connector's rows have it."""
    where.mkdir(parents=True, exist_ok=True)
    count = 256 * bc.MIB // size
    sources = bc.aligned_buffers(count, size)
    bc.fill_sources(sources, 7)
    image = where / "card.img"
    region = bc.region_for(size)
    bc.prefill(image, bc.card_bytes_for(count * size, size, WORKERS, region))
    bc.format_card(str(image), 0, region)
    params = {"num_workers": WORKERS, "io_depth": WORKERS, "timeout_ms": 60000, "card": str(image), "durable": durable}
    rounds = bc.Rounds(params, sources, bc.aligned_buffers(1, size), WORKERS * KEYS_PER_WORKER, WINDOW, "x")
    return rounds, image, count


def pause(word: str) -> None:
    if os.environ.get("PAUSE"):
        print(word, flush=True)
        time.sleep(float(os.environ["PAUSE"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("durable", choices=("0", "1"))
    ap.add_argument("reps", type=int)
    ap.add_argument("size_mb", type=float, nargs="?", default=0.25)
    a = ap.parse_args()
    size = int(a.size_mb * bc.MIB)
    rounds, image, count = rounds_on_fresh_card(a.dir, a.durable == "1", size)
    rounds.warm()
    before = numeric_stats(rounds.conn)
    null = os.open("/dev/null", os.O_WRONLY)
    pause(f"ready {os.getpid()}")
    os.pwrite(null, b"", 1)
    for i in range(a.reps):
        rounds.store(i)
    os.pwrite(null, b"", 2)
    pause("done")
    out = rounds.finish()
    print("n", count, "cpu_us_per_object", " ".join(f"{c / count * 1e6:.1f}" for c in out["store_cpu_s"]))
    rates = " ".join(f"{count * size / t / 1e9:.2f}" for t in out["store_s"])
    times = " ".join(f"{t:.3f}" for t in out["store_s"])
    print("GB/s", rates, "store_s", times, "failed", out["failed_keys"])
    after = out["stats"]
    for k in sorted(after):
        if any(w in k for w in ("put", "store", "overlap", "written", "region")):
            print("stat", k, after[k] - (before.get(k, 0) if not bc.GAUGES.get(k) else 0))
    image.unlink()


if __name__ == "__main__":
    main()
