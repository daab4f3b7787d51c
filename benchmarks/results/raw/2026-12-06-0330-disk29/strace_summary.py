"""Summarizes `strace -f -T -tt` logs of one store run: per syscall (fdatasync/fsync, data writes = pwritev,
pwrite64 and write returning >= 4096 bytes, fallocate) count, total s, p50/p90/p99 ms; the threads that did data
writes: their active window (first start to last end of a data write or sync), the share of that window in writes
and in syncs; and the flags of the opens under the bench's work directory (O_DIRECT or not).
usage: strace_summary.py LOG[.gz]..."""

import collections
import gzip
import re
import sys

LINE = re.compile(r"^(\d+)\s+(\d+):(\d+):([\d.]+)\s+(.*)$")
CALL = re.compile(r"^(\w+)\((\d*)")
RES = re.compile(r"^<\.\.\. (\w+) resumed>")
TAIL = re.compile(r"= (-?\d+)(?: \w+ \(.*\))?\s+<([\d.]+)>$")


def secs(h, m, s):
    return int(h) * 3600 + int(m) * 60 + float(s)


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


for path in sys.argv[1:]:
    pending = {}
    calls = collections.defaultdict(list)  # kind -> [(pid, start, dur)]
    opens = collections.Counter()
    sizes = collections.Counter()
    by_size = collections.defaultdict(list)
    for line in gzip.open(path, "rt") if path.endswith(".gz") else open(path):
        m = LINE.match(line.rstrip())
        if not m:
            continue
        pid, t, rest = int(m.group(1)), secs(m.group(2), m.group(3), m.group(4)), m.group(5)
        if rest.endswith("<unfinished ...>"):
            c = CALL.match(rest)
            if c:
                pending[pid] = (c.group(1), t, c.group(2), rest)
            continue
        r = RES.match(rest)
        if r:
            name, start, fd, head = pending.pop(pid, (r.group(1), t, "", rest))
            full = head + rest
        else:
            c = CALL.match(rest)
            if not c:
                continue
            name, start, fd, full = c.group(1), t, c.group(2), rest
        tl = TAIL.search(rest)
        if not tl:
            continue
        ret, dur = int(tl.group(1)), float(tl.group(2))
        if name == "openat":
            if "/var/tmp/" in full and ret >= 0:
                flags = re.search(r'", ([A-Z_|]+)', full)
                opens[flags.group(1) if flags else "?"] += 1
            continue
        if name in ("write", "pwrite64", "pwritev", "pwritev2"):
            if ret < 4096:
                continue
            calls["data write"].append((pid, start, dur))
            sizes[ret] += 1
            by_size[ret].append(dur)
        elif name in ("fdatasync", "fsync"):
            calls[name].append((pid, start, dur))
        elif name == "fallocate":
            calls[name].append((pid, start, dur))
    print(f"== {path}")
    for kind, xs in sorted(calls.items()):
        ds = [d for _, _, d in xs]
        print(
            f"  {kind}: {len(ds)} calls, {sum(ds):.2f} s in all, ms p50 {q(ds, 0.5) * 1e3:.2f} p90 "
            f"{q(ds, 0.9) * 1e3:.2f} p99 {q(ds, 0.99) * 1e3:.2f} max {max(ds) * 1e3:.2f}"
        )
    threads = collections.defaultdict(list)
    for kind, xs in calls.items():
        for pid, start, dur in xs:
            threads[pid].append((kind, start, dur))
    tot = collections.Counter()
    for pid, xs in sorted(threads.items()):
        if sum(k == "data write" for k, _, _ in xs) < 10:  # the bench's own log/JSON writes, not a store thread
            continue
        lo, hi = min(s for _, s, _ in xs), max(s + d for _, s, d in xs)
        span = hi - lo
        if span < 0.05 or sum(d for k, _, d in xs if k == "data write") < 0.1 * span:
            continue  # opening the card, the bench's own output: not a store worker
        by = collections.Counter()
        for k, _, d in xs:
            by[k] += d
        tot["span"] += span
        for k, v in by.items():
            tot[k] += v
        print(
            f"  thread {pid}: window {span:.2f} s, in data writes {by['data write'] / span:.0%}, in fdatasync "
            f"{(by['fdatasync'] + by['fsync']) / span:.0%}, other {1 - sum(by.values()) / span:.0%}"
        )
    if tot["span"]:
        print(
            f"  all writer threads: in data writes {tot['data write'] / tot['span']:.0%}, in fdatasync/fsync "
            f"{(tot['fdatasync'] + tot['fsync']) / tot['span']:.0%} of their summed windows"
        )
    for size in sorted(by_size, key=lambda k: -len(by_size[k]))[:2]:
        ds = by_size[size]
        print(
            f"  writes of {size} bytes: {len(ds)}, ms p50 {q(ds, 0.5) * 1e3:.2f} p90 {q(ds, 0.9) * 1e3:.2f}, "
            f"{sum(ds):.2f} s in all"
        )
    print("  data write sizes (bytes: count), top 4:", dict(sizes.most_common(4)))
    print(f"  opens under /var/tmp by flags: {dict(opens)}")
