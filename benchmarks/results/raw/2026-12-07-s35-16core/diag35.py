"""Session 35 diagnostic: block-layer requests (/proc/diskstats) of the medium's O_DIRECT reads/writes and of
the card's loads/stores, 256 KiB objects, on the local disk. Run from /tmp: python3 diag.py REPO DIR DEV."""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/benchmarks")
import bench_connector as bc

DIR, DEV = Path(sys.argv[2]), sys.argv[3]
DIR.mkdir(parents=True, exist_ok=True)

def ds():
    for line in open("/proc/diskstats"):
        f = line.split()
        if f[2] == DEV:
            return [int(x) for x in f[3:14]]

def show(tag, a, b, dt, nbytes):
    d = [y - x for x, y in zip(a, b)]
    rd, rmerge, rsec, rms, wr, wmerge, wsec, wms, _, io_ms, wtd = d
    print(f"{tag:28s} {nbytes / dt / 1e9:6.2f} GB/s  reads {rd:6d} (merged {rmerge:5d}) {rsec * 512 / max(rd, 1) / 1024:7.1f} KiB/rq "
          f"{rms / max(rd, 1) * 1000:7.0f} us/rq | writes {wr:6d} (merged {wmerge:5d}) {wsec * 512 / max(wr, 1) / 1024:7.1f} KiB/rq "
          f"{wms / max(wr, 1) * 1000:7.0f} us/rq | busy {io_ms} ms of {dt * 1000:.0f}", flush=True)

size = int(float(sys.argv[4]) * bc.MIB) if len(sys.argv) > 4 else 256 << 10
for workers in (2, 4):
    n = (512 * bc.MIB) // size
    card = DIR / "card.img"
    region = bc.region_for(size)
    span = bc.card_bytes_for(n * size * 4, size, workers, region)
    bc.prefill(card, span)
    src = bc.aligned_buffers(n, size); bc.fill_sources(src, 7)
    dst = bc.aligned_buffers(n, size)
    for rep in range(2):
        bc.medium_pass(card, src, workers, True)
        a = ds(); t = bc.medium_pass(card, src, workers, True); show(f"w{workers} medium write", a, ds(), t, n * size)
        a = ds(); t = bc.medium_pass(card, dst, workers, False); show(f"w{workers} medium read", a, ds(), t, n * size)
    bc.format_card(str(card), 0, region)
    r = bc.Rounds({"card": str(card), "num_workers": workers, "io_depth": workers, "timeout_ms": 60000}, src, dst, workers * 4, 4, "d")
    r.warm()
    for rep in range(2):
        a = ds(); r.store(rep); show(f"w{workers} card store", a, ds(), r.out["store_s"][-1], n * size)
        a = ds(); r.load(); show(f"w{workers} card load", a, ds(), r.out["load_s"][-1], n * size)
    print("   failed", r.out["failed_keys"], "mismatched", r.out["mismatched"])
    r.close()
    card.unlink()
