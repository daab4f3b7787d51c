# SPDX-License-Identifier: Apache-2.0
"""Connector-level benchmark: the medium's own O_DIRECT limit and ADPConnector side by side, in one run.

Needs no LMCache (numpy only), so it runs on any machine the package builds on. For every object
size and worker count, on one card image:

  medium     T threads, each doing O_DIRECT pwritev / preadv of object-sized blocks of the card
             image from / into the same warm, page-aligned buffers the connector rows use (the
             limit: what the kernel and the memory do with nothing else in the way)
  embedded   ADPConnector(card=image, num_workers=T, io_depth=T): submit_batch_set /
             submit_batch_get / drain_completions as LMCache's NativeConnectorL2Adapter drives them
  gateway    the same through `lmcache-adp gateway --io-contexts T` over unix://: loads through the
             shared ring (whole or in pieces), written into this process's memory (process_vm_writev,
             r5) or, with --l1 shm, into its /dev/shm pool (segments); --gateway-rows picks them;
             BENCH_GATEWAY_ARGS (environment) adds gateway flags, e.g. "--process-write-threads 0"
  clients    (--clients 1,2,4,8) P processes, each its own connector (--client-workers threads) on
             one gateway (and card) of their own, each phase --client-passes x --client-mb per
             process, --reps phases: aggregate store and load against P x one process, against the
             medium at P x workers threads and against one embedded connector with that many
             workers, both measured in the same run with as many bytes

--interleave: per repetition the embedded store, every gateway row's store, the embedded load, every gateway
row's load (the gateway up throughout, on a card of its own), the order reversed every other repetition (odd r:
the gateway rows last to first, then the embedded one: a linear drift's bias cancels between them), and the report
pairs each gateway repetition with the embedded one beside it: gateway / embedded GB/s per repetition, median
and min..max (README, "--interleave").

Every loaded byte is compared with what was stored (a wrong or missing object fails the row).
Rates are GB/s (1e9 bytes/s) of the median of --reps timed repetitions; the medium runs before
and after the connector rows and its better pass is the limit. Writes: the connector acknowledges
a store after an fdatasync per worker slice (durable=true); the medium row ends with one
fdatasync per thread. Raw per-repetition times go to the JSON beside the report.

  python benchmarks/bench_connector.py --workers 2 --sizes-mb 2,32 --total-mb 1024
  python benchmarks/bench_connector.py --workers 4,16 --clients 1,2,4,8 --total-mb 4096
  python benchmarks/bench_connector.py --workers 2 --sizes-mb 2,32 --total-mb 512 --reps 4 --interleave
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import mmap
import multiprocessing as mp
import os
import platform
import resource
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
# This tree's package when it is built in place, here and in the gateways and client processes it starts;
# otherwise the installed one. Only when run as a script (also through runpy, which puts no benchmarks/ on
# sys.path): a test importing this module changes neither sys.path nor the environment its children inherit.
if __name__ == "__main__":
    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    from tools import use_own_tree

    use_own_tree(ROOT)

import lmcache_adp  # noqa: E402
from lmcache_adp import ADPConnector, format_card  # noqa: E402
from lmcache_adp.gateway_stats import read_gateway_stats  # noqa: E402
from lmcache_adp.log import showing_info  # noqa: E402
from lmcache_adp.stats_catalog import GAUGE, STATS  # noqa: E402

GAUGES = {st.name: st.kind == GAUGE for st in STATS}

MIB = 1 << 20
BLOCK = 4096
GB = 1e9
CLOCK0 = time.monotonic()  # the run's clock: store_at_s / load_at_s count from here


_SHM_POOLS: list[str] = []


def _remove_shm_pools() -> None:
    for path in _SHM_POOLS:
        with contextlib.suppress(OSError):
            os.unlink(path)


def aligned_buffers(n: int, size: int, shm: bool | None = None) -> list:
    """n page-aligned buffers, touched so that no run pays first-touch faults: anonymous mappings, or
    (ADP_BENCH_L1=shm, --l1 shm, or shm=True) slices of one /dev/shm file, as LMCache's L1 pool with
    --shm-name."""
    if shm if shm is not None else os.environ.get("ADP_BENCH_L1") == "shm":
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


def medium_pass(path: Path, bufs: list[mmap.mmap], threads: int, write: bool, passes: int = 1) -> float:
    """Seconds for `threads` threads to move every buffer to/from its own object-sized block of the
    image with O_DIRECT (thread t takes blocks t, t + threads, ...), `passes` times over."""
    size = len(bufs[0])
    fd = os.open(path, (os.O_RDWR if write else os.O_RDONLY) | os.O_DIRECT)

    def work(t: int) -> None:
        for _ in range(passes):
            for j in range(t, len(bufs), threads):
                off = j * size
                n = os.pwritev(fd, [bufs[j]], off) if write else os.preadv(fd, [bufs[j]], off)
                if n != size:
                    raise OSError(f"short transfer {n} of {size}")
        if write:
            os.fdatasync(fd)

    try:
        return timed_threads(threads, work)
    finally:
        os.close(fd)


def timed_threads(threads: int, work) -> float:
    """Seconds from a common start until `threads` threads running work(t) are all done; the first error
    any of them raised is raised here."""
    start = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def run(t: int) -> None:
        start.wait()
        try:
            work(t)
        except BaseException as e:  # noqa: BLE001 - raised below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    dt = time.perf_counter() - t0
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


def cpu_s() -> float:
    """This process's CPU time so far, user + system, all its threads (getrusage RUSAGE_SELF)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class Rounds:
    """One connector's timed repetitions, a step at a time: connector_rounds runs them back to back, and
    --interleave runs the steps of the embedded connector and of every gateway row in turn. Each store
    repetition moves src under fresh keys (`passes` times over, fresh keys per pass); each load repetition
    loads the last stored keys into the zeroed dst and checks every byte. `store_at_s` / `load_at_s` keep
    when each repetition started (seconds on the run's clock): the order the steps really ran in;
    `store_cpu_s` / `load_cpu_s` the process's CPU time over each (getrusage, user + system: the driving thread
    and every connector's workers; the gateway is another process)."""

    def __init__(self, params: dict, src, dst, batch: int, window: int, tag: str, passes: int = 1) -> None:
        self.src, self.dst, self.batch, self.window, self.tag, self.passes = src, dst, batch, window, tag, passes
        self.out: dict = {"store_s": [], "load_s": [], "failed_keys": 0, "mismatched": 0}
        self.out.update(store_at_s=[], load_at_s=[], store_cpu_s=[], load_cpu_s=[])
        self.keys: list[str] = []
        self.conn = ADPConnector(**params)

    # --warm-loads (every row alike): the warm-up also loads keys the card does not hold into dst (misses:
    # nothing is written, nothing populated), so a segments row registers its load pool before the timed
    # repetitions instead of at the first timed load (the gateway's background populate then has rep 0's
    # stores' time; benchmarks/README.md, "Session fifteen").
    warm_loads = False

    def warm(self) -> None:
        """Untimed: connections (and rings) set up, workers' regions opened."""
        warm = min(len(self.src), self.batch * self.window)
        keys = [f"bench@00000000@0@w{self.tag}{j:06x}" for j in range(warm)]
        drive(self.conn, "set", keys, self.src[:warm], self.batch, self.window)
        if self.warm_loads:
            absent = [f"bench@00000000@0@a{self.tag}{j:06x}" for j in range(warm)]
            drive(self.conn, "get", absent, self.dst[:warm], self.batch, self.window)

    def store(self, r: int) -> None:
        self.out["store_at_s"].append(time.monotonic() - CLOCK0)
        cpu = cpu_s()
        dt = 0.0
        for p in range(self.passes):
            self.keys = [f"bench@00000000@0@{self.tag}{r:02d}{p:02d}{j:06x}" for j in range(len(self.src))]
            t, failed = drive(self.conn, "set", self.keys, self.src, self.batch, self.window)
            dt += t
            self.out["failed_keys"] += failed
        self.out["store_s"].append(dt)
        self.out["store_cpu_s"].append(cpu_s() - cpu)

    def load(self) -> None:
        clear(self.dst)
        self.out["load_at_s"].append(time.monotonic() - CLOCK0)
        cpu = cpu_s()
        dt = 0.0
        for _ in range(self.passes):
            t, failed = drive(self.conn, "get", self.keys, self.dst, self.batch, self.window)
            dt += t
            self.out["failed_keys"] += failed
        self.out["load_s"].append(dt)
        self.out["load_cpu_s"].append(cpu_s() - cpu)
        self.out["mismatched"] += same(self.dst, self.src)

    def finish(self) -> dict:
        """The connector's counters, then closed; returns the row's results."""
        try:
            self.out["stats"] = {k: v for k, v in self.conn.stats().items() if isinstance(v, (int, float))}
        finally:
            self.close()
        return self.out

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def connector_rounds(params: dict, src, dst, reps: int, batch: int, window: int, tag: str, passes: int = 1) -> dict:
    """Stores src under fresh keys `reps` times, then loads the last keys into dst `reps` times,
    checking every loaded byte; each repetition moves src `passes` times over (stores: fresh keys per
    pass). Returns the per-repetition seconds and any failure."""
    rounds = Rounds(params, src, dst, batch, window, tag, passes)
    try:
        rounds.warm()
        for r in range(reps):
            rounds.store(r)
        for _ in range(reps):
            rounds.load()
        return rounds.finish()
    finally:
        rounds.close()


def same_package(env: dict[str, str]) -> dict[str, str]:
    """`env` with the tree of the lmcache_adp this process imported first on PYTHONPATH: a gateway it starts runs
    the package it measures (imported by a test or another script, not only when run as a script: use_own_tree)."""
    root = str(Path(lmcache_adp.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


@contextlib.contextmanager
def gateway(card: Path, sock: Path, io_contexts: int, log: Path):
    """`lmcache-adp gateway` owning the card for the duration of the block (SIGTERM after it)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lmcache_adp.cli", "gateway", "--card", str(card), "--socket", str(sock)]
            + ["--io-contexts", str(io_contexts)]
            + os.environ.get("BENCH_GATEWAY_ARGS", "").split(),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=same_package(showing_info(dict(os.environ))),  # the ready line below is INFO
            cwd=card.parent,  # `-m` puts the cwd first on sys.path: a checkout's unbuilt package there (audit 13)
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


def gateway_warnings(log: Path, last: int = 20) -> list[str]:
    """The gateway log's refusals, warnings and errors (the last `last`): why a row went wrong."""
    keep = ("refused", " WARN", " ERROR")
    return [line for line in log.read_text(errors="replace").splitlines() if any(k in line for k in keep)][-last:]


def client_proc(
    index: int, params: dict, n: int, size: int, batch: int, window: int, reps: int, passes: int, barrier, queue
) -> None:
    """One of several client processes on one gateway: `reps` timed store phases, then `reps` timed load
    phases, each started together with the other clients (a barrier) and each moving the process's n
    objects `passes` times (stores: fresh keys per pass; loads: the last pass's keys again). Reports
    (phase, t0, t1, failed keys) per phase on the shared monotonic clock."""
    try:
        src = aligned_buffers(n, size)
        fill_sources(src, 1000 + index)
        dst = aligned_buffers(n, size)
        conn = ADPConnector(**params)
        # Untimed, as connector_rounds does: connections and rings set up, a batch stored, and loaded
        # into every destination buffer (shm buffers: the pool registered and mapped by the gateway).
        warm = [f"bench@{index:08x}@0@w{j:06x}" for j in range(batch)]
        drive(conn, "set", warm, src[:batch], batch, window)
        drive(conn, "get", [warm[j % batch] for j in range(n)], dst, batch, window)
        res = []
        mismatched = 0
        keys: list[str] = []
        for op in ("set", "get"):
            for r in range(reps):
                clear(dst)
                barrier.wait(timeout=300)
                t0 = time.monotonic()
                failed = 0
                for p in range(passes):
                    if op == "set":
                        keys = [f"bench@{index:08x}@0@c{r:02d}{p:02d}{j:06x}" for j in range(n)]
                    failed += drive(conn, op, keys, src if op == "set" else dst, batch, window)[1]
                res.append((op, t0, time.monotonic(), failed))
                if op == "get":
                    mismatched += same(dst, src)
        conn.close()
        queue.put((index, res, mismatched, None))
    except BaseException as e:  # noqa: BLE001 - the parent reports it
        with contextlib.suppress(Exception):
            barrier.abort()
        queue.put((index, [], 0, repr(e)))


def run_clients(params: dict, procs: int, n: int, size: int, batch: int, window: int, reps: int, passes: int) -> dict:
    """P client processes; per repetition and phase the aggregate's seconds are last end - first start
    (the start skew is kept beside it); store_s / load_s are those spans, one per repetition."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs)
    queue = ctx.Queue()
    ps = [
        ctx.Process(target=client_proc, args=(i, params, n, size, batch, window, reps, passes, barrier, queue))
        for i in range(procs)
    ]
    for p in ps:
        p.start()
    results = [queue.get(timeout=900) for _ in ps]
    for p in ps:
        p.join(timeout=60)
    errors = [r[3] for r in results if r[3]]
    if errors:
        return {"error": errors[0]}
    out: dict = {"failed_keys": 0, "mismatched": sum(r[2] for r in results)}
    for op, name in (("set", "store"), ("get", "load")):
        spans, skews, each = [], [], []
        for r in range(reps):
            phase = [[x for x in res[1] if x[0] == op][r] for res in results]
            spans.append(max(x[2] for x in phase) - min(x[1] for x in phase))
            skews.append(max(x[1] for x in phase) - min(x[1] for x in phase))
            each.append([x[2] - x[1] for x in phase])
            out["failed_keys"] += sum(x[3] for x in phase)
        out[f"{name}_s"] = spans
        out[f"{name}_start_skew_s"] = skews
        out[f"{name}_per_process_s"] = each
    return out


def run_client_counts(
    work: Path, card: Path, size: int, args, clients: list[int], src, dst, base: dict, rows: list[dict]
) -> None:
    """Item 6: for each P, the medium at P x client-workers threads on the run's card image (moving as many
    bytes as the clients' phase), then P client processes on a gateway of its own, over a card of its own
    sized to P (room for about four passes of every process: every P starts empty and evicts alike)."""
    cw = args.client_workers
    nc = max(cw, args.client_mb * MIB // size)
    region = region_for(size)
    for p in clients:
        threads = p * cw
        passes_m = max(1, round(p * nc * args.client_passes / len(src)))
        medium_pass(card, src, threads, True)  # untimed warm-up
        w = [medium_pass(card, src, threads, True, passes_m) for _ in range(args.reps)]
        r = []
        for _ in range(args.reps):
            clear(dst)
            r.append(medium_pass(card, dst, threads, False, passes_m))
        rows.append({**base, "row": f"medium O_DIRECT, {threads} threads", "clients": p, "threads": threads,
                     "bytes": len(src) * size * passes_m, "store_s": w, "load_s": r, "mismatched": same(dst, src)})  # fmt: skip
        # One embedded connector with as many workers as the P processes have together: what this machine
        # gives that many threads through the same store code with no gateway in between. On a card of the
        # same size as the processes' (a new mapping either way): a store into a page the process has not
        # mapped yet costs 1.2-3.5x one into a mapped page (raw/2026-12-01-1040-vm-card-mapping-probe), and a
        # smaller card is wrapped, so mapped, sooner (before 2026-12-01 10:34 the reference ran on the run's
        # card, --client-reference both adds that row again).
        pcard = work / f"card-clients-{p}.img"
        prefill(pcard, card_bytes_for(2 * p * nc * size, size, threads, region))
        refs = [(", run's card", card)] if args.client_reference == "both" else []
        for suffix, ecard in [*refs, ("", pcard)]:  # the last one is the table's reference
            format_card(str(ecard), 0, region)
            ep = {"card": str(ecard), "num_workers": threads, "io_depth": threads, "timeout_ms": 60000}
            res = connector_rounds(ep, src, dst, args.reps, threads * args.keys_per_worker, args.window, "t", passes_m)
            rows.append({**base, "row": f"embedded, {threads} workers{suffix}", "clients": p, "threads": threads,
                         **res, "bytes": len(src) * size * passes_m})  # fmt: skip
        format_card(str(pcard), 0, region)
        with gateway(pcard, work / "gw.sock", max(16, threads), work / f"gateway-clients-{p}.log"):
            cp = {"gateway": f"unix://{work / 'gw.sock'}", "num_workers": cw, "timeout_ms": 60000}
            cp["ring_mb"] = max(64, 2 * args.keys_per_worker * size // MIB)
            res = run_clients(cp, p, nc, size, cw * args.keys_per_worker, args.window, args.reps, args.client_passes)
        pcard.unlink()
        rows.append({**base, "row": f"gateway, {p} client processes x {cw} workers", "clients": p,
                     "threads": threads, **res, "bytes": nc * size * p * args.client_passes})  # fmt: skip
        print(f"   {p} clients: {summarize(rows[-3:])}", flush=True)


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


GATEWAY_VARIANTS = {
    # The ring with loads copied out once the batch is in it (ring_pieces off, as before r4) beside the ring
    # in pieces (r4); loads written straight into this process's memory (r5, process_memory); with shm
    # buffers also loads straight into them (direct_loads, r3). name: (label, direct, pieces, process, tag)
    "whole": ("gateway unix+ring whole", False, False, False, "g"),
    "pieces": ("gateway unix+ring", False, True, False, "p"),
    "process": ("gateway unix+process", False, True, True, "m"),
    "segments": ("gateway unix+segments", True, True, False, "s"),
    "segments-shm": ("gateway unix+segments (own shm L1)", True, True, False, "o"),
}


# A row name with this suffix is its variant's row with the connector's reply_spin_us at 0 (the default's A/B
# in one run: benchmarks/README.md, "Session thirteen"); its keys' tag is the variant's, upper-cased.
NOSPIN = "-nospin"
# NAME@MB: NAME's row with the connector's ring_mb at MB instead of the run's (e.g. pieces@63,pieces@64 at 32 MiB:
# a worker's two objects in two ring rounds, then in one; benchmarks/README.md, "Session sixteen: the ring's
# payload area"); its keys' tag is the variant's with "r" and MB added.
RING_AT = "@"


def base_row(name: str) -> str:
    """The GATEWAY_VARIANTS name a row name is a variant of."""
    return name.split(RING_AT)[0].removesuffix(NOSPIN)


def variant(name: str) -> tuple[str, bool, bool, bool, str, dict]:
    """GATEWAY_VARIANTS[name] (or, for NAME-nospin, NAME's with reply_spin_us 0; for NAME@MB, NAME's with ring_mb
    MB), with the connector parameters it adds."""
    if RING_AT in name:
        name, mb = name.split(RING_AT)
        label, direct, pieces, process, tag, extra = variant(name)
        return f"{label}, ring_mb {int(mb)}", direct, pieces, process, f"{tag}r{int(mb)}", {**extra, "ring_mb": int(mb)}
    if name.endswith(NOSPIN):
        label, direct, pieces, process, tag = GATEWAY_VARIANTS[name[: -len(NOSPIN)]]
        return f"{label}, reply_spin_us 0", direct, pieces, process, tag.upper(), {"reply_spin_us": 0}
    return (*GATEWAY_VARIANTS[name], {})


def gateway_variants(args) -> list[str]:
    return [n for n in args.gateway_rows.split(",") if n and not (base_row(n) == "segments" and args.l1 != "shm")]


class GatewayRow:
    """One gateway row: its connector's parameters, its buffers (segments-shm with --l1 anon: a /dev/shm
    pool of its own, LMCache's L1 with --shm-name, beside the anonymous rows), its result row and the
    gateway's counters over its steps (counters as their growth over the row's steps, warm-up included:
    where the gateway's time went, and the per-step sums of its process loads with ADP_LOAD_PROFILE=1;
    gauges as they stand after its last step: review r8)."""

    def __init__(self, name: str, gw: dict, args, base: dict, src, dst, n: int, size: int) -> None:
        label, direct, pieces, process, self.tag, extra = variant(name)
        self.process = process
        spin = {} if args.reply_spin_us is None else {"reply_spin_us": args.reply_spin_us}
        self.params = {**gw, "direct_loads": direct, "ring_pieces": pieces, "process_memory": process, **spin, **extra}
        self.url = gw["gateway"]
        self.own = base_row(name) == "segments-shm" and args.l1 != "shm"
        self.src, self.dst = (
            (aligned_buffers(n, size, shm=True), aligned_buffers(n, size, shm=True)) if self.own else (src, dst)
        )
        self.pools = _SHM_POOLS[-2:] if self.own else []
        if self.own:
            for a, b in zip(self.src, src, strict=True):
                a[:] = b
        self.row = {**base, "row": label}
        self.counters: dict = {}

    @contextlib.contextmanager
    def counted(self):
        """The gateway's counters' growth over the block, added to the row's."""
        before = read_gateway_stats(self.url)
        try:
            yield
        finally:
            after = read_gateway_stats(self.url)
            for k, v in after.items():
                if isinstance(v, (int, float)) and k.startswith(
                    ("process", "store_buffer", "load_profile", "batch", "segment")
                ):
                    # The background populate runs between the row's steps too: its totals since the gateway's start.
                    total = GAUGES.get(k) or k.startswith("segment_prefault")
                    self.counters[k] = v if total else self.counters.get(k, 0) + v - before.get(k, 0)

    def done(self, res: dict, work: Path, rows: list[dict]) -> None:
        """The row's results checked (process rows went through process memory, ring rows did not) and kept."""
        res["gateway_stats"] = self.counters
        loads = res.get("stats", {}).get("process_loads", 0)
        stores = res.get("stats", {}).get("process_stores", 0)
        if res.get("error"):
            pass
        elif self.process and (loads == 0 or stores == 0):
            res["error"] = "loads or stores did not go through process memory (refused: see the log)"
        elif not self.process and (loads or stores):
            res["error"] = f"{loads} loads, {stores} stores went through process memory in a ring row"
        if res.get("error"):  # the why, kept: the work directory and its gateway log go at the end
            res["gateway_log"] = gateway_warnings(work / "gateway.log")
        self.row.update(res)
        rows.append(self.row)
        if self.own:  # its two pools: unlinked now, freed once the row's views go
            self.src = self.dst = None
            for path in self.pools:
                _SHM_POOLS.remove(path)
                with contextlib.suppress(OSError):
                    os.unlink(path)
        print(f"   {self.row['row']}: {res['failed_keys']} failed, {res['mismatched']} mismatched", flush=True)


def run_back_to_back(work: Path, gw: dict, params, emb, names, src, dst, args, base, batch, rows) -> None:
    """Each gateway row's repetitions back to back, one row after the other (the embedded row ran before the
    gateway started)."""
    for name in names:
        g = GatewayRow(name, gw, args, base, src, dst, len(src), len(src[0]))
        with g.counted():
            res = connector_rounds(g.params, g.src, g.dst, args.reps, batch, args.window, g.tag)
        g.done(res, work, rows)


def step_order(k: int, r: int) -> list[int | None]:
    """--interleave's order of the connectors' steps in repetition r: None (embedded), then the k gateway rows'
    indices 0..k-1 for even r; the reverse (k-1..0, then None) for odd r."""
    order: list[int | None] = [None, *range(k)]
    return order if r % 2 == 0 else order[::-1]


def run_interleaved(work: Path, gw: dict, params, emb, names, src, dst, args, base, batch, rows) -> None:
    """--interleave: per repetition r, the embedded store, each gateway row's store, the embedded load, each
    gateway row's load (each load reads the keys its row stored in r), so that every gateway repetition has
    an embedded one next to it in time. The order alternates (step_order): even r embedded first, then the
    gateway rows in --gateway-rows order; odd r the gateway rows last to first, then embedded, stores and
    loads alike, so a drift linear in time biases a row's paired ratio one way in even repetitions and the
    other way, by as much, in odd ones. All connectors stay open throughout, on one gateway. A gateway row
    whose step raises is marked failed and drops out; the others go on (an embedded error ends the run, as
    without --interleave)."""
    n, size = len(src), len(src[0])
    gws = [GatewayRow(name, gw, args, base, src, dst, n, size) for name in names]
    e: Rounds | None = None
    rounds: list[Rounds | None] = []
    failed: dict[int, str] = {}  # index into gws: why the row dropped out
    try:
        e = Rounds(params, src, dst, batch, args.window, "e")
        for i, g in enumerate(gws):
            try:
                with g.counted():
                    rounds.append(Rounds(g.params, g.src, g.dst, batch, args.window, g.tag))
            except Exception as x:  # noqa: BLE001 - the row is marked failed
                rounds.append(None)
                failed[i] = repr(x)

        def each(what, r: int) -> None:
            """`what` on the embedded connector and on every gateway row still in, in repetition r's order."""
            for i in step_order(len(gws), r):
                if i is None:
                    what(e)
                    continue
                if i in failed:
                    continue
                g, ro = gws[i], rounds[i]
                try:
                    with g.counted():
                        what(ro)
                except Exception as x:  # noqa: BLE001 - the row is marked failed, the others go on
                    failed[i] = repr(x)

        each(Rounds.warm, 0)
        for r in range(args.reps):
            each(lambda ro: ro.store(r), r)  # noqa: B023 - called at once
            each(Rounds.load, r)
        emb.update(e.finish())
        rows.append(emb)
        print(f"   embedded: {emb['failed_keys']} failed, {emb['mismatched']} mismatched", flush=True)
        for i, (g, ro) in enumerate(zip(gws, rounds, strict=True)):
            if ro is None or i in failed:
                res = {"store_s": [], "load_s": [], "failed_keys": 0, "mismatched": 0}
                if ro is not None:
                    ro.close()
                    res = ro.out
                g.done({**res, "error": failed[i]}, work, rows)
                continue
            with g.counted():
                res = ro.finish()
            g.done(res, work, rows)
    finally:
        for ro in [e, *rounds]:
            if ro is not None:
                ro.close()


def run_config(work: Path, size: int, workers: int, args, rows: list[dict], clients: list[int]) -> None:
    n = max(workers, args.total_mb * MIB // size)
    total = n * size
    region = region_for(size)
    card = work / "card.img"
    span = card_bytes_for(total, size, workers, region)
    print(f"== {size / MIB:g} MiB x {n} objects, {workers} workers, card {span / 2**30:.1f} GiB", flush=True)
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
    gw_rows = [] if args.no_gateway else gateway_variants(args)
    if gw_rows and args.interleave:
        base["interleaved"] = True
    emb = {**base, "row": "embedded"}
    if not gw_rows or not args.interleave:
        emb.update(connector_rounds(params, src, dst, args.reps, batch, args.window, "e"))
        rows.append(emb)
        print(f"   embedded: {emb['failed_keys']} failed, {emb['mismatched']} mismatched", flush=True)
    if gw_rows:
        # --interleave: the gateway on a card of its own beside the embedded connector's, which stays open;
        # sized, like the embedded card for its one row, for two repetitions of every row it serves, so that
        # no row's keys are evicted before its load and both cards wrap (reuse mapped pages) at the same
        # repetition.
        interleave = args.interleave
        gcard = work / "card-gateway.img" if interleave else card
        if interleave:
            gspan = card_bytes_for(len(gw_rows) * total, size, workers, region)
            print(f"   interleaved: gateway card {gspan / 2**30:.1f} GiB", flush=True)
            prefill(gcard, gspan)
        format_card(str(gcard), 0, region)
        with gateway(gcard, work / "gw.sock", workers, work / "gateway.log"):
            gw = {"gateway": f"unix://{work / 'gw.sock'}", "num_workers": workers, "timeout_ms": 60000}
            gw["ring_mb"] = max(64, 2 * args.keys_per_worker * size // MIB)
            run = run_interleaved if interleave else run_back_to_back
            run(work, gw, params, emb, gw_rows, src, dst, args, base, batch, rows)
        if interleave:
            gcard.unlink()
    if clients:
        run_client_counts(work, card, size, args, clients, src, dst, base, rows)
    medium(2)
    card.unlink()


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        s = {k: r[k] for k in ("row", "object_mb", "workers", "bytes", "clients") if k in r}
        for op in ("store", "load"):
            v = r.get(f"{op}_s")
            s[op] = gbps(r["bytes"], v) if v else None
        s["ok"] = not r.get("error") and not r.get("failed_keys") and not r.get("mismatched")
        out.append(s)
    return out


def client_table(rows: list[dict], summ: list[dict]) -> list[str]:
    """Item 6: aggregate of P processes against linear (P x one process) and against the medium at the same
    number of threads; "limit" = min(P x one process, medium at P x workers threads)."""
    cl = [(r, s) for r, s in zip(rows, summ, strict=True) if "clients" in r]
    if not cl:
        return []
    out = [
        "",
        "Client processes on one gateway (item 6): GB/s, median of the repetitions; each repetition's aggregate is"
        " all bytes / (last end - first start) over the processes; start skew = last start - first start (median)."
        " Medium and embedded: P x workers threads in the same run, as many bytes as the processes' phase.",
        "",
        "| object | P x workers | medium write / read | embedded, P x workers: store / load | P processes: store / load"
        " | linear (P x one) store, load | vs embedded | limit store, load | store / limit | load / limit"
        " | start skew ms | bytes ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    one: dict = {}
    for r, s in cl:
        if r["row"].startswith("gateway, 1 client"):
            one[r["object_mb"]] = s
    medium, emb = {}, {}
    extra: list[str] = []  # --client-reference both: the reference on the run's card, GB/s store / load
    for r, s in cl:
        if r["row"].startswith("medium"):
            medium[(r["object_mb"], r["clients"])] = s
            continue
        if r["row"].startswith("embedded"):
            emb[(r["object_mb"], r["clients"])] = s
            if r["row"].endswith("run's card"):
                extra.append(
                    f"{r['row']} ({r['object_mb']:g} MiB, P = {r['clients']}): {s['store']:.2f} / {s['load']:.2f}"
                )
            continue
        m = medium.get((r["object_mb"], r["clients"]))
        e = emb.get((r["object_mb"], r["clients"]))
        o = one.get(r["object_mb"])
        p = r["clients"]
        if not s["store"] or not s["load"]:
            out.append(f"| {r['object_mb']:g} MiB | {p} | | | failed: {r.get('error')} | | | | | | | NO |")
            continue
        nan = float("nan")
        lin = (p * o["store"], p * o["load"]) if o and o["store"] else (nan, nan)
        lim = (min(lin[0], m["store"]), min(lin[1], m["load"])) if m else lin
        e_sl = (e["store"] or nan, e["load"] or nan) if e else (nan, nan)
        skew = statistics.median(r.get("load_start_skew_s", [0]) + r.get("store_start_skew_s", [0])) * 1e3
        out.append(
            f"| {r['object_mb']:g} MiB | {p} x {r['threads'] // p} | {m['store']:.2f} / {m['load']:.2f} | "
            f"{e_sl[0]:.2f} / {e_sl[1]:.2f} | {s['store']:.2f} / {s['load']:.2f} | "
            f"{lin[0]:.2f} ({s['store'] / lin[0]:.2f}x), {lin[1]:.2f} ({s['load'] / lin[1]:.2f}x) | "
            f"{s['store'] / e_sl[0]:.2f}x, {s['load'] / e_sl[1]:.2f}x | {lim[0]:.2f}, {lim[1]:.2f} | "
            f"{s['store'] / lim[0]:.2f}x | {s['load'] / lim[1]:.2f}x | {skew:.1f} | {'yes' if s['ok'] else 'NO'} |"
        )
    if extra:
        out += ["", "Embedded reference on the run's card (--client-reference both), GB/s store / load:", ""]
        out += [f"- {e}" for e in extra]
    return out


def add_paired(rows: list[dict]) -> None:
    """Rows of an --interleave run: every gateway row gets paired_store / paired_load, for each repetition r
    its GB/s in r over the embedded row's GB/s in r (the two ran next to each other; a row that dropped out
    has fewer)."""
    keyf = lambda r: (r["object_mb"], r["workers"])  # noqa: E731
    emb = {keyf(r): r for r in rows if r["row"] == "embedded" and r.get("interleaved")}
    for r in rows:
        e = emb.get(keyf(r))
        if not r["row"].startswith("gateway") or "clients" in r or not r.get("interleaved") or not e:
            continue
        for op in ("store", "load"):
            pairs = zip(r.get(f"{op}_s", []), e.get(f"{op}_s", []), strict=False)
            r[f"paired_{op}"] = [(r["bytes"] / g) / (e["bytes"] / es) for g, es in pairs]


def scatter(g: list[float], e: list[float]) -> str:
    """How far the ratios of repetitions scatter, paired (gateway r against embedded r) against unpaired
    (gateway r against embedded r', every r' != r): the geometric standard deviation, as +-%. Paired well
    below unpaired: the machine drifted during the run and pairing took the drift out."""
    n = min(len(g), len(e))
    if n < 2:
        return ""
    paired = [math.log(e[i] / g[i]) for i in range(n)]
    unpaired = [math.log(e[j] / g[i]) for i in range(n) for j in range(n) if i != j]
    return f"±{math.expm1(statistics.pstdev(paired)):.0%} / ±{math.expm1(statistics.pstdev(unpaired)):.0%}"


def paired_table(rows: list[dict], summ: list[dict]) -> list[str]:
    """The paired ratios of an --interleave run beside the median-of-medians ratio of the table above."""
    pr = [(r, s) for r, s in zip(rows, summ, strict=True) if "paired_store" in r]
    if not pr:
        return []
    emb = {(r["object_mb"], r["workers"]): (r, s) for r, s in zip(rows, summ, strict=True) if r["row"] == "embedded"}
    out = [
        "",
        "Paired ratios (--interleave): per repetition r, the gateway row's GB/s in r / the embedded row's GB/s in r,"
        " the two measured next to each other (per r: embedded store, every gateway row's store, embedded load,"
        " every gateway row's load); their median and min..max. Median of medians = the table's vs embedded"
        " (median gateway GB/s / median embedded GB/s, each median over its own repetitions). Scatter: the"
        " geometric standard deviation of the ratios, paired (repetition r against r) / unpaired (r against every"
        " other r'); paired well below unpaired = the machine drifted and pairing took the drift out.",
        "",
        "| object | workers | row | store, per repetition | store: median (min..max) | store: median of medians"
        " | store: scatter paired / unpaired | load, per repetition | load: median (min..max)"
        " | load: median of medians | load: scatter paired / unpaired | bytes ok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, s in pr:
        er, e = emb[(r["object_mb"], r["workers"])]
        cells = []
        for op in ("store", "load"):
            p = r[f"paired_{op}"]
            cells.append(", ".join(f"{x:.2f}" for x in p))
            if s["ok"] and e["ok"] and p:
                cells.append(f"{statistics.median(p):.2f}x ({min(p):.2f}..{max(p):.2f})")
                cells.append(f"{s[op] / e[op]:.2f}x")
            else:  # a failed row's (or reference's) times are no measure
                cells += ["not ok", "not ok"]
            cells.append(scatter(r.get(f"{op}_s", []), er.get(f"{op}_s", [])))
        out.append(
            f"| {r['object_mb']:g} MiB | {r['workers']} | {r['row']} | {' | '.join(cells)} | {'yes' if s['ok'] else 'NO'} |"
        )
    return out


def round_trip_table(rows: list[dict], keys_per_worker: int) -> list[str]:
    """Per request (one worker's slice of a batch: keys_per_worker keys), mean over the repetitions (as the
    gateway's counters are): the embedded
    row's time, a gateway row's time as its client sees it, and the gateway's own time on it
    (batch_put_ns / batch_puts, batch_get_ns / batch_gets over the row's steps, warm-up included): the client's
    time beyond the gateway's is the round trip (sockets, wake-ups), the gateway's beyond embedded its work's
    own cost. A slice's time = the repetition's seconds x workers / slices (every worker busy throughout)."""
    emb = {(r["object_mb"], r["workers"]): r for r in rows if r["row"] == "embedded"}
    out = []
    for r in rows:
        gs, e = r.get("gateway_stats", {}), emb.get((r["object_mb"], r["workers"]))
        if not (gs.get("batch_puts") and gs.get("batch_gets") and e and r["store_s"] and r["load_s"]):
            continue
        w = r["workers"]
        slices = -(-r["objects"] // (w * keys_per_worker)) * w

        def us(seconds: list[float], w: int = w, slices: int = slices) -> float:
            return statistics.fmean(seconds) * w / slices * 1e6

        cells = []
        for op, n_key, ns_key in (("store", "batch_puts", "batch_put_ns"), ("load", "batch_gets", "batch_get_ns")):
            client, served, embedded = us(r[f"{op}_s"]), gs[ns_key] / gs[n_key] / 1e3, us(e[f"{op}_s"])
            cells += [f"{embedded:.0f}", f"{client:.0f}", f"{served:.0f}", f"{client - served:.0f}"]
        out.append(f"| {r['object_mb']:g} MiB | {w} | {r['row']} | {' | '.join(cells)} |")
    if not out:
        return []
    return [
        "",
        f"Per request (us; a worker's slice of a batch, {keys_per_worker} keys; mean over the repetitions):"
        " embedded, the"
        " gateway row as its client sees it, the gateway's own time on it (request read to reply ready to send:"
        " batch_*_ns / batch_* over the row's steps) and the difference, the round trip.",
        "",
        "| object | workers | row | store: embedded | store: gateway, client | store: gateway, served |"
        " store: round trip | load: embedded | load: gateway, client | load: gateway, served | load: round trip |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *out,
    ]


def connector_split_table(rows: list[dict], keys_per_worker: int) -> list[str]:
    """Per slice, the connector's own timing (its stats worker_{put,get}_* and, through a gateway,
    gateway_{put,get}_*; docs/stats.md), means over the row's slices, warm-up included (as the gateway's
    counters): the throughput-derived slice (as round_trip_table), and the worker's time on it: pickup (the
    queue's hand-off: from its submit, or the worker free if later, to taken), run (the backend's call), done
    (the completion's hand-off; the batch's last slice writes the eventfd); a gateway row's run split into setup (taken to the request's write), round trip (write to reply read) and
    finish (reply read to the call returned), and the round trip into the gateway's own time (served:
    batch_*_ns / batch_*) and the rest, the sockets and wake-ups (wire). queue: submit to taken (with batches in
    flight mostly the wait behind earlier slices: not part of the slice's cost)."""
    emb = {(r["object_mb"], r["workers"]): r for r in rows if r["row"] == "embedded"}
    out = []
    for r in rows:
        st, gs = r.get("stats", {}), r.get("gateway_stats", {})
        if not (r["row"] == "embedded" or r["row"].startswith("gateway")) or not st.get("worker_put_slices"):
            continue
        if not (r["store_s"] and r["load_s"]) or (r["row"] != "embedded" and (r["object_mb"], r["workers"]) not in emb):
            continue
        w = r["workers"]
        slices = -(-r["objects"] // (w * keys_per_worker)) * w
        for op, word, n_key, ns_key in (
            ("put", "store", "batch_puts", "batch_put_ns"),
            ("get", "load", "batch_gets", "batch_get_ns"),
        ):
            n = st.get(f"worker_{op}_slices", 0)
            if not n:
                continue

            def per(key: str, count: float = n, st: dict = st) -> float:
                return st.get(key, 0) / count / 1e3

            cells = [f"{statistics.fmean(r[f'{word}_s']) * w / slices * 1e6:.0f}"]
            cells += [f"{per(f'worker_{op}_{k}_ns'):.0f}" for k in ("pickup", "run", "done")]
            g, reqs = st.get(f"gateway_{op}_slices", 0), st.get(f"gateway_{op}_requests", 0)
            if g and reqs:
                rt = per(f"gateway_{op}_round_trip_ns", reqs)
                served = gs[ns_key] / gs[n_key] / 1e3 if gs.get(n_key) else None
                cells += [f"{per(f'gateway_{op}_setup_ns', g):.0f}", f"{rt:.0f}"]
                cells += [f"{served:.0f}", f"{rt - served:.0f}"] if served is not None else ["", ""]
                cells += [f"{per(f'gateway_{op}_finish_ns', g):.0f}"]
            else:
                cells += ["", "", "", "", ""]
            cells += [f"{per(f'worker_{op}_queue_ns'):.0f}"]
            spins = st.get(f"gateway_{op}_reply_spins", 0)
            # spins count waits, also those whose request then failed (no reply read: no share to give)
            cells += [
                f"{spins / reqs:.0%} ({st.get(f'gateway_{op}_reply_spin_hits', 0) / spins:.0%})"
                if spins and reqs
                else ""
            ]
            cpu = r.get(f"{word}_cpu_s")
            cells += [f"{statistics.fmean(cpu) / slices * 1e6:.0f}" if cpu else ""]
            out.append(f"| {r['object_mb']:g} MiB | {w} | {r['row']} | {word} | {' | '.join(cells)} |")
    if not out:
        return []
    return [
        "",
        "The connector's split (us a slice, means over the row's slices, warm-up included; docs/stats.md"
        " worker_* / gateway_*): the slice as throughput gives it; the worker's pickup (from its submit, or the"
        " worker free if later, to taken),"
        " run (the backend's call) and done (the hand-off, the eventfd); through a gateway, run = setup (taken to"
        " the request's write) + round trip (write to reply read) + finish (reply read to returned), round trip ="
        " served (the gateway's batch_*_ns) + wire (sockets, wake-ups); queue: submit to taken; spun: the requests"
        " whose wait for the reply polled (reply_spin_us: docs/stats.md gateway_*_reply_spins) and, in brackets, the"
        " share of those whose reply came while the worker polled; cpu: the bench process's CPU time (getrusage, user + system, all its threads:"
        " the driver and the connector's workers, not the gateway's) over the timed repetitions, mean a slice.",
        "",
        "| object | workers | row | op | slice | pickup | run | done | setup | round trip | served | wire | finish"
        " | queue | spun (hits) | cpu |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *out,
    ]


SEG_STEPS = ("seg_item", "seg_context", "seg_get", "seg_prepare", "seg_lease", "seg_copy")


def segment_load_table(rows: list[dict], keys_per_worker: int) -> list[str]:
    """Where a segment load's time goes in the gateway (the gateway started with ADP_LOAD_PROFILE=1: its seg_*
    load-profile steps), us an object, means over the row's objects (warm-up included): embedded's run (its
    worker's backend call, a slice of keys_per_worker objects, per object), the gateway's served (batch_get_ns
    per object), then the item whole (context taken to store.get returned) and its parts; the rest of served
    (served - item: the request's decode, the reply's encode, the checks around the items)."""
    emb = {(r["object_mb"], r["workers"]): r for r in rows if r["row"] == "embedded"}
    out = []
    for r in rows:
        gs = r.get("gateway_stats", {})
        objects = gs.get("load_profile_seg_item_n", 0)
        e = emb.get((r["object_mb"], r["workers"]), {}).get("stats", {})
        if not objects or not e.get("worker_get_slices"):
            continue
        emb_run = e["worker_get_run_ns"] / e["worker_get_slices"] / keys_per_worker / 1e3
        served = gs.get("batch_get_ns", 0) / objects / 1e3
        steps = {k: gs.get(f"load_profile_{k}_ns", 0) / objects / 1e3 for k in SEG_STEPS}
        cells = [f"{emb_run:.0f}", f"{served:.0f}", *(f"{steps[k]:.1f}" for k in SEG_STEPS)]
        cells.append(f"{served - steps['seg_item']:.1f}")
        cells += [f"{gs.get('segment_populates', 0)}", f"{gs.get('segment_prefault_bytes', 0) / MIB:.0f}"]
        cells.append(f"{gs.get('segment_prefault_ns', 0) / 1e6:.1f}")
        out.append(f"| {r['object_mb']:g} MiB | {r['workers']} | {r['row']} | {' | '.join(cells)} |")
    if not out:
        return []
    return [
        "",
        "A segment load in the gateway (ADP_LOAD_PROFILE=1 in the gateway's environment: its seg_* steps, us an"
        " object, means over the row's objects, warm-up included): embedded's run per object beside the gateway's"
        " served per object; item = its I/O context taken (context, when the batch held none) to store.get returned"
        " (get: the lookup, the read into the segment with its CRC = copy, under the lease = lease; prepare: the"
        " segment's pages looked up); served - item: the request's decode, the reply, the checks around the items."
        " Over the row's steps: populates = the loads' own page-table populates (segment_populates: calls, one a"
        " buffer on pages not populated before); bg MiB, bg ms = the gateway's background populate"
        " (segment_prefault_bytes, segment_prefault_ns since the gateway's start: every segments row of the run;"
        " --segment-prefault, session fifteen).",
        "",
        "| object | workers | row | embedded run | served | item | context | get | prepare | lease | copy |"
        " served - item | populates | bg MiB | bg ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *out,
    ]


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
        "GB/s (1e9 B/s), median of the repetitions; bytes of every load checked. Medium = better of its two passes."
        " vs embedded = median gateway GB/s / median embedded GB/s (median of medians).",
        "",
        "Interleaved (--interleave): each gateway repetition ran next to an embedded one, in an order alternating"
        " per repetition (even r: embedded, then the gateway rows in --gateway-rows order; odd r: the gateway rows"
        " last to first, then embedded; stores and loads alike: a linear drift's bias cancels between them); the paired"
        " ratios are under the table."
        if any(r.get("interleaved") for r in rows)
        else "Back to back: all embedded repetitions, then each gateway row's (no paired ratio; --interleave pairs them).",
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
        for r in group:
            if r["row"].startswith("medium O_DIRECT") and r is not med[0] or "clients" in r:
                continue
            st, ld = (mw, mr) if r["row"] == "medium O_DIRECT" else (r["store"], r["load"])
            vs_e = (
                f"{st / emb['store']:.2f}x, {ld / emb['load']:.2f}x" if r["row"].startswith("gateway") and emb else ""
            )
            lines.append(
                f"| {r['object_mb']:g} MiB | {r['workers']} | {r['row']} | {st:.2f} | {ld:.2f} | "
                f"{st / mw:.2f}x | {ld / mr:.2f}x | {vs_e} | {'yes' if r['ok'] else 'NO'} |"
            )
    lines += paired_table(rows, summ)
    if args is not None:  # a report of saved rows (args None) does not know the batch size
        lines += round_trip_table(rows, args.keys_per_worker)
        lines += connector_split_table(rows, args.keys_per_worker)
        lines += segment_load_table(rows, args.keys_per_worker)
    lines += client_table(rows, summ)
    lines += not_ok(rows)
    lines.append("")
    return "\n".join(lines)


def not_ok(rows: list[dict]) -> list[str]:
    """Why each row whose bytes ok is NO failed, with the process counters and the gateway's warnings."""
    out = []
    for r in rows:
        why = [r.get("error"), r.get("failed_keys") and f"{r['failed_keys']} failed keys"]
        why += [r.get("mismatched") and f"{r['mismatched']} mismatched buffers"]
        why = [w for w in why if w]
        if not why:
            continue
        st = r.get("stats", {})
        out += ["", f"{r['object_mb']:g} MiB, {r['workers']} workers, {r['row']}: NO: {'; '.join(why)}"]
        out += [f"(process loads {st.get('process_loads', 0)}, process stores {st.get('process_stores', 0)})"]
        out += [f"    {line}" for line in r.get("gateway_log", [])]
    return ["", "Rows not ok:", *out] if out else []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/dev/shm/lmcache-adp-bench-connector", help="where the card image lives")
    ap.add_argument(
        "--sizes-mb", default="2,32", help="object sizes in MiB; fractions for small objects (0.0625 = 64 KiB)"
    )
    ap.add_argument("--workers", default="2", help="worker (= medium thread) counts, e.g. 4,16")
    ap.add_argument("--total-mb", type=int, default=1024, help="bytes moved per timed repetition")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keys-per-worker", type=int, default=2, help="a batch holds workers x this many keys")
    ap.add_argument("--window", type=int, default=4, help="batches in flight (LMCache bench l2: 4)")
    ap.add_argument("--no-gateway", action="store_true")
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="per repetition: the embedded store, every gateway row's store, the embedded load, every gateway "
        "row's load, the order reversed in odd repetitions (the gateway on a card of its own, up beside the "
        "embedded connector): each gateway repetition is paired with the embedded one next to it, and the report "
        "gives the paired ratios",
    )
    ap.add_argument(
        "--gateway-rows",
        default="whole,pieces,process,segments",
        help="gateway rows to run: whole (ring, copied out after the reply, r3), pieces (ring in pieces, r4), "
        "process (written into this process's memory, r5), segments (--l1 shm only, r3), segments-shm "
        "(segments into buffers of a /dev/shm file of the row's own, beside --l1 anon rows); NAME-nospin: NAME's "
        "row with the connector's reply_spin_us at 0 (e.g. segments-shm,segments-shm-nospin: the spin's A/B); NAME@MB: "
        "NAME's row with the connector's ring_mb at MB (the run's: max(64, 2 x keys-per-worker x object MiB))",
    )
    ap.add_argument(
        "--reply-spin-us",
        type=int,
        default=None,
        help="the gateway rows' adapter_params reply_spin_us (default: the connector's; NAME-nospin rows: 0)",
    )
    ap.add_argument(
        "--warm-loads",
        action="store_true",
        help="the warm-up also loads absent keys into the load buffers (misses: nothing written), so a segments "
        "row registers its pool before the timed repetitions, not at the first timed load",
    )
    ap.add_argument("--clients", default="", help="client process counts on one gateway, e.g. 1,2,4,8")
    ap.add_argument("--client-workers", type=int, default=2)
    ap.add_argument("--client-mb", type=int, default=512, help="MiB of buffers (objects) of each client process")
    ap.add_argument(
        "--client-passes", type=int, default=4, help="times each client phase moves its objects (stores: new keys)"
    )
    ap.add_argument(
        "--client-reference",
        choices=("sized", "both"),
        default="sized",
        help="the embedded reference of --clients on a card of the processes' size, or also on the run's card",
    )
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
    if args.interleave and args.no_gateway:
        # Nothing to pair with the embedded row: say so rather than leave a reader of the command line to
        # think the medium and embedded rows were interleaved (the report's "order" line says it too).
        print(
            "bench_connector: --interleave pairs each gateway row's repetitions with the embedded row's; with "
            "--no-gateway there are none, so the rows run back to back",
            file=sys.stderr,
            flush=True,
        )
    os.environ["ADP_BENCH_L1"] = args.l1  # spawned client processes allocate alike
    Rounds.warm_loads = args.warm_loads

    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    work = Path(args.dir).resolve() / f"run-{os.getpid()}"  # absolute: the gateway runs in another cwd
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
        "order": "interleaved (--interleave), alternating: odd repetitions reversed"
        if args.interleave and not args.no_gateway
        else "back to back",
    }
    for var in ("BENCH_GATEWAY_ARGS", "ADP_LOAD_PROFILE"):  # what the command line does not show
        if os.environ.get(var):
            meta[var] = os.environ[var]
    rows: list[dict] = []
    try:
        for size_mb in (float(x) for x in args.sizes_mb.split(",")):
            size = round(size_mb * MIB / BLOCK) * BLOCK  # whole 4 KiB blocks (the medium's O_DIRECT)
            if size <= 0:
                ap.error(f"--sizes-mb {size_mb:g}: less than one 4 KiB block")
            for w in (int(x) for x in args.workers.split(",")):
                cl = clients if (at is None or at == (size_mb, w)) else []
                run_config(work, size, w, args, rows, cl)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta["load average after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    out = Path(args.out)
    raw = out / "raw" / f"{stamp}-{args.label}"
    raw.mkdir(parents=True, exist_ok=True)
    add_paired(rows)
    (raw / "rows.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    text = report(rows, args, meta)
    (out / f"{stamp}-{args.label}.md").write_text(text + f"\nRaw: `raw/{stamp}-{args.label}/rows.json`\n")
    print(text)


if __name__ == "__main__":
    main()
