import json, statistics, sys, glob, os
for d in sys.argv[1:]:
    print("##", d)
    agg = {}
    for f in sorted(glob.glob(d + "/*.json"), key=lambda p: int(os.path.basename(p).split("-")[0])):
        who = os.path.basename(f).split("-")[1].split(".")[0]
        data = json.load(open(f))
        for size, v in data["sizes"].items():
            t = v["times_s"]
            b = v["bytes"]
            med = {k: b / statistics.median(x) / 1e9 for k, x in t.items()}
            paired = [n / d_ for d_, n in zip(t["embedded durable"], t["embedded durable=false"])]  # durable GB/s / nodurable GB/s
            pm = [e / m for m, e in zip(t["medium, end sync"], t["embedded durable"])]
            agg.setdefault((size, who), {"dur/end": [], "dur/nodur": [], "nodur/end": []})
            a = agg[(size, who)]
            a["dur/end"].append(med["embedded durable"] / med["medium, end sync"])
            a["dur/nodur"].append(med["embedded durable"] / med["embedded durable=false"])
            a["nodur/end"].append(med["embedded durable=false"] / med["medium, end sync"])
            print(f"{os.path.basename(f):12} {size:>5} MiB  end {med['medium, end sync']:.2f}  durable {med['embedded durable']:.2f}  nodurable {med['embedded durable=false']:.2f}  durable/end {a['dur/end'][-1]:.2f}x  durable/nodurable {a['dur/nodur'][-1]:.2f}x  per-rep durable/nodurable median {statistics.median(paired):.2f}")
    for (size, who), a in sorted(agg.items()):
        print(f"  {size} MiB {who}: n={len(a['dur/end'])}  durable/end median {statistics.median(a['dur/end']):.2f} (each {' '.join(f'{x:.2f}' for x in a['dur/end'])})  durable/nodurable median {statistics.median(a['dur/nodur']):.2f} (each {' '.join(f'{x:.2f}' for x in a['dur/nodur'])})  nodurable/end {statistics.median(a['nodur/end']):.2f}")
