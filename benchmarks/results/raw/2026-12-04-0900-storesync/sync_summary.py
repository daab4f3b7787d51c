"""Summarizes an `strace -f -T -e trace=fdatasync` log: count, p50/p90/p99/max ms, total ms."""
import re
import sys

for f in sys.argv[1:]:
    ts = sorted(float(m.group(1)) * 1e3 for m in re.finditer(r"fdatasync\(.*<([0-9.]+)>", open(f).read()))
    if not ts:
        print(f, "no fdatasync")
        continue
    q = lambda p: ts[min(len(ts) - 1, int(len(ts) * p))]  # noqa: E731
    print(f"{f}: {len(ts)} fdatasyncs, ms p50 {q(0.5):.2f} p90 {q(0.9):.2f} p99 {q(0.99):.2f} max {ts[-1]:.2f}, "
          f"sum {sum(ts):.0f} ms")
