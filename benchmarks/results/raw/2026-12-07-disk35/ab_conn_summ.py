"""ab.py's bench_connector runs (its medium metrics failed: the medium row comes twice, before and after): GB/s of
each row from each run's rows.json (median of the repetitions' seconds; the medium's better pass), and B/A a round.
Usage: ab_conn_summ.py RAW_DIR"""

import glob
import json
import statistics
import sys

raw = sys.argv[1]
figs: dict[tuple[int, str], dict[str, float]] = {}
for d in sorted(glob.glob(f"{raw}/r*-*")):
    rnd, side = d.rsplit("/", 1)[1][1:].split("-")
    for f in glob.glob(d + "/**/rows.json", recursive=True):
        for r in json.load(open(f))["rows"]:
            if not r.get("store_s"):
                continue
            name = f"{r['row']} {r['object_mb']} MiB x {r['workers']}"
            gbs = r["bytes"] / statistics.median(r["store_s"]) / 1e9
            cur = figs.setdefault((int(rnd), side), {})
            cur[name] = max(cur.get(name, 0.0), gbs)
names = sorted({n for v in figs.values() for n in v})
rounds = sorted({k[0] for k in figs})
for n in names:
    cells, ratios = [], []
    for r in rounds:
        a, b = figs.get((r, "A"), {}).get(n), figs.get((r, "B"), {}).get(n)
        if a and b:
            ratios.append(b / a)
            cells.append(f"r{r} {a:.2f}/{b:.2f} ({b / a:.2f})")
    med = f"{statistics.median(ratios):.2f}" if ratios else "-"
    print(f"{n}: {'; '.join(cells)}; median B/A {med}")
for r in rounds:
    for side in "AB":
        v = figs.get((r, side), {})
        emb = [k for k in v if k.startswith("embedded")]
        print(
            f"r{r}{side}: "
            + ", ".join(f"{k.split(' ', 1)[1]} {v[k] / v['medium O_DIRECT ' + k.split(' ', 1)[1]]:.2f}x" for k in emb)
        )
