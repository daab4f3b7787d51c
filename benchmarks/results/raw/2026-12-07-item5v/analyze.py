#!/usr/bin/env python3
"""item5v: the L2->L1 prefetch of each tier by round and tier order, and the disk around it.

python analyze.py item5v-s5 item5v-s4 ...  (run directories made by run_one.sh; the bench's raw dir is
runs/raw/<stamp>-<tag>/). Per round: each tier's prefetch (LMCache's log, ms, median of the round's restores),
the card's and fs_native's added time over mock's of the same round and their ratio; the round's order:
A = the card's tier right after fs_native's, B = fs_native's right after the card's. Per L2 prefetch: vda's
counters over it (from sample_disk.py, 0.2 s samples: the window widened to whole samples): MiB read and
written, mean read request, mean read latency (ms reading / reads), flushes, max Dirty / Writeback."""
import csv
import datetime
import glob
import json
import re
import statistics as st
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\].*Prefetch request completed.*\(0 L1, 32 L2\) in ([\d.]+) ms "
                  r"\(external_request_id=(\S+?),")


def read_text(path: Path) -> str:
    """A raw file, gzipped (raw/README.md: files over 20 KB) or not."""
    import gzip

    if path.suffix == ".gz":
        return gzip.open(path, "rt", errors="replace").read()
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        return read_text(path.with_name(path.name + ".gz"))
    return path.read_text(errors="replace")


def log_times(raw: Path) -> dict:
    out = {}
    for log in list(raw.glob("*.log")) + list(raw.glob("*.log.gz")):
        for m in LINE.finditer(read_text(log)):
            end = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(
                tzinfo=datetime.timezone.utc).timestamp()
            out[m.group(3)] = (end - float(m.group(2)) / 1000, end)
    return out


def disk_rows(path: Path) -> list[dict]:
    import gzip

    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


def window(rows: list[dict], t0: float, t1: float) -> dict:
    a = max((r for r in rows if r["t"] <= t0), key=lambda r: r["t"], default=rows[0])
    b = min((r for r in rows if r["t"] >= t1), key=lambda r: r["t"], default=rows[-1])
    inside = [r for r in rows if a["t"] <= r["t"] <= b["t"]]
    d = {k: b[k] - a[k] for k in ("reads", "rsect", "rms", "writes", "wsect", "wms", "flushes", "busy_ms")}
    d["dsect"] = b["dsect"] - a["dsect"] if "dsect" in a else float("nan")
    return {
        "read_mib": d["rsect"] * 512 / 2**20,
        "write_mib": d["wsect"] * 512 / 2**20,
        "read_req_kib": d["rsect"] * 512 / 1024 / d["reads"] if d["reads"] else 0,
        "read_lat_ms": d["rms"] / d["reads"] if d["reads"] else 0,
        "flushes": d["flushes"],
        "discard_mib": d["dsect"] * 512 / 2**20,
        "dirty_max_mib": max(r["dirty_kib"] for r in inside) / 1024,
        "wb_max_mib": max(r["writeback_kib"] for r in inside) / 1024,
        "load": b["load1"],
    }


def tier_windows(path: Path) -> dict:
    """(tier, round) -> (start, end) wall times from run_one.sh's time-stamped bench output."""
    out, cur = {}, None
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        t, _, text = line.partition(" ")
        m = re.match(r"(\w+) \(round (\d+)\) \.\.\.", text)
        if m:
            cur = (m.group(1), int(m.group(2)), float(t))
        elif cur and text.strip().startswith("L1 restore"):
            out[cur[:2]] = (cur[2], float(t))
            cur = None
    return out


KIND = {"mock": "mock", "adp": "native_plugin", "fs_native": "fs_native"}


def l1_of(d: Path, name: str, win: tuple[float, float] | None) -> dict:
    """The last sample_l1.py sample of this tier's server while its L1 (3 GiB, --l1-size-gb) was mapped."""
    path = d / "l1.jsonl"
    if win is None or not path.exists():
        return {}
    got = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    got = [g for g in got if g["l2"] == KIND[name] and win[0] <= g["t"] <= win[1] and g["l1"]["mib"] >= 3000 and g["l1"]["present"]]
    return got[-1]["l1"] if got else {}


def run(tag: str) -> list[dict]:
    d = HERE / tag
    raws = sorted(glob.glob(str(HERE / "runs" / "raw" / f"*-{tag}")) + glob.glob(str(HERE / "runs" / "raw" / f"*-{tag}-FAILED")))
    if not raws:
        return []
    raw = Path(raws[-1])
    res = json.loads(read_text(raw / "samples.json"))
    times = log_times(raw)
    disk = next((p for p in (d / "disk.csv", d / "disk.csv.gz") if p.exists()), None)
    rows = disk_rows(disk) if disk else []
    out = []
    for rnd, order in enumerate(res["tier_orders"]):
        ia, fi = order.index("adp"), order.index("fs_native")
        kind = "A" if ia == fi + 1 else "B" if fi == ia + 1 else "-"
        rec = {"run": tag, "round": rnd + 1, "order": order, "kind": kind, "tiers": {}}
        rec["note"] = ""
        for name in order:
            t = res["tiers"][name]
            n = len(t["l2"]) // len(t["rounds"])
            if rnd >= len(t["rounds"]):  # a run stopped before this tier's round: the tier's last round stands in
                if name != "mock":
                    raise SystemExit(f"{tag}: no {name} in round {rnd + 1}")
                rec["note"] = f"mock of round {len(t['rounds'])}"
                rs = t["l2"][-n:]
                rec["tiers"][name] = {"restores": [{"ms": r["prefetch"]["ms"], "lookup_s": r["lookup_s"]} for r in rs],
                                      "ms": st.median(r["prefetch"]["ms"] for r in rs), "l1": {}, "store_s": 0, "l2w_s": 0,
                                      "stand_in": True}
                continue
            rs = t["l2"][rnd * n:(rnd + 1) * n]
            per = []
            for r in rs:
                w = times.get(r["request_id"])
                per.append({"ms": r["prefetch"]["ms"], "lookup_s": r["lookup_s"],
                            **(window(rows, *w) if w and rows else {})})
            win = tier_windows(d / "bench.out").get((name, rnd + 1))
            rec["tiers"][name] = {"restores": per, "ms": st.median(p["ms"] for p in per), "l1": l1_of(d, name, win),
                                  "store_s": t["rounds"][rnd]["store_s"], "l2w_s": t["rounds"][rnd]["l2_written_s"]}
        m = rec["tiers"]["mock"]["ms"]
        rec["card_add"] = rec["tiers"]["adp"]["ms"] - m
        rec["fs_add"] = rec["tiers"]["fs_native"]["ms"] - m
        rec["ratio"] = rec["card_add"] / rec["fs_add"]
        rec["pairs"] = [a["ms"] / f["ms"] for a, f in zip(rec["tiers"]["adp"]["restores"], rec["tiers"]["fs_native"]["restores"])]
        end = res["host"].get("loadavg_end")
        if end is None and (d / "uptime.txt").exists():  # a stopped run: run_one.sh's uptime after it
            end = [float(re.search(r"load average: ([\d.]+)", (d / "uptime.txt").read_text().splitlines()[-1]).group(1))]
        rec["load"] = (res["host"]["loadavg_start"][0], (end or [float("nan")])[0])
        rec["syncs"] = {k: v for k, v in res["notes"].items() if k.startswith("sync") and f"round {rnd + 1}" in k}
        out.append(rec)
    return out


def main() -> None:
    recs = [r for tag in sys.argv[1:] for r in run(tag)]
    print("| run | round | order | load start -> end | mock ms | card ms | fs_native ms | card added / fs_native added | card / fs_native prefetch, restore by restore |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        t = r["tiers"]
        print(f"| {r['run']} | {r['round']} | {r['kind']}: {', '.join(r['order'])} | {r['load'][0]:.1f} -> {r['load'][1]:.1f} | "
              f"{t['mock']['ms']:.0f}{' (' + r['note'] + ')' if r['note'] else ''} | {t['adp']['ms']:.0f} | {t['fs_native']['ms']:.0f} | {r['ratio']:.2f}x | "
              + " ".join(f"{p:.2f}" for p in r["pairs"]) + " |")
    print()
    for kind in ("A", "B"):
        rs = [r for r in recs if r["kind"] == kind]
        if not rs:
            continue
        med = {n: st.median(p["ms"] for r in rs for p in r["tiers"][n]["restores"]) for n in ("mock", "adp", "fs_native")}
        print(f"order {kind}: {len(rs)} rounds; medians of all restores: mock {med['mock']:.0f}, card {med['adp']:.0f}, "
              f"fs_native {med['fs_native']:.0f} ms: card added / fs_native added "
              f"{(med['adp'] - med['mock']) / (med['fs_native'] - med['mock']):.2f}x; "
              f"median of the rounds' ratios {st.median(r['ratio'] for r in rs):.2f}x "
              f"({', '.join(f'{r[chr(114) + chr(97) + chr(116) + chr(105) + chr(111)]:.2f}' for r in rs)}); "
              f"card below fs_native in {sum(r['ratio'] < 1 for r in rs)} of {len(rs)} rounds")
    if recs:
        med = {n: st.median(p["ms"] for r in recs for p in r["tiers"][n]["restores"]) for n in ("mock", "adp", "fs_native")}
        print(f"both orders: {len(recs)} rounds; mock {med['mock']:.0f}, card {med['adp']:.0f}, fs_native {med['fs_native']:.0f} ms: "
              f"{(med['adp'] - med['mock']) / (med['fs_native'] - med['mock']):.2f}x; median of the rounds' ratios "
              f"{st.median(r['ratio'] for r in recs):.2f}x; card below fs_native in {sum(r['ratio'] < 1 for r in recs)} of {len(recs)} rounds")
    print()
    print("| run | round | tier | position, after | store s | on L2 s | prefetch ms | MiB read | MiB written | read request KiB | read latency ms | flushes | MiB discarded | Dirty max MiB | Writeback max MiB | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        for i, name in enumerate(r["order"]):
            t = r["tiers"][name]
            prev = r["order"][i - 1] if i else ("fio" if r["round"] == 1 else "(previous round)")
            for j, p in enumerate(t["restores"] if not t.get("stand_in") else []):
                if "read_mib" not in p:
                    continue
                print(f"| {r['run']} | {r['round']} | {name} | {i + 1}, {prev} | {t['store_s']:.2f} | {t['l2w_s']:.2f} | {p['ms']:.0f} | "
                      f"{p['read_mib']:.0f} | {p['write_mib']:.1f} | {p['read_req_kib']:.0f} | {p['read_lat_ms']:.1f} | "
                      f"{p['flushes']:.0f} | {p['discard_mib']:.0f} | {p['dirty_max_mib']:.1f} | {p['wb_max_mib']:.1f} | {p['load']:.1f} |")


if __name__ == "__main__" and sys.argv[1:2] != ["--sizes"]:
    main()


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        for k, i in enumerate(order):
            r[i] = k
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = st.mean(rx), st.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else float("nan")


def by_request_size(tags: list[str]) -> None:
    """Each disk tier's prefetch against the mean size of the disk's read requests during it."""
    recs = [r for tag in tags for r in run(tag)]
    print()
    print("| tier | server (run, round, position) | read request KiB (mean over its restores) | prefetch ms (median) | L1: page KiB, MiB present, mean physical run KiB |")
    print("|---|---|---|---|---|")
    pts = {"adp": [], "fs_native": []}
    for r in recs:
        for name in ("adp", "fs_native"):
            ps = [p for p in r["tiers"][name]["restores"] if p.get("read_req_kib")]
            if not ps:
                continue
            kib = st.mean(p["read_req_kib"] for p in ps)
            ms = st.median(p["ms"] for p in ps)
            pts[name].append((kib, ms))
            l1 = r["tiers"][name]["l1"]
            l1s = f"{l1['page_kib']}, {l1['present'] * 4 // 1024}, {l1['mean_run_kib']:.1f}" if l1 else "-"
            print(f"| {name} | {r['run']} r{r['round']} pos {r['order'].index(name) + 1} | {kib:.0f} | {ms:.0f} | {l1s} |")
    for name, v in pts.items():
        if len(v) > 2:
            print(f"\n{name}: Spearman rank correlation of request size and prefetch time over {len(v)} servers: "
                  f"{spearman([a for a, _ in v], [b for _, b in v]):.2f}")
    allv = pts["adp"] + pts["fs_native"]
    if len(allv) > 2:
        print(f"both: {spearman([a for a, _ in allv], [b for _, b in allv]):.2f} over {len(allv)}")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--sizes":
    by_request_size(sys.argv[2:])
