#!/usr/bin/env python3
"""ADP through the gateway daemon against embedded ADP, with LMCache's own `lmcache bench l2`.

For one medium (a directory on a disk, or /dev/shm) and each chunk size, on the
same prefilled card image: embedded ADP, ADP through `lmcache-adp gateway` over
the Unix socket (payload through the shared-memory ring) and over TCP loopback
(payload inline, token), each `--no-skip-verify`, in two passes (the second in
reverse order; each row keeps its better pass). Target: through the ring, store
and load >= 0.9x embedded. Writes benchmarks/results/<date>-<time>-gateway-<medium>.md
and the raw outputs (every bench JSON and log, every gateway log, rows.json) to
benchmarks/results/raw/<date>-<time>-gateway-<medium>/.

    python benchmarks/bench_gateway.py [--medium disk|shm|both] [--sizes-kb 256,2048] [--dir D]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("ADP_LOG_LEVEL", "WARNING")
import lmcache_adp  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MiB, GiB = 1 << 20, 1 << 30
NUM_KEYS, IN_FLIGHT, QD = 32, 4, 4  # as bench_l2.py: 4 batches of 32 keys per round, 4 connector workers
SUB_ENV = {**os.environ, "LMCACHE_DISABLE_BANNER": "1", "ADP_LOG_LEVEL": "INFO"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(work: Path, port: int) -> list[tuple[str, bool, dict]]:
    """(name, needs a gateway, adapter_params)."""
    return [
        ("ADP embedded", False, {"card": str(work / "card.img")}),
        ("ADP via gateway, unix + ring", True, {"gateway": f"unix://{work / 'gw.sock'}"}),
        ("ADP via gateway, TCP loopback", True, {"gateway": f"tcp://127.0.0.1:{port}",
                                                 "token_file": str(work / "gw.token")}),
    ]


@contextlib.contextmanager
def gateway(work: Path, port: int, log: Path):
    """`lmcache-adp gateway` on the card while a row runs; SIGTERM after it."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "lmcache_adp.cli", "gateway", "--card", str(work / "card.img"),
                                 "--socket", str(work / "gw.sock"), "--listen", f"tcp://127.0.0.1:{port}",
                                 "--token-file", str(work / "gw.token")], stdout=out, stderr=subprocess.STDOUT,
                                env=SUB_ENV)
        try:
            deadline = time.monotonic() + 120
            while "gateway ready" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gateway did not start:\n{log.read_text()}")
                time.sleep(0.1)
            yield
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)


def bench(params: dict, bs: int, rounds: int, out: Path) -> dict:
    spec = {"type": "native_plugin", "module_path": "lmcache_adp", "class_name": "ADPConnector",
            "adapter_params": {"num_workers": QD, **params}}
    with open(out.with_suffix(".log"), "w") as log:
        rc = subprocess.run(["lmcache", "bench", "l2", "--l2-adapter", json.dumps(spec), "--num-keys", str(NUM_KEYS),
                             "--in-flight", str(IN_FLIGHT), "--data-size-kb", str(bs // 1024), "--l1-align-bytes",
                             "4096", "--rounds", str(rounds), "--warmup-rounds", "1", "--lookup-max-hit-rate", "1.0",
                             "--no-skip-verify", "--format", "json", "--output", str(out), "-q"],
                            stdout=log, stderr=subprocess.STDOUT, env=SUB_ENV).returncode
    if not out.exists():
        return {"status": f"FAILED (exit {rc})"}
    ops = {m["operation"]: m for k, m in json.loads(out.read_text())["metrics"].items() if k.startswith("op_")}
    complete = all(m["total_success"] == m["total_keys"] and not m["rounds_timed_out"] for m in ops.values())
    row = {"status": "verified" if rc == 0 and complete else f"FAILED (exit {rc}, all keys: {complete})"}
    for op in ("Store", "Load"):
        row[op.lower()] = NUM_KEYS * IN_FLIGHT * bs / MiB / ops[op]["duration_p50_ms"] * 1000
    row["lookup_us"] = ops["Lookup"]["duration_p50_ms"] * 1000 / ops["Lookup"]["keys_per_round"]
    return row


def better(old: dict | None, new: dict) -> dict:
    if old is None or "FAILED" in new["status"]:
        return new
    if "FAILED" in old["status"]:
        return old
    return {**old, "store": max(old["store"], new["store"]), "load": max(old["load"], new["load"]),
            "lookup_us": min(old["lookup_us"], new["lookup_us"])}


def run_medium(medium: str, args: argparse.Namespace, stamp: str) -> Path:
    work = Path(args.dir if medium == "disk" else "/dev/shm/lmcache-adp-bench-gateway")
    raw = RESULTS / "raw" / f"{stamp}-gateway-{medium}"
    work.mkdir(parents=True, exist_ok=True)
    raw.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (work / "gw.token").write_text("bench-token\n")
    nbytes, card_gb = 2048 * MiB, 4
    t0, load0 = time.time(), os.getloadavg()[0]
    # Prefilled like a card in service (no holes, no first touch), as bench_l2.py does.
    subprocess.run(["dd", "if=/dev/zero", f"of={work / 'card.img'}", "bs=64M", f"count={card_gb * 16}",
                    "oflag=direct", "conv=fsync", "status=none"], check=True)
    table: dict[int, dict[str, dict]] = {}
    try:
        for kb in args.sizes_kb:
            bs = kb * 1024
            rounds = max(2, nbytes // (NUM_KEYS * IN_FLIGHT * bs))
            entries = rows(work, port)
            got: dict[str, dict] = {}
            for p, order in enumerate((entries, entries[::-1]), 1):
                for name, needs_gateway, params in order:
                    lmcache_adp.format_card(str(work / "card.img"))
                    os.sync()
                    print(f"  {medium} {kb} KiB, pass {p}: {name}", flush=True)
                    slug = "".join(c if c.isalnum() else "-" for c in name.lower())
                    out = raw / f"{kb}k-{slug}-pass{p}.json"
                    with gateway(work, port, out.with_suffix(".gateway.log")) if needs_gateway else contextlib.nullcontext():
                        got[name] = better(got.get(name), {"name": name, **bench(params, bs, rounds, out)})
            table[bs] = got
    finally:
        for name in ("card.img", "gw.token"):
            (work / name).unlink(missing_ok=True)
        if medium == "shm":
            shutil.rmtree(work, ignore_errors=True)
    (raw / "rows.json").write_text(json.dumps(table, indent=1))
    md = RESULTS / f"{stamp}-gateway-{medium}.md"
    md.write_text(report(table, medium, work, (load0, os.getloadavg()[0]), time.time() - t0))
    return md


def report(table: dict[int, dict[str, dict]], medium: str, work: Path, load: tuple[float, float], secs: float) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    lines = [f"# Gateway benchmark: {medium} ({work})", "",
             f"{datetime.datetime.now():%Y-%m-%d %H:%M}, commit {commit}, {os.cpu_count()} cores, load average "
             f"{load[0]:.1f} at the start and {load[1]:.1f} at the end; took {secs / 60:.1f} min. Command: "
             f"`python benchmarks/bench_gateway.py {' '.join(sys.argv[1:])}`", "",
             f"`lmcache bench l2 --no-skip-verify`, {IN_FLIGHT} batches of {NUM_KEYS} keys per round, 2 GiB per "
             f"measured phase, L1 aligned to 4 KiB, connector num_workers {QD}, gateway --io-contexts 4 and the "
             "default ring (64 MiB per connection). MiB/s and us/key from the median round; each row the better of "
             "two passes. Target: through the ring, store and load >= 0.9x embedded (TCP: no target).", ""]
    for bs, got in table.items():
        emb = got["ADP embedded"]
        lines += [f"## {bs // 1024} KiB chunks", "", "| path | store MiB/s | load MiB/s | lookup us/key "
                  "| store / embedded | load / embedded | result |", "|---|---:|---:|---:|---|---|---|"]
        for name, r in got.items():
            cells = ["-", "-"]
            if name != "ADP embedded" and "store" in r and "store" in emb:
                goal = 0.9 if "ring" in name else None
                cells = [f"{r[op] / emb[op]:.2f}x" + ("" if goal is None else (" ok" if r[op] / emb[op] >= goal
                                                                                else " MISS"))
                         for op in ("store", "load")]
            lines.append(f"| {name} | {r.get('store', 0):,.0f} | {r.get('load', 0):,.0f} | "
                         f"{r.get('lookup_us', 0):.2f} | {cells[0]} | {cells[1]} | {r['status']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default="/var/tmp/lmcache-adp-bench-gateway", help="scratch directory on the disk")
    p.add_argument("--medium", choices=("disk", "shm", "both"), default="both")
    p.add_argument("--sizes-kb", type=lambda s: [int(x) for x in s.split(",")], default=[256, 2048])
    args = p.parse_args()
    stamp = f"{datetime.datetime.now():%Y-%m-%d-%H%M}"
    for medium in ("disk", "shm") if args.medium == "both" else (args.medium,):
        print(f"wrote {run_medium(medium, args, stamp)}", flush=True)


if __name__ == "__main__":
    main()
