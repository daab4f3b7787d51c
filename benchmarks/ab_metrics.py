# SPDX-License-Identifier: Apache-2.0
"""The figures ab.py takes from one benchmark run, and the A/B arithmetic over its rounds.

A metric is NAME=KIND:ARGS (benchmarks/README.md, "A/B of two trees"):
  l2:ROW:OP[:KB]             bench_l2.py's rows.json: row ROW's OP (store, load: MiB/s; lookup_us, ...), at KB KiB
                             (needed when the run measured more than one size)
  connector:ROW:OP[:MB[:W]]  bench_connector.py's rows.json (run it with --out {out}): GB/s of row ROW's OP
                             (store, load) from the median of its repetitions' seconds, at MB MiB objects, W workers
                             (the medium's row, run before and after the others: its better pass)
  probe:ROW[:MB]             probe_store_sync.py's JSON (run it with --out {out}/probe.json): GB/s of row ROW
  re:REGEX                   the last match of REGEX in the run's output: its first group, as a number
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path


class MetricMissing(ValueError):
    """The run's output does not hold the figure asked for (the run counts as failed)."""


def parse_metric(text: str) -> tuple[str, str]:
    """NAME=KIND:ARGS -> (NAME, KIND:ARGS), the kind checked."""
    name, sep, spec = text.partition("=")
    kind = spec.split(":", 1)[0]
    if not sep or not name or kind not in EXTRACTORS:
        raise ValueError(f"metric {text!r}: expected NAME=KIND:ARGS with KIND one of {', '.join(EXTRACTORS)}")
    return name, spec


def extract(spec: str, out: Path, output: str) -> float:
    """The figure `spec` names from one run: its output directory `out` and its stdout+stderr `output`."""
    kind, _, args = spec.partition(":")
    return float(EXTRACTORS[kind](args, out, output))


def _one_json(out: Path, name: str) -> dict:
    found = sorted(out.rglob(name))
    if len(found) != 1:
        raise MetricMissing(f"{len(found)} files named {name} under {out}, expected 1")
    return json.loads(found[0].read_text())


def _l2(args: str, out: Path, output: str) -> float:
    row, op, *kb = args.split(":")
    sizes = _one_json(out, "rows.json")
    if kb:
        key = str(int(kb[0]) * 1024)
    elif len(sizes) == 1:
        key = next(iter(sizes))
    else:
        raise MetricMissing(f"the run measured sizes {sorted(sizes)} bytes: name one (l2:ROW:OP:KB)")
    for r in sizes.get(key, []):
        if r["name"] == row:
            if "FAILED" in str(r.get("status")):
                raise MetricMissing(f"row {row!r}: {r['status']}")
            if r.get(op) is None:
                break
            return r[op]
    raise MetricMissing(f"no {op} of row {row!r} at {key} bytes in rows.json")


def _connector(args: str, out: Path, output: str) -> float:
    row, op, *where = args.split(":")
    rows = [r for r in _one_json(out, "rows.json")["rows"] if r.get("row") == row]
    if where:
        rows = [r for r in rows if r["object_mb"] == float(where[0])]
    if len(where) > 1:
        rows = [r for r in rows if r["workers"] == int(where[1])]
    rows = [r for r in rows if r.get(f"{op}_s")]
    if len(rows) > 1 and all("pass" in r for r in rows):
        # The medium's row runs before and after the connector rows (a "pass" each): its better pass is the limit,
        # as bench_connector's own report takes it.
        return max(r["bytes"] / statistics.median(r[f"{op}_s"]) / 1e9 for r in rows)
    if len(rows) != 1:
        raise MetricMissing(f"{len(rows)} rows {row!r} with {op}_s (connector:ROW:OP:MB:WORKERS picks one)")
    return rows[0]["bytes"] / statistics.median(rows[0][f"{op}_s"]) / 1e9


def _probe(args: str, out: Path, output: str) -> float:
    row, *mb = args.split(":")
    sizes = _one_json(out, "*.json")["sizes"]
    key = next((k for k in sizes if not mb or float(k) == float(mb[0])), None)
    if key is None or (not mb and len(sizes) > 1) or not sizes[key]["times_s"].get(row):
        raise MetricMissing(f"no row {row!r} at sizes {list(sizes)} (probe:ROW:MB picks one)")
    return sizes[key]["bytes"] / statistics.median(sizes[key]["times_s"][row]) / 1e9


def _regex(args: str, out: Path, output: str) -> float:
    found = re.findall(args, output)
    if not found:
        raise MetricMissing(f"no match of {args!r} in the output")
    last = found[-1]
    return float(last[0] if isinstance(last, tuple) else last)


EXTRACTORS = {"l2": _l2, "connector": _connector, "probe": _probe, "re": _regex}


def summarize(rounds: list[dict]) -> dict:
    """The A/B figures of one metric: `rounds` holds, per round, the value of each side that succeeded
    ({"A": x, "B": y}, a failed side absent). Per round B/A (rounds where both succeeded); their median; the
    pooled ratio (median of all B over median of all A); each side's spread: how far its rounds lie from their
    own median, as the largest |x / median - 1| (the A/A noise); and whether the median B/A lies outside the
    larger of the two spreads."""
    a = [r["A"] for r in rounds if "A" in r]
    b = [r["B"] for r in rounds if "B" in r]
    ratios = [r["B"] / r["A"] if "A" in r and "B" in r and r["A"] else None for r in rounds]
    paired = [x for x in ratios if x is not None]

    def spread(xs: list[float]) -> float | None:
        if len(xs) < 2:
            return None
        m = statistics.median(xs)
        return max(abs(x / m - 1) for x in xs) if m else None

    s = {"ratios": ratios, "a_spread": spread(a), "b_spread": spread(b)}
    s["median_ratio"] = statistics.median(paired) if paired else None
    s["pooled_ratio"] = statistics.median(b) / statistics.median(a) if a and b and statistics.median(a) else None
    noise = [x for x in (s["a_spread"], s["b_spread"]) if x is not None]
    s["noise"] = max(noise) if noise else None
    if s["median_ratio"] is None or s["noise"] is None:
        s["verdict"] = "not enough successful rounds to judge"
    else:
        outside = abs(s["median_ratio"] - 1) > s["noise"]
        s["verdict"] = (
            f"median B/A {s['median_ratio']:.3f} is {'OUTSIDE' if outside else 'inside'} the noise "
            f"(each side's rounds within +-{s['noise'] * 100:.1f}% of their median)"
        )
    return s
