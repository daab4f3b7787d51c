# SPDX-License-Identifier: Apache-2.0
"""A/B of the small-object disk load modes inside LMCache's `lmcache bench l2`, same run, interleaved.

Imports benchmarks/bench_l2.py for its pieces (prefill, reset, adapter specs, lmcache_bench) and runs,
per size and repetition, fs_native O_DIRECT and ADP (4 KiB-aligned L1) with ADP_SMALL_LOAD=0 (header
read, then the payload: main), 1 (header + payload in one read into the buffer), 2 (staged: one read into
staging, then a CRC copy), in a rotating order. Usage: ab_l2.py TREE OUT SIZES_KB REPS [MODES]"""
import json, os, sys, time
from pathlib import Path
tree, out, sizes, reps = Path(sys.argv[1]), Path(sys.argv[2]), [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
modes = sys.argv[5].split(",") if len(sys.argv) > 5 else ["0", "1", "2"]
sys.path.insert(0, str(tree / "benchmarks"))
os.chdir(tree)
import bench_l2 as b  # noqa: E402
out.mkdir(parents=True, exist_ok=True)
work = Path("/var/tmp/lmcache-adp-bench") / f"ab-{os.getpid()}"
work.mkdir(parents=True)
nbytes, card_gb = 2048 * b.MiB, 4
b.prefill(work / "card.img", card_gb * b.GiB)
rows = []
print(f"load {os.getloadavg()}", flush=True)
try:
    for bs_kb in sizes:
        bs = bs_kb * 1024
        specs = {n: (s, a) for n, _, s, a in b.adapters(work, bs, card_gb)}
        variants = [("fs_native O_DIRECT", None)] + [("ADP", m) for m in modes]
        rounds = max(2, nbytes // (b.NUM_KEYS * b.IN_FLIGHT * bs))
        for rep in range(reps):
            k = rep % len(variants)
            for name, mode in variants[k:] + variants[:k]:
                b.reset(work)
                if mode is None:
                    b.SUB_ENV.pop("ADP_SMALL_LOAD", None)
                else:
                    b.SUB_ENV["ADP_SMALL_LOAD"] = mode
                spec, align = specs[name]
                tag = f"{bs_kb}k-{name.split()[0]}-{mode}-rep{rep}"
                r = b.lmcache_bench(spec, align, bs, rounds, out / f"{tag}.json", [])
                r.update(size_kb=bs_kb, name=name, mode=mode, rep=rep, t=time.time(), loadavg=os.getloadavg()[0])
                rows.append(r)
                print(json.dumps(r), flush=True)
finally:
    import shutil
    shutil.rmtree(work)
(out / "rows.json").write_text(json.dumps(rows, indent=1))
import statistics
for bs_kb in sizes:
    for rep in range(reps):
        base = [r for r in rows if r["size_kb"] == bs_kb and r["rep"] == rep and r["mode"] is None][0]
        line = " ".join(f"mode{r['mode']} {r['load']/base['load']:.2f}x" for r in rows
                        if r["size_kb"] == bs_kb and r["rep"] == rep and r["mode"] is not None)
        print(f"{bs_kb} KiB rep {rep}: fs_native load {base['load']:.0f} MiB/s; ADP load / fs_native: {line}")
