#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A per-object timeline of one L2 -> L1 prefetch from a trace of the MP server (bench_restore.py --trace).

For each log (raw/strace-TIER-rN-l2-I.txt or raw/perf-..., the threads' names in the .threads file beside it, the
disks' counters in .diskstats): every read of at least --min-bytes (one an object for both the card and fs_native),
on which thread, when it started and ended (ms from the batch's first worker wake-up: the end of that thread's last
syscall before its first read; perf: its last switch-in before it), the thread's idle time before it, the reads in
flight; the card's CRC threads (adp-crc: strace, busy from a futex wait's return to its next futex wait; perf, from
a switch-in to going to sleep), and with perf how long woken threads waited for a CPU; fs_native's file opens; and
the completion: the plugin's eventfd write (the first 8-byte write by a reading thread after the batch's last read),
LMCache's demux thread reading it, its write of the load eventfd and LMCache's read of that (the future seen).

    python benchmarks/restore_timeline.py LOG [LOG ...] [--objects | --table] [--min-bytes N]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

LINE = re.compile(r"^(\d+)\s+(\d\d:\d\d:\d\d\.\d+) (.*)$")
DONE = re.compile(r"= (-?\d+)(?: \S+)?(?: \([^)]*\))? <([\d.]+)>$")
CALL = re.compile(r"^(\w+)\((\d+|[A-Z_]+|0x[0-9a-f]+)?")
RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>")
# perf script -F comm,pid,tid,time,event,trace
PERF = re.compile(r"^\s*(.*?)\s+(\d+)/(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)$")
PERF_SYS = re.compile(r"^syscalls:sys_(enter|exit)_(\w+)$")
PERF_FD = re.compile(r"fd: (0x[0-9a-f]+)")
SWITCH = re.compile(r"prev_comm=(.*?) prev_pid=(\d+) .*?prev_state=(\S+) ==> next_comm=(.*?) next_pid=(\d+)")
WAKEUP = re.compile(r"comm=(.*?) pid=(\d+) ")


@dataclass
class Call:
    tid: int
    name: str
    arg0: str
    start: float
    end: float
    ret: int
    text: str


@dataclass
class Sched:
    """perf's scheduler events of the server's threads: each on-CPU slice, and each wake-up's wait for a CPU."""

    slices: dict  # tid -> [(on, off, state at off)]
    waits: dict  # tid -> [(woken, on)]
    ons: dict  # tid -> [on], every switch-in


def text_of(path: Path) -> str:
    """A log's text, gzipped (.gz, as kept under benchmarks/results/raw) or not."""
    return (
        gzip.decompress(path.read_bytes()).decode(errors="replace")
        if path.suffix == ".gz"
        else path.read_text(errors="replace")
    )


def beside(path: Path, suffix: str) -> Path:
    """The file kept beside a log (its .threads, its .diskstats), the log gzipped or not."""
    return Path(str(path.with_suffix("") if path.suffix == ".gz" else path) + suffix)


def seconds(ts: str) -> float:
    t = datetime.datetime.strptime(ts, "%H:%M:%S.%f")
    return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


def parse(path: Path) -> list[Call]:
    """Every finished syscall (its start, end, return value); an unfinished one joined with its resumption."""
    pending: dict[int, tuple[str, str, float, str]] = {}
    out = []
    for line in text_of(path).splitlines():
        m = LINE.match(line)
        if not m:
            continue
        tid, t, rest = int(m.group(1)), seconds(m.group(2)), m.group(3)
        r = RESUMED.match(rest)
        if r:
            if tid in pending:
                name, arg0, t0, head = pending.pop(tid)
                d = DONE.search(rest)
                out.append(Call(tid, name, arg0, t0, t, int(d.group(1)) if d else -1, head + rest))
            continue
        c = CALL.match(rest)
        if not c:
            continue
        if rest.endswith("<unfinished ...>"):
            pending[tid] = (c.group(1), c.group(2) or "", t, rest)
            continue
        d = DONE.search(rest)
        if d:
            out.append(Call(tid, c.group(1), c.group(2) or "", t, t + float(d.group(2)), int(d.group(1)), rest))
    return sorted(out, key=lambda c: c.start)


def parse_perf(path: Path, pid: int) -> tuple[list[Call], dict[int, str], Sched]:
    """The server's read/write/openat syscalls (enter and exit paired per thread), its threads' names, and the
    scheduler's events of its threads, from `perf script -F comm,pid,tid,time,event,trace` (bench_restore --trace
    perf)."""
    calls, names, open_calls = [], {}, {}
    events = []
    for line in text_of(path).splitlines():
        m = PERF.match(line)
        if not m:
            continue
        comm, p, tid, t, ev, rest = m.groups()
        p, tid, t = int(p), int(tid), float(t)
        if p == pid:
            names[tid] = comm
        s = PERF_SYS.match(ev)
        if s and p == pid:
            if s.group(1) == "enter":
                f = PERF_FD.search(rest)
                open_calls[tid] = (s.group(2), str(int(f.group(1), 16)) if f else "", t, rest)
            elif tid in open_calls:
                name, arg0, t0, text = open_calls.pop(tid)
                try:
                    ret = int(rest.strip(), 16)
                except ValueError:
                    ret = -1
                ret = ret - (1 << 64) if ret >= 1 << 63 else ret
                calls.append(Call(tid, name, arg0, t0, t, ret, text))
        elif ev == "sched:sched_switch":
            w = SWITCH.search(rest)
            if w:
                events.append((t, "off", int(w.group(2)), w.group(3)))
                events.append((t, "on", int(w.group(5)), ""))
        elif ev == "sched:sched_wakeup":
            w = WAKEUP.search(rest)
            if w:
                events.append((t, "wake", int(w.group(2)), ""))
    sched = Sched({}, {}, {})
    on_since: dict[int, float] = {}
    woken: dict[int, float] = {}
    for t, kind, tid, state in sorted(events, key=lambda e: e[0]):
        if tid not in names:
            continue
        if kind == "on":
            on_since[tid] = t
            sched.ons.setdefault(tid, []).append(t)
            if tid in woken:
                sched.waits.setdefault(tid, []).append((woken.pop(tid), t))
        elif kind == "off" and tid in on_since:
            sched.slices.setdefault(tid, []).append((on_since.pop(tid), t, state))
        elif kind == "wake":
            woken.setdefault(tid, t)
    return sorted(calls, key=lambda c: c.start), names, sched


def names_of(path: Path) -> dict[int, str]:
    p = beside(path, ".threads")
    names = {}
    if p.exists():
        for line in p.read_text().splitlines():
            tid, _, name = line.partition(" ")
            names[int(tid)] = name
    return names


def in_flight(reads: list[Call], at: float) -> int:
    return sum(1 for r in reads if r.start <= at < r.end)


def disk_requests(path: Path) -> str:
    """The busiest disk's reads between the two /proc/diskstats copies beside a trace: count and mean size."""
    p = beside(path, ".diskstats")
    if not p.exists():
        return ""
    rows: dict[str, list[list[int]]] = {}
    for line in p.read_text().splitlines():
        f = line.split()
        if len(f) >= 14 and not f[2].startswith(("loop", "zram", "ram")):
            rows.setdefault(f[2], []).append([int(x) for x in f[3:14]])
    best = max(
        ((n, v[-1][0] - v[0][0], v[-1][2] - v[0][2]) for n, v in rows.items() if len(v) == 2), key=lambda x: x[1]
    )
    name, reqs, sectors = best
    return f"{name}: {reqs} read requests, {sectors * 512 / max(reqs, 1) / 1024:.0f} KiB each on average"


def timeline(path: Path, min_bytes: int, objects: bool) -> dict:
    names = names_of(path)
    sched = None
    if path.name.startswith("perf-"):
        calls, seen, sched = parse_perf(path, next(iter(names)))  # the process's own id first
        names = {**seen, **names}
    else:
        calls = parse(path)
    reads = [c for c in calls if c.name in ("read", "pread64", "preadv", "preadv2") and c.ret >= min_bytes]
    if not reads:
        raise SystemExit(f"{path}: no read of {min_bytes} bytes or more")
    readers = sorted({r.tid for r in reads})
    by_thread = {t: [c for c in calls if c.tid == t] for t in readers}
    # The batch's first worker wake-up: each reading thread's last syscall before its first read ends there (perf: its
    # last switch-in before it).
    wakes = {}
    for t in readers:
        first = min(r.start for r in reads if r.tid == t)
        if sched is not None:  # perf: the thread's last switch-in before its first read (no futex traced)
            before = [on for on in sched.ons.get(t, []) if on <= first]
        else:
            before = [c.end for c in by_thread[t] if c.end <= first]
        wakes[t] = max(before) if before else first
    t0 = min(wakes.values())
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    first_start, last_end = reads[0].start, max(r.end for r in reads)
    # Idle time of each reading thread before each of its reads.
    idle_before = {}
    for t in readers:
        prev = wakes[t]
        for r in sorted((r for r in reads if r.tid == t), key=lambda r: r.start):
            idle_before[id(r)] = r.start - prev
            prev = r.end
    # The disk's idle time inside the batch: no large read in flight, from the first start to the last end.
    edges = sorted([(r.start, 1) for r in reads] + [(r.end, -1) for r in reads])
    level, last, idle, area = 0, edges[0][0], 0.0, 0.0
    for t, d in edges:
        if level == 0:
            idle += t - last
        area += level * (t - last)
        level += d
        last = t
    span = last_end - first_start
    # The card's CRC threads: busy from a futex wait's return to its next syscall.
    crc_tids = [t for t, n in names.items() if n == "adp-crc"]
    known = set(names)
    crc_tids += sorted({c.tid for c in calls if c.tid not in known})  # CRC threads started during the trace
    crcs = []
    for t in crc_tids if sched is None else []:
        own = [c for c in calls if c.tid == t]
        sleeps = [c for c in own if c.name == "futex" and "WAIT" in c.text]
        for a, b in zip(
            sleeps, sleeps[1:], strict=False
        ):  # woken with a CRC to run (returned 0), busy until it waits again
            if a.ret == 0 and first_start - 0.01 <= a.end <= last_end + 0.05:
                crcs.append((a.end, b.start, t))
    cpu_wait = {}
    if sched is not None:  # perf: a CRC is an adp-crc thread's run from its wake-up to its sleep (or its slices)
        lo, hi = first_start - 0.01, last_end + 0.05
        for t in crc_tids:
            first, cpu = None, 0.0  # the run's first switch-in, its CPU time so far
            for on, off, state in sched.slices.get(t, []):
                if not lo <= on <= hi:
                    continue
                first, cpu = (on if first is None else first), cpu + off - on
                if not state.startswith("R"):  # asleep: the CRC done (preempted ones stay runnable, R)
                    crcs.append((first, off, t, cpu))
                    first, cpu = None, 0.0
        crcs = [(a, b, t) for a, b, t, cpu in crcs if cpu > 0.0003]

        def waits(tids):  # noqa: E306
            w = [(on - woke) * 1e3 for x in tids for woke, on in sched.waits.get(x, []) if lo <= woke <= hi]
            return {"n": len(w), "sum_ms": sum(w), "max_ms": max(w) if w else 0.0,
                    "median_ms": statistics.median(w) if w else 0.0}  # fmt: skip

        cpu_wait = {"readers": waits(readers), "crc": waits(crc_tids)}
    opens = [c for c in calls if c.name == "openat" and c.tid in readers and first_start - 0.01 <= c.start <= last_end]

    # Completion: the first 8-byte write by a reading thread after the last read; then the other thread that read
    # that eventfd (LMCache's demux), its next 8-byte write (the load eventfd), and the thread that read that.
    def eventfd_write(tids: set[int], after: float) -> Call | None:
        return next((c for c in calls if c.tid in tids and c.name == "write" and c.ret == 8 and c.start >= after), None)

    def read_of(w: Call) -> Call | None:
        return next((c for c in calls if c.name == "read" and c.arg0 == w.arg0 and c.tid != w.tid and c.end >= w.start),
                    None)  # fmt: skip

    chain = []
    what = iter([
        "plugin's eventfd write (future completed)",
        "LMCache's demux reads it",
        "demux writes the load eventfd",
        "LMCache reads the load eventfd (future seen)",
    ])  # fmt: skip
    step = eventfd_write(set(readers), last_end)
    while step is not None:
        chain.append((next(what), step))
        if len(chain) == 4:
            break
        step = read_of(step) if len(chain) % 2 else eventfd_write({step.tid}, step.end)
    rows = []
    for i, r in enumerate(reads):
        rows.append({
            "i": i + 1,
            "thread": names.get(r.tid, str(r.tid)),
            "start_ms": ms(r.start),
            "end_ms": ms(r.end),
            "ms": (r.end - r.start) * 1e3,
            "mib": r.ret / (1 << 20),
            "idle_before_ms": idle_before[id(r)] * 1e3,
            "in_flight_at_start": in_flight(reads, r.start),
        })  # fmt: skip
    gaps = [x["idle_before_ms"] for x in rows]
    thread_ends = sorted(ms(max(r.end for r in reads if r.tid == t)) for t in readers)
    res = {
        "log": path.name,
        "reads": len(reads),
        "threads": len(readers),
        "syscall": sorted({r.name for r in reads}),
        "sizes_kib": sorted({r.ret // 1024 for r in reads}),
        "first_read_ms": ms(first_start),
        "last_read_end_ms": ms(last_end),
        "mean_in_flight": area / span if span > 0 else 0.0,
        "disk_idle_ms": idle * 1e3,
        "gib_s": sum(r.ret for r in reads) / span / (1 << 30) if span > 0 else 0.0,
        "thread_idle_ms_sum": sum(gaps),
        "thread_idle_ms_median": statistics.median(gaps),
        "thread_last_read_ends_ms": thread_ends,
        "opens": len(opens),
        "opens_ms_sum": sum((c.end - c.start) * 1e3 for c in opens),
        "crc_n": len(crcs),
        "crc_ms_median": statistics.median([(b - a) * 1e3 for a, b, _ in crcs]) if crcs else 0.0,
        "crc_ms_sum": sum((b - a) * 1e3 for a, b, _ in crcs),
        "last_crc_end_ms": ms(max(b for _, b, _ in crcs)) if crcs else None,
        "chain": [(what, ms(c.start), ms(c.end)) for what, c in chain],
        "cpu_wait": cpu_wait,
        "disk": disk_requests(path),
        "rows": rows if objects else [],
    }
    return res


def render(res: dict) -> str:
    out = [f"### {res['log']}", ""]
    out.append(
        f"{res['reads']} reads ({', '.join(res['syscall'])}; KiB {res['sizes_kib']}) on {res['threads']} threads; "
        f"first read starts {res['first_read_ms']:.1f} ms after the first worker woke, the last ends at "
        f"{res['last_read_end_ms']:.1f} ms; {res['gib_s']:.2f} GiB/s over the reads' span, mean in flight "
        f"{res['mean_in_flight']:.2f}, disk idle (no read in flight) {res['disk_idle_ms']:.1f} ms; a thread's idle "
        f"time before a read: median {res['thread_idle_ms_median']:.2f} ms, sum {res['thread_idle_ms_sum']:.1f} ms; "
        f"each thread's last read ends at {', '.join(f'{x:.1f}' for x in res['thread_last_read_ends_ms'])} ms "
        f"(the batch's tail, from the first thread's end to the last's: "
        f"{res['thread_last_read_ends_ms'][-1] - res['thread_last_read_ends_ms'][0]:.1f} ms); "
        f"file opens {res['opens']} ({res['opens_ms_sum']:.1f} ms); CRCs seen {res['crc_n']} (median "
        f"{res['crc_ms_median']:.2f} ms, sum {res['crc_ms_sum']:.1f} ms"
        + (f", the last ends at {res['last_crc_end_ms']:.1f} ms" if res["last_crc_end_ms"] is not None else "")
        + ")"
    )
    if res["disk"]:
        out.append(f"; disk counters around the restore: {res['disk']}")
    for who, w in res["cpu_wait"].items():
        out.append(f"; {who}' wake-ups waited for a CPU: {w['n']}, median {w['median_ms']:.3f} ms, max "
                   f"{w['max_ms']:.2f} ms, sum {w['sum_ms']:.1f} ms")  # fmt: skip
    out.append("")
    for what, a, b in res["chain"]:
        out.append(f"- {what}: {a:.1f} ms (returns {b:.1f})")
    if res["rows"]:
        out += ["", "| # | thread | start ms | end ms | read ms | MiB | thread idle before, ms | in flight at start |",
                "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in res["rows"]:
            out.append(
                f"| {r['i']} | {r['thread']} | {r['start_ms']:.1f} | {r['end_ms']:.1f} | {r['ms']:.1f} | "
                f"{r['mib']:.3f} | {r['idle_before_ms']:.2f} | {r['in_flight_at_start']} |"
            )
    return "\n".join(out) + "\n"


def table(results: list[dict]) -> str:
    """One row a log: the batch's milestones (ms from the first worker's wake-up) and what the disk and threads did."""
    out = [
        "| log | first read | last read ends | plugin completes | LMCache sees | reads in flight | GiB/s | tail | "
        "last end - mean of threads' ends | "
        "threads idle before reads, sum | CRC threads' wait for a CPU, sum (max) | disk requests |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        chain = dict((what.split(" (")[0], a) for what, a, _ in r["chain"])
        done = chain.get("plugin's eventfd write", float("nan"))
        seen = chain.get("LMCache reads the load eventfd", float("nan"))
        ends = r["thread_last_read_ends_ms"]
        crc = r["cpu_wait"].get("crc") if r["cpu_wait"] else None
        crc_text = f"{crc['sum_ms']:.1f} ({crc['max_ms']:.1f})" if crc and crc["n"] else "-"
        out.append(
            f"| {r['log']} | {r['first_read_ms']:.1f} | {r['last_read_end_ms']:.1f} | {done:.1f} | {seen:.1f} | "
            f"{r['mean_in_flight']:.2f} | {r['gib_s']:.2f} | {ends[-1] - ends[0]:.1f} | "
            f"{ends[-1] - statistics.mean(ends):.1f} | {r['thread_idle_ms_sum']:.1f} | "
            f"{crc_text} | {r['disk'].split(': ', 1)[-1] or '-'} |"
        )
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--min-bytes", type=int, default=1 << 20)
    ap.add_argument("--objects", action="store_true", help="a row for every read")
    ap.add_argument("--table", action="store_true", help="one row a log, no text")
    args = ap.parse_args()
    results = [timeline(Path(log), args.min_bytes, args.objects) for log in args.logs]
    if args.table:
        print(table(results))
        return 0
    for res in results:
        print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
