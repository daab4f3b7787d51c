# SPDX-License-Identifier: Apache-2.0
"""Connector-level benchmark: the medium's own O_DIRECT limit and ADPConnector side by side, in one run.

Needs no LMCache (numpy only), so it runs on any machine the package builds on. For every object
size and worker count, on one card image:

  medium     T threads, each doing O_DIRECT pwritev / preadv of object-sized blocks of the card
             image from / into the same warm, page-aligned buffers the connector rows use (the
             limit: what the kernel and the memory do with nothing else in the way)
  embedded   ADPConnector(card=image, num_workers=T, io_depth=T): submit_batch_set /
             submit_batch_get / drain_completions as LMCache's NativeConnectorL2Adapter drives them
  gateway    the same through `lmcache-adp gateway --io-contexts T` over unix:// + shared ring
  clients    (--clients 1,2,4,8) P processes, each its own connector (--client-workers threads) on
             one gateway: aggregate store and load against one process

Every loaded byte is compared with what was stored (a wrong or missing object fails the row).
Rates are GB/s (1e9 bytes/s) of the median of --reps timed repetitions; the medium runs before
and after the connector rows and its better pass is the limit. Writes: the connector acknowledges
a store after an fdatasync per worker slice (durable=true); the medium row ends with one
fdatasync per thread. Raw per-repetition times go to the JSON beside the report.

  python benchmarks/bench_connector.py --workers 2 --sizes-mb 2,32 --total-mb 1024
  python benchmarks/bench_connector.py --workers 4,16 --clients 1,2,4,8 --total-mb 4096
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import mmap
import multiprocessing as mp
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# This tree's package when it is built in place; otherwise the installed one.
if any((ROOT / "lmcache_adp").glob("_native*.so")):
    sys.path.insert(0, str(ROOT))
    os.environ["PYTHONPATH"] = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")

import lmcache_adp  # noqa: E402
from lmcache_adp import ADPConnector, format_card  # noqa: E402

MIB = 1 << 20
BLOCK = 4096
GB = 1e9


_SHM_POOLS: list[str] = []


def _remove_shm_pools() -> None:
    for path in _SHM_POOLS:
        with contextlib.suppress(OSError):
            os.unlink(path)


def aligned_buffers(n: int, size: int) -> list:
    """n page-aligned buffers, touched so that no run pays first-touch faults: anonymous mappings, or
    (ADP_BENCH_L1=shm, --l1 shm) slices of one /dev/shm file, as LMCache's L1 pool with --shm-name."""
    if os.environ.get("ADP_BENCH_L1") == "shm":
        path = f"/dev/shm/adp-bench-l1-{os.getpid()}-{len(_SHM_POOLS)}"
        if not _SHM_POOLS:
            atexit.register(_remove_shm_pools)
        _SHM_POOLS.append(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, n * size)
        pool = mmap.mmap(fd, n * size)
        os.close(fd)
        np.frombuffer(pool, dtype=np.uint8).fill(1)
        return [memoryview(pool)[i * size : (i + 1) * size] for i in range(n)]
    bufs = []
    for _ in range(n):
        m = mmap.mmap(-1, size)
        np.frombuffer(m, dtype=np.uint8).fill(1)
        bufs.append(m)
    return bufs


def fill_sources(bufs: list[mmap.mmap], seed: int) -> None:
    """Random bytes, with the object's index in the first 8 bytes of every 4 KiB block: a load of the
    wrong object, or of a shifted one, cannot compare equal."""
    size = len(bufs[0])
    base = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    for j, b in enumerate(bufs):
        a = np.frombuffer(b, dtype=np.uint8)
        a[:] = base
        a.view(np.uint64).reshape(-1, BLOCK // 8)[:, 0] = (seed << 32) | j


def clear(bufs: list[mmap.mmap]) -> None:
    for b in bufs:
        np.frombuffer(b, dtype=np.uint8).fill(0)


def same(dst: list[mmap.mmap], src: list[mmap.mmap]) -> int:
    """Number of destination buffers that differ from their source."""
    return sum(
        not np.array_equal(np.frombuffer(d, dtype=np.uint8), np.frombuffer(s, dtype=np.uint8))
        for d, s in zip(dst, src, strict=True)
    )


# ---------------------------------------------------------------------------------------------
# The medium


def medium_pass(path: Path, bufs: list[mmap.mmap], threads: int, write: bool) -> float:
    """Seconds for `threads` threads to move every buffer to/from its own object-sized block of the
    image with O_DIRECT (thread t takes blocks t, t + threads, ...)."""
    size = len(bufs[0])
    fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_DIRECT)
    start = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        start.wait()
        try:
            for j in range(t, len(bufs), threads):
                off = j * size
                n = os.pwritev(fd, [bufs[j]], off) if write else os.preadv(fd, [bufs[j]], off)
                if n != size:
                    raise OSError(f"short transfer {n} of {size}")
            if write:
                os.fdatasync(fd)
        except BaseException as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
    os.close(fd)
    if errors:
        raise errors[0]
    return dt


def prefill(path: Path, nbytes: int) -> None:
    """Writes the whole image once (O_DIRECT), as a card in service is: no holes, no first touch."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    chunk = mmap.mmap(-1, 64 * MIB)
    done = 0
    while done < nbytes:
        n = min(len(chunk), nbytes - done)
        os.pwritev(fd, [memoryview(chunk)[:n]], done)
        done += n
    os.fsync(fd)
    os.close(fd)


# ---------------------------------------------------------------------------------------------
# The connector


def drive(conn, op: str, keys: list[str], bufs: list[mmap.mmap], batch: int, window: int) -> tuple[float, int]:
    """Submits batches of `batch` keys, keeping `window` futures in flight; returns (seconds, failed
    keys). A store batch that fails counts all its keys."""
    submit = conn.submit_batch_set if op == "set" else conn.submit_batch_get
    fd = conn.event_fd()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    views = [memoryview(b) for b in bufs]
    sizes: dict[int, int] = {}
    failed = 0
    i = 0
    t0 = time.perf_counter()
    while i < len(keys) or sizes:
        while i < len(keys) and len(sizes) < window:
            fid = submit(keys[i : i + batch], views[i : i + batch])
            sizes[fid] = len(keys[i : i + batch])
            i += batch
        poller.poll(1000)
        for fid, ok, _err, per_key in conn.drain_completions():
            n = sizes.pop(fid)
            if op == "set" or per_key is None:
                failed += 0 if ok else n
            else:
                failed += sum(not k for k in per_key)
    return time.perf_counter() - t0, failed


def connector_rounds(params: dict, src, dst, reps: int, batch: int, window: int, tag: str) -> dict:
    """Stores src under fresh keys `reps` times, then loads the last keys into dst `reps` times,
    checking every loaded byte. Returns the per-repetition seconds and any failure."""
    conn = ADPConnector(**params)
    out: dict = {"store_s": [], "load_s": [], "failed_keys": 0, "mismatched": 0}
    try:
        # Untimed: connections (and rings) set up, workers' regions opened.
        warm = min(len(src), batch * window)
        drive(conn, "set", [f"bench@00000000@0@w{tag}{j:06x}" for j in range(warm)], src[:warm], batch, window)
        keys: list[str] = []
        for r in range(reps):
            keys = [f"bench@00000000@0@{tag}{r:02d}{j:06x}" for j in range(len(src))]
            dt, failed = drive(conn, "set", keys, src, batch, window)
            out["store_s"].append(dt)
            out["failed_keys"] += failed
        for _ in range(reps):
            clear(dst)
            dt, failed = drive(conn, "get", keys, dst, batch, window)
            out["load_s"].append(dt)
            out["failed_keys"] += failed
            out["mismatched"] += same(dst, src)
        out["stats"] = {k: v for k, v in conn.stats().items() if isinstance(v, (int, float))}
    finally:
        conn.close()
    return out


@contextlib.contextmanager
def gateway(card: Path, sock: Path, io_contexts: int, log: Path):
    """`lmcache-adp gateway` owning the card for the duration of the block (SIGTERM after it)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmcache_adp.cli", "gateway", "--card", str(card), "--socket", str(sock)]
            + ["--io-contexts", str(io_contexts)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while "gateway ready" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gateway did not start:\n{log.read_text()}")
                time.sleep(0.05)
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def client_proc(index: int, params: dict, n: int, size: int, batch: int, window: int, barrier, queue) -> None:
    """One of several client processes on one gateway: store n objects, then load them, each phase
    started together with the other clients; reports (phase, t0, t1, failures) per phase."""
    try:
        src = aligned_buffers(n, size)
        fill_sources(src, 1000 + index)
        dst = aligned_buffers(n, size)
        conn = ADPConnector(**params)
        keys = [f"bench@{index:08x}@0@c{j:06x}" for j in range(n)]
        # Untimed, as connector_rounds does: connections and rings set up, a batch stored, and loaded
        # into every destination buffer (shm buffers: the pool registered and mapped by the gateway).
        warm = [f"bench@{index:08x}@0@w{j:06x}" for j in range(batch)]
        drive(conn, "set", warm, src[:batch], batch, window)
        drive(conn, "get", [warm[j % batch] for j in range(n)], dst, batch, window)
        res = []
        for op in ("set", "get"):
            clear(dst)
            barrier.wait(timeout=300)
            t0 = time.time()
            dt, failed = drive(conn, op, keys, src if op == "set" else dst, batch, window)
            res.append((op, t0, t0 + dt, failed))
        mismatched = same(dst, src)
        conn.close()
        queue.put((index, res, mismatched, None))
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        with contextlib.suppress(Exception):
            barrier.abort()
        queue.put((index, [], 0, repr(e)))


def run_clients(params: dict, procs: int, n: int, size: int, batch: int, window: int) -> dict:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    queue = ctx.Queue()
    ps = [
        ctx.Process(target=client_proc, args=(i, params, n, size, batch, window, barrier, queue)) for i in range(procs)
    ]
    for p in ps:
        p.start()
    results = [queue.get(timeout=600) for _ in ps]
    for p in ps:
        p.join(timeout=60)
    errors = [r[3] for r in results if r[3]]
    if errors:
        return {"error": errors[0]}
    out = {"failed_keys": 0, "mismatched": sum(r[2] for r in results)}
    for k, op in enumerate(("set", "get")):
        spans = [r[1][k] for r in results]
        wall = max(s[2] for s in spans) - min(s[1] for s in spans)
        out["store_s" if op == "set" else "load_s"] = wall
        out["failed_keys"] += sum(s[3] for s in spans)
    return out


# ---------------------------------------------------------------------------------------------


def card_bytes_for(total: int, size: int, workers: int, region: int) -> int:
    """Room for two repetitions' objects plus every worker's open region: the keys of the last
    store repetition are never evicted."""
    per_region = max(1, region // (size + 2 * BLOCK))
    regions = 2 * (-(-total // size) // per_region + 1) + 2 * workers + 4
    return 2 * MIB + regions * region


def region_for(size: int) -> int:
    return 64 * MIB if size <= 8 * MIB else 128 * MIB


def gbps(nbytes: int, seconds: float | list[float]) -> float:
    s = statistics.median(seconds) if isinstance(seconds, list) else seconds
    return nbytes / s / GB


def run_config(work: Path, size: int, workers: int, args, rows: list[dict], clients: list[int]) -> None:
    n = max(workers, args.total_mb * MIB // size)
    total = n * size
    region = region_for(size)
    card = work / "card.img"
    span = max(
        card_bytes_for(total, size, workers, region),
        card_bytes_for(args.client_mb * MIB * max(clients or [1]) // 2, size, 16, region),
    )
    print(f"== {size // MIB} MiB x {n} objects, {workers} workers, card {span / 2**30:.1f} GiB", flush=True)
    prefill(card, span)
    src = aligned_buffers(n, size)
    fill_sources(src, 7)
    dst = aligned_buffers(n, size)
    batch = workers * args.keys_per_worker
    base = {"object_mb": size / MIB, "objects": n, "workers": workers, "bytes": total}

    def medium(pass_no: int) -> None:
        medium_pass(card, src, workers, True)  # untimed warm-up
        w = [medium_pass(card, src, workers, True) for _ in range(args.reps)]
        r = []
        for _ in range(args.reps):
            clear(dst)
            r.append(medium_pass(card, dst, workers, False))
        bad = same(dst, src)
        rows.append({**base, "row": "medium O_DIRECT", "pass": pass_no, "store_s": w, "load_s": r, "mismatched": bad})

    medium(1)
    format_card(str(card), 0, region)
    params = {"card": str(card), "num_workers": workers, "io_depth": workers, "timeout_ms": 60000}
    res = connector_rounds(params, src, dst, args.reps, batch, args.window, "e")
    rows.append({**base, "row": "embedded", **res})
    print(f"   embedded: {res['failed_keys']} failed, {res['mismatched']} mismatched", flush=True)
    if not args.no_gateway:
        format_card(str(card), 0, region)
        with gateway(card, work / "gw.sock", max(workers, 16 if clients else workers), work / "gateway.log"):
            gw = {"gateway": f"unix://{work / 'gw.sock'}", "num_workers": workers, "timeout_ms": 60000}
            gw["ring_mb"] = max(64, 2 * args.keys_per_worker * size // MIB)
            # With shm buffers: the ring (direct_loads off) beside loads straight into them.
            for direct in (False, True) if args.l1 == "shm" else (True,):
                label = "gateway unix+segments" if args.l1 == "shm" and direct else "gateway unix+ring"
                res = connector_rounds(
                    {**gw, "direct_loads": direct}, src, dst, args.reps, batch, args.window, "s" if direct else "g"
                )
                rows.append({**base, "row": label, **res})
                print(f"   {label}: {res['failed_keys']} failed, {res['mismatched']} mismatched", flush=True)
            cw = args.client_workers
            for p in clients:
                cp = {**gw, "num_workers": cw}
                nc = max(cw, args.client_mb * MIB // size)
                res = run_clients(cp, p, nc, size, cw * args.keys_per_worker, args.window)
                rows.append({**base, "row": f"gateway, {p} client processes x {cw} workers", "clients": p, **res})
                rows[-1]["bytes"] = nc * size * p
                print(f"   {p} clients: {res}", flush=True)
    medium(2)
    card.unlink()


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        s = {k: r[k] for k in ("row", "object_mb", "workers", "bytes") if k in r}
        for op in ("store", "load"):
            v = r.get(f"{op}_s")
            s[op] = gbps(r["bytes"], v) if v else None
        s["ok"] = not r.get("error") and not r.get("failed_keys") and not r.get("mismatched")
        out.append(s)
    return out


def report(rows: list[dict], args, meta: dict) -> str:
    summ = summarize(rows)
    lines = [
        "# bench_connector: the medium's O_DIRECT limit and ADPConnector in one run",
        "",
        "```",
        meta["command"],
        "```",
        "",
        *[f"- {k}: {v}" for k, v in meta.items() if k != "command"],
        "",
        "GB/s (1e9 B/s), median of the repetitions; bytes of every load checked. Medium = better of its two passes.",
        "",
        "| object | workers | row | store GB/s | load GB/s | store / medium write | load / medium read"
        " | vs embedded (store, load) | bytes ok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keyf = lambda r: (r["object_mb"], r["workers"])  # noqa: E731
    for key in sorted({keyf(r) for r in summ}):
        group = [r for r in summ if keyf(r) == key]
        med = [r for r in group if r["row"] == "medium O_DIRECT"]
        mw = max(r["store"] for r in med) if med else None
        mr = max(r["load"] for r in med) if med else None
        emb = next((r for r in group if r["row"] == "embedded"), None)
        single = next((r for r in group if r["row"].startswith("gateway, 1 client")), None)
        for r in group:
            if r["row"] == "medium O_DIRECT" and r is not med[0]:
                continue
            st, ld = (mw, mr) if r["row"] == "medium O_DIRECT" else (r["store"], r["load"])
            vs_e = ""
            if r["row"].startswith("gateway") and emb:
                vs_e = f"{st / emb['store']:.2f}x, {ld / emb['load']:.2f}x"
            if single and r["row"].startswith("gateway,") and "client processes" in r["row"]:
                p = int(r["row"].split(",")[1].split()[0])
                vs_e += f" (linear: {st / single['store'] / p:.2f}x, {ld / single['load'] / p:.2f}x)"
            lines.append(
                f"| {r['object_mb']:g} MiB | {r['workers']} | {r['row']} | {st:.2f} | {ld:.2f} | "
                f"{st / mw:.2f}x | {ld / mr:.2f}x | {vs_e} | {'yes' if r['ok'] else 'NO'} |"
            )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/dev/shm/lmcache-adp-bench-connector", help="where the card image lives")
    ap.add_argument("--sizes-mb", default="2,32")
    ap.add_argument("--workers", default="2", help="worker (= medium thread) counts, e.g. 4,16")
    ap.add_argument("--total-mb", type=int, default=1024, help="bytes moved per timed repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keys-per-worker", type=int, default=2, help="a batch holds workers x this many keys")
    ap.add_argument("--window", type=int, default=4, help="batches in flight (LMCache bench l2: 4)")
    ap.add_argument("--no-gateway", action="store_true")
    ap.add_argument("--clients", default="", help="client process counts on one gateway, e.g. 1,2,4,8")
    ap.add_argument("--client-workers", type=int, default=2)
    ap.add_argument("--client-mb", type=int, default=512, help="bytes each client process stores and loads")
    ap.add_argument("--clients-at", default="", help="object size (MiB) and workers of the rows that run --clients")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="report directory")
    ap.add_argument("--label", default="connector")
    ap.add_argument(
        "--l1",
        choices=("anon", "shm"),
        default="anon",
        help="load/store buffers: anonymous memory, or one /dev/shm file (LMCache's L1 with --shm-name: the "
        "gateway may then load straight into it; a ring row and a segments row are run)",
    )
    args = ap.parse_args()
    os.environ["ADP_BENCH_L1"] = args.l1  # spawned client processes allocate alike

    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    work = Path(args.dir) / f"run-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    clients = [int(x) for x in args.clients.split(",") if x]
    at = tuple(int(x) for x in args.clients_at.split(",")) if args.clients_at else None
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date (UTC)": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "host": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
        "kernel": platform.release(),
        "package": lmcache_adp.__file__,
        "buffers": args.l1,
        "medium": f"{args.dir} ({subprocess.run(['df', '-T', args.dir], capture_output=True, text=True).stdout.split()[-6]})",
        "load average before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    rows: list[dict] = []
    try:
        for size_mb in (int(x) for x in args.sizes_mb.split(",")):
            for w in (int(x) for x in args.workers.split(",")):
                cl = clients if (at is None or at == (size_mb, w)) else []
                run_config(work, size_mb * MIB, w, args, rows, cl)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta["load average after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = Path(args.out)
    raw = out / "raw" / f"{stamp}-{args.label}"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "rows.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = report(rows, args, meta)
    (out / f"{stamp}-{args.label}.md").write_text(text + f"\nRaw: `raw/{stamp}-{args.label}/rows.json`\n")
    print(text)


if __name__ == "__main__":
    main()
