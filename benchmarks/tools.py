# SPDX-License-Identifier: Apache-2.0
"""What the benchmarks share: external tools found or refused with how to get them, tables, and the
connector driven as LMCache's adapter drives it."""

from __future__ import annotations

import select
import shutil
import statistics
import time

INSTALL_HINTS = {"fio": "apt-get update && apt-get install -y fio"}


def require_tool(name: str) -> str:
    """Path of `name` on PATH; otherwise stop the benchmark saying how to install it."""
    path = shutil.which(name)
    if path is None:
        hint = INSTALL_HINTS.get(name, f"install {name}")
        raise SystemExit(f"{name} is needed to measure the medium's limit and is not installed: {hint}")
    return path


def emit_table(lines: list[str], output: str | None) -> None:
    """Prints a results table, and writes it to `output` too when one is given."""
    table = "\n".join(lines)
    print(table)
    if output:
        with open(output, "w") as f:
            f.write(table + "\n")


def wait_future(conn, fid: int) -> list[bool]:
    """Waits for ADPConnector future `fid` on its eventfd and drains completions, as LMCache's
    adapter does; returns its per-key results, or raises if the future failed."""
    while True:
        select.select([conn.event_fd()], [], [], 1.0)
        for f, ok, err, per_key in conn.drain_completions():
            if f == fid:
                if not ok:
                    raise RuntimeError(f"future {fid} failed: {err}")
                return list(per_key)


def card_against_peer(conn, keys: list[str], dst: list, peer_name: str, peer_round, reps: int) -> dict:
    """`reps` rounds, alternating: one submit_batch_get of every key into `dst` (buffer views), then
    peer_round() (the peer's load of the same objects). Returns the seconds of each, by row name."""
    times: dict[str, list[float]] = {"card": [], peer_name: []}
    for _ in range(reps):
        t = time.perf_counter()
        hits = wait_future(conn, conn.submit_batch_get(keys, dst))
        times["card"].append(time.perf_counter() - t)
        if not all(hits):
            raise RuntimeError(f"card load missed {hits.count(False)} objects")
        t = time.perf_counter()
        peer_round()
        times[peer_name].append(time.perf_counter() - t)
    return times


def print_rounds(times: dict, gib: float) -> None:
    """One line per row of card_against_peer's times, then the card's median per-round ratio to the peer."""
    width = max(len(name) for name in times)
    for name, ts in times.items():
        print(f"{name:{width}s} median {statistics.median(ts):.3f} s [{min(ts):.3f}-{max(ts):.3f}]  "
              f"{gib / statistics.median(ts):.2f} GiB/s  all {[round(t, 3) for t in ts]}")  # fmt: skip
    peer = next(name for name in times if name != "card")
    ratio = statistics.median(a / b for a, b in zip(times["card"], times[peer], strict=True))
    print(f"card / {peer}, median of the per-round ratios: {ratio:.2f}x; bytes checked: yes")
