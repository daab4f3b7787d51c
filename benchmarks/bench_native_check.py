# SPDX-License-Identifier: Apache-2.0
"""What the package's stale-module check (lmcache_adp/native_check.py) costs a start.

Two numbers, one run: source_digest() of this tree in-process (the check's whole work: the digest of
src_cpp), repeated; and a CLI start (`python -m lmcache_adp.cli status --card <missing>`, which runs the
check and stops at the missing card) from two copies of this tree's package and module, in interleaved
pairs: A with src_cpp/ beside the package (the check digests it), B without (the check is one stat). The
difference of the pairs' medians is the check's cost at a start. Writes results/<stamp>-native-check.md and
results/raw/<stamp>-native-check/runs.json; `--stamp` names an existing raw folder (expected.md written first).

    python benchmarks/bench_native_check.py --pairs 20 --digests 50
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lmcache_adp.source_digest import source_digest  # noqa: E402


def cli_start(tree: Path, card: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "ADP_ALLOW_STALE_NATIVE": "0"}
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "status", "--card", card],
        cwd=tree, capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    dt = time.perf_counter() - t0
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr  # the check passed, the card is missing
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--digests", type=int, default=50)
    ap.add_argument("--stamp", default=time.strftime("%Y-%m-%d-%H%M%S", time.gmtime()))
    args = ap.parse_args()
    load_before = os.getloadavg()
    files = [p for p in (ROOT / "src_cpp").rglob("*") if p.suffix in (".cc", ".h")]
    nbytes = sum(p.stat().st_size for p in files)
    digest_s = []
    for _ in range(args.digests):
        t0 = time.perf_counter()
        source_digest(ROOT)
        digest_s.append(time.perf_counter() - t0)
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        for tree in (a, b):
            shutil.copytree(ROOT / "lmcache_adp", tree / "lmcache_adp", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "src_cpp", a / "src_cpp")
        card = str(Path(tmp) / "missing.img")
        cli_start(a, card), cli_start(b, card)  # byte-compile both copies, warm the page cache
        starts = {"A with src_cpp": [], "B without": []}
        for _ in range(args.pairs):
            starts["A with src_cpp"].append(cli_start(a, card))
            starts["B without"].append(cli_start(b, card))
    load_after = os.getloadavg()
    ms = lambda xs: [round(x * 1000, 2) for x in xs]  # noqa: E731
    med = {k: statistics.median(v) * 1000 for k, v in starts.items()}
    pair_diff = [(x - y) * 1000 for x, y in zip(starts["A with src_cpp"], starts["B without"], strict=True)]
    raw = ROOT / "benchmarks" / "results" / "raw" / f"{args.stamp}-native-check"
    raw.mkdir(parents=True, exist_ok=True)
    runs = {
        "files": len(files), "bytes": nbytes, "digest_ms": ms(digest_s), "cli_start_ms": {k: ms(v) for k, v in starts.items()},
        "pair_diff_ms": [round(d, 2) for d in pair_diff], "loadavg_before": load_before, "loadavg_after": load_after,
    }  # fmt: skip
    (raw / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    busy = max(load_before[0], load_after[0]) > 3
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    report = f"""# The stale-module check's cost at a start ({args.stamp} UTC, tree {commit.stdout.strip()})

`python benchmarks/bench_native_check.py --pairs {args.pairs} --digests {args.digests}`; expected before the
change: raw/{args.stamp}-native-check/expected.md. Load average before {load_before[0]:.2f}, after
{load_after[0]:.2f}{" (above 3: the machine was busy, numbers noisy)" if busy else ""}.

| what | median | min | max |
|---|---|---|---|
| source_digest() of src_cpp ({len(files)} files, {nbytes / 1e6:.2f} MB), in-process, {args.digests}x | {statistics.median(digest_s) * 1000:.2f} ms | {min(digest_s) * 1000:.2f} ms | {max(digest_s) * 1000:.2f} ms |
| CLI start, A: src_cpp beside the package (the check digests it), {args.pairs}x | {med["A with src_cpp"]:.1f} ms | {min(starts["A with src_cpp"]) * 1000:.1f} ms | {max(starts["A with src_cpp"]) * 1000:.1f} ms |
| CLI start, B: no src_cpp (a wheel: one stat), {args.pairs}x, interleaved with A | {med["B without"]:.1f} ms | {min(starts["B without"]) * 1000:.1f} ms | {max(starts["B without"]) * 1000:.1f} ms |
| A - B, pair by pair | {statistics.median(pair_diff):.1f} ms | {min(pair_diff):.1f} ms | {max(pair_diff):.1f} ms |

The check's cost at a start is the digest's ({statistics.median(digest_s) * 1000:.2f} ms median, in-process, where
the pairs' difference is within the starts' own spread); against a start of {med["B without"]:.0f} ms that is
{statistics.median(digest_s) / statistics.median(starts["B without"]):.1%}.
"""
    (ROOT / "benchmarks" / "results" / f"{args.stamp}-native-check.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
