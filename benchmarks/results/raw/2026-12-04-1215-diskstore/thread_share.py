"""Per thread of an `strace -f -T -tt -e trace=fdatasync,pwritev` log of count_syncs.py
(../2026-12-04-0900-storesync/count_syncs.py): seconds in pwritev and in fdatasync, and the span from the thread's
first to last such call; the fdatasyncs' count and times (unfinished/resumed lines joined); and the write-to-write
gaps of each thread with a sync between them (the commit on the worker's path). Threads with fewer than 50 calls
are left out. usage: thread_share.py LOG... (plain or .gz)"""
import gzip
import re
import sys
from collections import defaultdict



def read_open(f: str):
    return gzip.open(f, "rt") if f.endswith(".gz") else open(f)


pat = re.compile(r"^(\d+)\s+(\d+):(\d+):([\d.]+)\s+(?:<\.\.\. )?(pwritev|fdatasync)(?:\(| resumed>).*<([0-9.]+)>$")
for f in sys.argv[1:]:
    per = defaultdict(lambda: {"pwritev": 0.0, "fdatasync": 0.0, "n": 0, "first": None, "last": 0.0})
    for line in read_open(f):
        m = pat.match(line)
        if not m:
            continue
        pid, h, mi, s, call, dur = m.groups()
        t = int(h) * 3600 + int(mi) * 60 + float(s)
        d = per[pid]
        d[call] += float(dur)
        d["n"] += 1
        d["first"] = t if d["first"] is None else d["first"]
        d["last"] = t + float(dur)
    tot_w = tot_s = tot_span = 0.0
    for pid, d in sorted(per.items()):
        if d["n"] < 50:
            continue
        span = d["last"] - d["first"]
        tot_w += d["pwritev"]; tot_s += d["fdatasync"]; tot_span += span
        print(f"{f} thread {pid}: calls {d['n']} span {span:.2f} s, pwritev {d['pwritev']:.2f} s "
              f"({d['pwritev'] / span:.0%}), fdatasync {d['fdatasync']:.2f} s ({d['fdatasync'] / span:.0%})")
    if tot_span:
        print(f"{f} workers together: pwritev {tot_w / tot_span:.0%} fdatasync {tot_s / tot_span:.0%} of their spans")


def commit_gaps(f: str) -> None:
    """Per worker thread: the time from a pwritev's end to the next pwritev's start when an fdatasync lies between
    (the commit of a slice on the worker's path: frontier wait, sync, indexing, completion, taking the next slice),
    against all the time between pwritevs."""
    ev = defaultdict(list)  # pid -> [(start, end, call)]
    pending = {}
    for line in read_open(f):
        m = re.match(r"^(\d+)\s+(\d+):(\d+):([\d.]+)\s+(.*)$", line)
        if not m:
            continue
        pid, h, mi, s, rest = m.groups()
        t = int(h) * 3600 + int(mi) * 60 + float(s)
        c = re.match(r"(pwritev|fdatasync)\(", rest)
        if c and "<unfinished" in rest:
            pending[pid] = (t, c.group(1))
            continue
        r = re.match(r"<\.\.\. (pwritev|fdatasync) resumed>.*<([0-9.]+)>$", rest)
        if r and pid in pending:
            t0, call = pending.pop(pid)
            ev[pid].append((t0, t + 0 * float(r.group(2)), call))
            continue
        d = re.match(r"(pwritev|fdatasync)\(.*<([0-9.]+)>$", rest)
        if d:
            ev[pid].append((t, t + float(d.group(2)), d.group(1)))
    for pid, e in sorted(ev.items()):
        if len(e) < 50:
            continue
        gap_sync = gap_other = insync = 0.0
        last_w_end = None
        saw_sync = False
        for t0, t1, call in e:
            if call == "fdatasync":
                saw_sync = True
                insync += t1 - t0
                continue
            if last_w_end is not None:
                if saw_sync:
                    gap_sync += t0 - last_w_end
                else:
                    gap_other += t0 - last_w_end
            saw_sync = False
            last_w_end = t1
        span = e[-1][1] - e[0][0]
        print(f"{f} thread {pid}: span {span:.2f} s; write-to-write gaps with a sync between {gap_sync:.3f} s "
              f"({gap_sync / span:.1%}; of it in fdatasync {insync:.3f} s), other gaps {gap_other:.3f} s "
              f"({gap_other / span:.1%})")


def sync_times(f: str) -> None:
    ts = sorted(
        float(m.group(1)) * 1e3
        for m in re.finditer(r"fdatasync(?:\(| resumed>).*<([0-9.]+)>\n", read_open(f).read())
    )
    if ts:
        q = lambda p: ts[min(len(ts) - 1, int(len(ts) * p))]  # noqa: E731
        print(f"{f}: {len(ts)} fdatasyncs, ms p50 {q(0.5):.2f} p90 {q(0.9):.2f} p99 {q(0.99):.2f} "
              f"max {ts[-1]:.2f}, sum {sum(ts):.0f} ms")


for f in sys.argv[1:]:
    commit_gaps(f)
    sync_times(f)
