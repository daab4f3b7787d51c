"""Per ABAB run: L2->L1 (lookup_s) samples per tier, medians, the issue's ratio (adp - mock) / (fs_native - mock)."""
import glob, json, statistics, re
rows = []
for tree in ("base", "nocrc"):
    for d in sorted(glob.glob(f"/var/tmp/diskqd/trees/{tree}/benchmarks/results/raw/*-restore-disk-diskqd-{tree}-r*")):
        s = json.load(open(d + "/samples.json"))
        r = int(re.search(r"-r(\d+)$", d).group(1))
        rows.append((r, tree, d, s))
print("| round | tree | UTC | load start-end | fs_native s | card s | mock s | fs_native med | card med | mock med | card adds / fs_native adds | card / fs_native |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
ratios = {"base": [], "nocrc": []}
cards = {"base": [], "nocrc": []}
for r, tree, d, s in sorted(rows):
    l2 = {t: [x["lookup_s"] for x in v["l2"]] for t, v in s["tiers"].items()}
    m = {t: statistics.median(v) for t, v in l2.items()}
    ratio = (m["adp"] - m["mock"]) / (m["fs_native"] - m["mock"])
    ratios[tree].append(ratio); cards[tree].append(m["adp"] / m["fs_native"])
    h = s["host"]
    f = lambda v: " ".join(f"{x:.3f}" for x in v)
    print(f"| {r} | {tree} | {s['when'][11:16]} | {h['loadavg_start'][0]:.1f}-{h['loadavg_end'][0]:.1f} | {f(l2['fs_native'])} | {f(l2['adp'])} | {f(l2['mock'])} | {m['fs_native']:.3f} | {m['adp']:.3f} | {m['mock']:.3f} | {ratio:.2f}x | {m['adp']/m['fs_native']:.2f}x |")
for t in ratios:
    if ratios[t]:
        print(f"{t}: ratio median {statistics.median(ratios[t]):.2f}x ({', '.join(f'{x:.2f}' for x in ratios[t])}); card/fs_native median {statistics.median(cards[t]):.2f}x")
