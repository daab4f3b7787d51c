# SPDX-License-Identifier: Apache-2.0
"""The first pass of loads over a tmpfs card another process wrote, with the background prefault of the
card mapping's written extents off and on (CardDevice::start_prefault; ADP_CARD_PREFAULT=0 turns it off).

A writer process stores --total-mb in --object-mb objects into a fresh card image in /dev/shm and exits.
Then, per repetition and in this order, a fresh reader process per arm opens the card with an embedded
ADPConnector (--workers workers) and times two passes of loads over every object (batches of --batch keys,
every byte checked after each pass, destination buffers touched before the clock starts):

  off         ADP_CARD_PREFAULT=0: the first pass faults the card mapping in, page by page
  on          prefault on, the first pass starts --idle-s after open (as a server's first request comes
              some time after it started); the card mapping's Rss at that moment says whether it finished
  on-at-once  prefault on, the first pass starts right after open: the prefault races the loads

The second pass is each reader's warm reference (its mapping then fully faulted in). Reported: medians of
each arm's pass times, first / second pass per arm, each arm's first pass against off's, and the process's
minor page faults during each pass (getrusage): the count the prefault is there to remove, free of the
timing noise of a shared machine.

  python benchmarks/bench_first_pass.py --total-mb 1024 --object-mb 2 --workers 2 --reps 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]  # this tree's lmcache_adp, not an installed one
from tools import describe_build, native_build  # noqa: E402

MIB = 1 << 20
ARMS = ("off", "on", "on-at-once")


def objects(total_mb: int, object_mb: int) -> list[str]:
    return [f"first@00000000@0@{i:06d}" for i in range(total_mb // object_mb)]


def fill(buf: np.ndarray, i: int) -> None:
    """Object i's bytes: (i % 251) + 1 throughout, its index in the first 8."""
    buf[:] = i % 251 + 1
    buf[:8] = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)


def aligned_views(n: int, size: int) -> list[np.ndarray]:
    raw = np.empty(n * size + 4096, dtype=np.uint8)
    skip = (-raw.ctypes.data) % 4096
    return [raw[skip + i * size : skip + (i + 1) * size] for i in range(n)]


def run_batches(conn, op: str, keys: list[str], bufs: list[np.ndarray], batch: int) -> float:
    poller = select.poll()
    poller.register(conn.event_fd(), select.POLLIN)
    t0 = time.perf_counter()
    for at in range(0, len(keys), batch):
        ks, bs = keys[at : at + batch], [memoryview(b) for b in bufs[at : at + batch]]
        fid = conn.submit_batch_set(ks, bs) if op == "set" else conn.submit_batch_get(ks, bs)
        done = None
        while done is None:
            poller.poll(1000)
            for f, ok, err, per_key in conn.drain_completions():
                if f == fid:
                    done = (ok, err, per_key)
        ok, err, per_key = done
        if not ok or (op == "get" and not all(per_key)):
            raise RuntimeError(f"{op} of keys {at}..{at + len(ks)} failed: {err}")
    return time.perf_counter() - t0


def card_rss(card: str) -> int:
    """Bytes of the card's mapping resident in this process's page tables (/proc/self/smaps)."""
    rss, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                inside = line.rstrip().endswith(card)
            elif inside and line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
    return rss


def writer(args) -> None:
    from lmcache_adp import ADPConnector

    keys = objects(args.total_mb, args.object_mb)
    bufs = aligned_views(len(keys), args.object_mb * MIB)
    for i, b in enumerate(bufs):
        fill(b, i)
    gb = max(1.0, args.total_mb * 1.5 / 1024)
    conn = ADPConnector(card=args.card, card_size_gb=gb, num_workers=args.workers, timeout_ms=600000)
    try:
        run_batches(conn, "set", keys, bufs, args.batch)
    finally:
        conn.close()


def reader(args) -> None:
    from lmcache_adp import ADPConnector

    keys = objects(args.total_mb, args.object_mb)
    bufs = aligned_views(len(keys), args.object_mb * MIB)
    for b in bufs:
        b[:] = 0  # the destination faulted in before the clock starts
    conn = ADPConnector(card=args.card, num_workers=args.workers, timeout_ms=600000)
    try:
        if args.arm == "on":
            time.sleep(args.idle_s)
        rss = card_rss(args.card)
        passes, faults = [], []
        for _ in range(2):
            for b in bufs:
                b[:8] = 0
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            passes.append(run_batches(conn, "get", keys, bufs, args.batch))
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
            ref = np.empty(args.object_mb * MIB, dtype=np.uint8)
            for i, b in enumerate(bufs):
                fill(ref, i)
                if not np.array_equal(b, ref):
                    raise RuntimeError(f"object {i} came back wrong")
    finally:
        conn.close()
    out = {"arm": args.arm, "first_s": passes[0], "second_s": passes[1], "card_rss_at_first": rss}
    print(json.dumps({**out, "first_faults": faults[0], "second_faults": faults[1]}))


def run_child(args, role: str, arm: str = "") -> dict | None:
    env = dict(os.environ)
    if arm == "off":
        env["ADP_CARD_PREFAULT"] = "0"
    else:
        env.pop("ADP_CARD_PREFAULT", None)
    cmd = [sys.executable, __file__, "--role", role, "--arm", arm or "off", "--card", args.card]
    cmd += ["--total-mb", str(args.total_mb), "--object-mb", str(args.object_mb), "--workers", str(args.workers)]
    cmd += ["--batch", str(args.batch), "--idle-s", str(args.idle_s)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{role} {arm} failed:\n{proc.stdout}{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]) if role == "reader" else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total-mb", type=int, default=1024)
    p.add_argument("--object-mb", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--idle-s", type=float, default=3.0, help="arm `on`: seconds between open and the first pass")
    p.add_argument("--out", help="results file (markdown); the raw samples go beside it as .json")
    p.add_argument("--role", choices=["main", "writer", "reader"], default="main", help=argparse.SUPPRESS)
    p.add_argument("--arm", choices=ARMS, default="off", help=argparse.SUPPRESS)
    p.add_argument("--card", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "writer":
        return writer(args)
    if args.role == "reader":
        return reader(args)

    start, load0 = time.time(), os.getloadavg()[0]
    build = describe_build(native_build())
    work = tempfile.mkdtemp(prefix="adp-first-pass-", dir="/dev/shm")
    args.card = os.path.join(work, "card.img")
    samples: list[dict] = []
    try:
        run_child(args, "writer")
        for _ in range(args.reps):
            for arm in ARMS:
                samples.append(run_child(args, "reader", arm))
                print(json.dumps(samples[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(arm: str, key: str) -> float:
        return statistics.median(s[key] for s in samples if s["arm"] == arm)

    gib = args.total_mb / 1024
    lines = [
        f"# First pass of loads over a tmpfs card written by another process ({args.total_mb} MiB in "
        f"{args.object_mb} MiB objects, {args.workers} workers)",
        "",
        f"{datetime.datetime.fromtimestamp(start, datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {build}; "
        f"{os.cpu_count()} cores, load average {load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end; "
        f"took {(time.time() - start) / 60:.1f} min. Command: `python benchmarks/bench_first_pass.py "
        f"{' '.join(sys.argv[1:])}`",
        "",
        "| arm | first pass (s, GiB/s) | second pass (s, GiB/s) | first / second | off first / this first |"
        " card Rss at the first pass (MiB) | page faults in the first / second pass |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        f, s = med(arm, "first_s"), med(arm, "second_s")
        rss = statistics.median(x["card_rss_at_first"] for x in samples if x["arm"] == arm) / MIB
        lines.append(
            f"| {arm} | {f:.3f} ({gib / f:.2f}) | {s:.3f} ({gib / s:.2f}) | {f / s:.2f}x | "
            f"{med('off', 'first_s') / f:.2f}x | {rss:.0f} | {med(arm, 'first_faults'):.0f} / "
            f"{med(arm, 'second_faults'):.0f} |"
        )
    lines += ["", "Medians over the repetitions; rates as GiB/s of the pass. Raw samples, in run order:", ""]
    lines += [f"    {json.dumps(s)}" for s in samples]
    table = "\n".join(lines)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
        Path(args.out).with_suffix(".json").write_text(json.dumps({"args": vars(args), "samples": samples}) + "\n")


if __name__ == "__main__":
    main()
