import sys, re
def load(p):
    d = {}
    for line in open(p):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls = int(f[3]); d[f[-1]] = calls
    return d
a, b, n = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
rows = sorted(((b.get(k, 0) - a.get(k, 0)) / n, k) for k in set(a) | set(b))
for v, k in reversed(rows):
    if abs(v) >= 0.05: print(f"  {k:16s} {v:7.2f} per key (store+load)")
