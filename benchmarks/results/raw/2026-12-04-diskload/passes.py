import json,sys,statistics
from pathlib import Path
d=Path(sys.argv[1])
MiB=1<<20
for size in ("256k","2048k"):
    print(size)
    for p in range(1,9):
        row={}
        for name,slug in (("after","adp"),("before","adp-before"),("straight","adp-straight2m"),("fs","fs-native-o-direct")):
            f=d/f"{size}-{slug}-pass{p}.json"
            if not f.exists(): continue
            m=json.loads(f.read_text())["metrics"]
            ops={v["operation"]:v for k,v in m.items() if k.startswith("op_")}
            row[name]=(ops["Store"]["duration_p50_ms"],ops["Load"]["duration_p50_ms"])
        if not row: continue
        s=" ".join(f"{k} st {v[0]:.1f} ld {v[1]:.1f} ms" for k,v in row.items())
        r=f"load after/fs {row['fs'][1]/row['after'][1]:.2f}x before/fs {row['fs'][1]/row['before'][1]:.2f}x after/before {row['before'][1]/row['after'][1]:.2f}x" if len(row)>=3 else ""
        if "straight" in row: r+=f" straight/fs {row['fs'][1]/row['straight'][1]:.2f}x after/straight {row['straight'][1]/row['after'][1]:.2f}x"
        print(f"  pass {p}: {s}  {r}")
