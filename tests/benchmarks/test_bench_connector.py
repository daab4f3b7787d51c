# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_connector.py --interleave: every gateway repetition runs next to an embedded one, and the
report's paired ratios are computed from the per-repetition times that rows.json keeps; a failed row still
fails. Tiny runs (1 MiB objects, 2 workers, 2 repetitions) on a card image under tmp_path."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_connector.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

ARGS = ["--workers", "2", "--sizes-mb", "1", "--total-mb", "4", "--reps", "2", "--interleave"]
ARGS += ["--gateway-rows", "pieces,process"]
# The bench made non-dumpable: the gateway may not write into its memory, so the process row's loads and
# stores go through the ring and the row fails (benchmarks/README.md, bench_connector).
NOT_DUMPABLE = (
    "import ctypes, runpy, sys\n"
    "assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE 0\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def bench(tmp_path: Path, *pre: str) -> tuple[list[dict], str]:
    out = tmp_path / "out"
    cmd = [sys.executable, *pre, str(BENCH), *ARGS, "--dir", str(tmp_path / "card"), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (rows,) = out.glob("raw/*/rows.json")
    (md,) = out.glob("*.md")
    return json.loads(rows.read_text())["rows"], md.read_text()


def by_name(rows: list[dict]) -> dict[str, dict]:
    return {r["row"]: r for r in rows if r["row"] != "medium O_DIRECT"}


def paired_line(text: str, row: str) -> list[str]:
    """The cells of `row`'s line in the paired-ratio table."""
    table = text.split("Paired ratios (--interleave)", 1)[1].split("\nPer request (us;", 1)[0]
    (line,) = [x for x in table.splitlines() if x.startswith(f"| 1 MiB | 2 | {row} |")]
    return [c.strip() for c in line.strip("|").split("|")]


def test_interleave_pairs_each_gateway_repetition_with_the_embedded_one_beside_it(tmp_path):
    rows, text = bench(tmp_path)
    rs = by_name(rows)
    e, ring, proc = rs["embedded"], rs["gateway unix+ring"], rs["gateway unix+process"]
    assert all(r.get("interleaved") for r in (e, ring, proc))
    # The order the steps ran in, alternating per repetition (a linear drift cancels in the median): r = 0 the
    # embedded store, the gateway rows' stores in --gateway-rows order, the embedded load, the gateway rows'
    # loads; r = 1 the gateway rows' stores last to first, the embedded store, then the loads in that order.
    order = [(e, ring, proc), (proc, ring, e)]
    at = [x[f"{op}_at_s"][r] for r in range(2) for op in ("store", "load") for x in order[r]]
    assert at == sorted(at), [(x["row"], x["store_at_s"], x["load_at_s"]) for x in (e, ring, proc)]
    for g in (ring, proc):
        for op in ("store", "load"):
            assert len(g[f"{op}_s"]) == len(e[f"{op}_s"]) == 2
            # Computed by hand: GB/s of the gateway's repetition r over the embedded row's in r.
            mine = [(g["bytes"] / gs) / (e["bytes"] / es) for gs, es in zip(g[f"{op}_s"], e[f"{op}_s"], strict=True)]
            assert g[f"paired_{op}"] == mine
    cells = paired_line(text, "gateway unix+ring")
    store = ring["paired_store"]
    load = [(ring["bytes"] / ring["load_s"][r]) / (e["bytes"] / e["load_s"][r]) for r in range(2)]
    assert cells[3] == f"{store[0]:.2f}, {store[1]:.2f}"
    assert cells[4] == f"{statistics.median(store):.2f}x ({min(store):.2f}..{max(store):.2f})"
    assert cells[7] == f"{load[0]:.2f}, {load[1]:.2f}"
    assert cells[8] == f"{statistics.median(load):.2f}x ({min(load):.2f}..{max(load):.2f})"
    mom = statistics.median(e["load_s"]) / statistics.median(ring["load_s"])  # the main table's vs embedded
    assert cells[9] == f"{mom:.2f}x" and cells[11] == "yes"
    # Scatter, by hand for two repetitions: the paired log-ratios' population sd is half their difference; the
    # unpaired ones are gateway 0 against embedded 1 and gateway 1 against embedded 0.
    g, es = ring["load_s"], e["load_s"]
    paired = abs(math.log(es[0] / g[0]) - math.log(es[1] / g[1])) / 2
    unpaired = abs(math.log(es[1] / g[0]) - math.log(es[0] / g[1])) / 2
    assert cells[10] == f"±{math.exp(paired) - 1:.0%} / ±{math.exp(unpaired) - 1:.0%}", cells
    assert "| 1 MiB | 2 | gateway unix+ring | " in text.split("Paired ratios", 1)[0]
    assert "Interleaved (--interleave): each gateway repetition ran next to an embedded one, in an order" in text
    assert "- order: interleaved (--interleave), alternating: odd repetitions reversed" in text
    assert "Rows not ok" not in text


def test_interleave_order_alternates_per_repetition():
    """step_order, which run_interleaved follows (the test above checks a real run's times): None is the embedded
    connector, 0..k-1 the gateway rows in --gateway-rows order."""
    from bench_connector import step_order

    assert [step_order(3, r) for r in range(4)] == [[None, 0, 1, 2], [2, 1, 0, None]] * 2
    assert step_order(1, 0) == [None, 0] and step_order(1, 5) == [0, None]


def test_interleave_still_fails_a_row_whose_loads_missed_process_memory(tmp_path):
    rows, text = bench(tmp_path, "-c", NOT_DUMPABLE)
    rs = by_name(rows)
    assert rs["gateway unix+process"]["error"].startswith("loads or stores did not go through process memory")
    assert "error" not in rs["gateway unix+ring"] and "error" not in rs["embedded"]
    assert paired_line(text, "gateway unix+process")[-1] == "NO"
    assert paired_line(text, "gateway unix+process")[4] == "not ok" == paired_line(text, "gateway unix+process")[8]
    assert paired_line(text, "gateway unix+ring")[-1] == "yes"
    assert text.split("| 1 MiB | 2 | gateway unix+process |", 1)[1].splitlines()[0].endswith("| NO |")
    assert "gateway unix+process: NO: loads or stores did not go through process memory" in text


def test_interleave_marks_a_row_whose_step_raises_failed_and_goes_on(tmp_path, monkeypatch, capsys):
    """In process, with the process row's second load raising: that row is marked failed (the exception in its
    error), the embedded and ring rows finish both repetitions, and every connector is closed."""
    import bench_connector

    load, closed = bench_connector.Rounds.load, []

    def broken(self):
        if self.tag == "m" and len(self.out["load_s"]) == 1:
            raise RuntimeError("injected")
        load(self)

    def close(self, real=bench_connector.Rounds.close):
        closed.append(self.tag) if self.conn is not None else None
        real(self)

    monkeypatch.setattr(bench_connector.Rounds, "load", broken)
    monkeypatch.setattr(bench_connector.Rounds, "close", close)
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", [str(BENCH), *ARGS, "--dir", str(tmp_path / "card"), "--out", str(out)])
    bench_connector.main()
    (path,) = out.glob("raw/*/rows.json")
    rs = by_name(json.loads(path.read_text())["rows"])
    proc = rs["gateway unix+process"]
    assert proc["error"] == "RuntimeError('injected')" and len(proc["load_s"]) == 1 and len(proc["store_s"]) == 2
    assert len(rs["gateway unix+ring"]["load_s"]) == 2 and "error" not in rs["gateway unix+ring"]
    assert len(rs["embedded"]["load_s"]) == 2 and "error" not in rs["embedded"]
    assert sorted(closed) == ["e", "m", "p"]
    text = capsys.readouterr().out
    assert "gateway unix+process: NO: RuntimeError('injected')" in text
    assert paired_line(text, "gateway unix+process")[-1] == "NO"


def test_sizes_below_a_mib_are_whole_blocks(tmp_path):
    """--sizes-mb takes fractions (small objects: the per-operation cost, benchmarks/README.md "Session
    eleven"): 0.0625 is 64 KiB objects; less than one 4 KiB block is refused."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(BENCH), "--workers", "1", "--sizes-mb", "0.0625", "--total-mb", "1", "--reps", "1"]
    cmd += ["--no-gateway", "--dir", str(tmp_path / "card"), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (rows,) = out.glob("raw/*/rows.json")
    e = by_name(json.loads(rows.read_text())["rows"])["embedded"]
    assert (e["object_mb"], e["objects"], e["bytes"]) == (0.0625, 16, 16 * 65536)
    assert e["failed_keys"] == 0 and e["mismatched"] == 0
    cmd[cmd.index("0.0625")] = "0.001"
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "less than one 4 KiB block" in r.stderr, r.stdout + r.stderr


def test_round_trip_table_splits_a_request_into_served_and_round_trip():
    """Per request: embedded, the gateway as its client sees it, the gateway's own time (batch_*_ns / batch_*)
    and the difference. 8 objects, 2 workers, 2 keys a worker: 2 batches of 2 slices, 4 requests a repetition;
    a slice's time = seconds x workers / slices."""
    import bench_connector

    base = {"object_mb": 1.0, "workers": 2, "objects": 8}
    rows = [
        {**base, "row": "embedded", "store_s": [0.004, 0.005, 0.003], "load_s": [0.001, 0.003]},
        {
            **base,
            "row": "gateway unix+segments (own shm L1)",
            "store_s": [0.008],
            "load_s": [0.004],
            "gateway_stats": {"batch_puts": 4, "batch_put_ns": 6_000_000, "batch_gets": 4, "batch_get_ns": 2_000_000},
        },
    ]
    (line,) = [x for x in bench_connector.round_trip_table(rows, 2) if x.startswith("| 1 MiB | 2 | gateway")]
    cells = [c.strip() for c in line.strip("|").split("|")][3:]
    assert cells == ["2000", "4000", "1500", "2500", "1000", "2000", "500", "1500"]
    rows[1]["gateway_stats"] = {}  # a gateway without the counters: no table
    assert bench_connector.round_trip_table(rows, 2) == []


def test_connector_split_table_gives_each_slice_its_parts_from_the_connectors_counters():
    """The connector's split: per slice (the counters' means), the worker's wait / run / done and, through a
    gateway, setup / round trip / finish, the round trip less the gateway's own time (wire), and the requests whose
    reply the worker spun for (reply_spin_us: 3 of 4, 2 of those 3 answered while it polled), and the process's CPU
    time a slice over the timed repetitions (store_cpu_s: 2 ms a repetition of 4 slices; a row without it, an
    empty cell). 8 objects, 2 workers, 2 keys a worker: 4 slices a repetition; the slice column as
    round_trip_table's. An op with no slice counted has no line; a row without the counters (an older build)
    none."""
    import bench_connector

    base = {"object_mb": 1.0, "workers": 2, "objects": 8}
    emb_stats = {"worker_put_slices": 4, "worker_put_pickup_ns": 400_000, "worker_put_run_ns": 4_000_000}
    emb_stats |= {"worker_put_done_ns": 40_000, "worker_put_queue_ns": 8_000_000}
    gw_stats = {"worker_put_slices": 4, "worker_put_pickup_ns": 0, "worker_put_run_ns": 12_000_000}
    gw_stats |= {"worker_put_done_ns": 80_000, "worker_put_queue_ns": 0, "gateway_put_slices": 4}
    gw_stats |= {"gateway_put_setup_ns": 400_000, "gateway_put_requests": 4, "gateway_put_round_trip_ns": 10_000_000}
    gw_stats |= {"gateway_put_finish_ns": 1_600_000, "gateway_put_reply_spins": 3, "gateway_put_reply_spin_hits": 2}
    rows = [
        {**base, "row": "embedded", "store_s": [0.004], "load_s": [0.002], "stats": emb_stats},
        {
            **base,
            "row": "gateway unix+segments (own shm L1)",
            "store_s": [0.008],
            "load_s": [0.004],
            "store_cpu_s": [0.001, 0.003],
            "stats": gw_stats,
            "gateway_stats": {"batch_puts": 4, "batch_put_ns": 6_000_000, "batch_gets": 4, "batch_get_ns": 2_000_000},
        },
    ]
    lines = [x for x in bench_connector.connector_split_table(rows, 2) if x.startswith("| 1 MiB | 2 |")]
    cells = [[c.strip() for c in line.strip("|").split("|")][2:] for line in lines]
    assert cells == [
        ["embedded", "store", "2000", "100", "1000", "10", "", "", "", "", "", "2000", "", ""],
        [
            "gateway unix+segments (own shm L1)",
            "store",
            "4000",
            "0",
            "3000",
            "20",
            "100",
            "2500",
            "1500",
            "1000",
            "400",
            "0",
            "75% (67%)",
            "500",
        ],
    ]
    # Requests that spun and then failed (a gateway gone under the bench): no reply read, so no share to give (it
    # raised ZeroDivisionError and lost the report: review r14b N1). The spun cell is the last but the cpu one.
    gw_stats["gateway_put_requests"] = 0
    lines = [x for x in bench_connector.connector_split_table(rows, 2) if x.startswith("| 1 MiB | 2 | gateway")]
    assert [[c.strip() for c in line.strip("|").split("|")][-2] for line in lines] == [""], lines
    for r in rows:
        r["stats"] = {}
    assert bench_connector.connector_split_table(rows, 2) == []


def test_a_nospin_row_is_its_variant_with_the_reply_spin_off():
    """NAME-nospin in --gateway-rows: NAME's row (its label, paths and buffers) with reply_spin_us 0 and keys of a
    tag of its own (the two rows share one gateway's card); NAME itself adds no parameter (the default spin)."""
    import bench_connector

    label, direct, pieces, process, tag, extra = bench_connector.variant("segments-shm-nospin")
    base = bench_connector.variant("segments-shm")
    assert (label, direct, pieces, process) == (f"{base[0]}, reply_spin_us 0", *base[1:4])
    assert extra == {"reply_spin_us": 0} and base[5] == {} and tag != base[4]
    tags = [bench_connector.variant(n)[4] for n in bench_connector.GATEWAY_VARIANTS]
    assert len({*tags, tag}) == len(tags) + 1


def test_a_ring_mb_row_is_its_variant_with_that_ring():
    """NAME@MB in --gateway-rows: NAME's row with the connector's ring_mb at MB (the ring's A/B in one run), keys
    of a tag of its own, and the row keeps NAME's buffers (segments-shm@MB: a pool of its own; segments@MB is
    left out with --l1 anon as segments is)."""
    import argparse

    import bench_connector

    base = bench_connector.variant("pieces")
    for name, mb, spin in [("pieces@63", 63, {}), ("pieces-nospin@64", 64, {"reply_spin_us": 0})]:
        label, direct, pieces, process, tag, extra = bench_connector.variant(name)
        assert label.startswith(base[0]) and label.endswith(f", ring_mb {mb}")
        assert (direct, pieces, process) == base[1:4] and extra == {**spin, "ring_mb": mb}
        assert tag not in {bench_connector.variant(n)[4] for n in [*bench_connector.GATEWAY_VARIANTS, "pieces-nospin"]}
    assert bench_connector.variant("pieces@63")[4] != bench_connector.variant("pieces@64")[4]
    assert bench_connector.base_row("segments-shm-nospin@64") == "segments-shm"
    args = argparse.Namespace(gateway_rows="pieces@63,segments@64,segments-shm@64", l1="anon")
    assert bench_connector.gateway_variants(args) == ["pieces@63", "segments-shm@64"]


def test_segment_load_table_splits_a_segment_load_from_the_gateways_profile():
    """The gateway's seg_* load-profile steps (ADP_LOAD_PROFILE=1) per object beside embedded's run per object
    (its slice of keys_per_worker objects) and the gateway's served per object; a row without them has no line."""
    import bench_connector

    base = {"object_mb": 2.0, "workers": 4}
    steps = {"seg_item": 900, "seg_context": 10, "seg_get": 860, "seg_prepare": 4, "seg_lease": 6, "seg_copy": 850}
    gs = {f"load_profile_{k}_ns": v * 1000 * 10 for k, v in steps.items()} | {"load_profile_seg_item_n": 10}
    gs |= {"batch_gets": 5, "batch_get_ns": 10 * 950 * 1000}
    # The loads' own populates and the gateway's background populate (session fifteen's last three columns).
    gs |= {"segment_populates": 3, "segment_prefault_bytes": 64 << 20, "segment_prefault_ns": 12_500_000}
    rows = [
        {**base, "row": "embedded", "stats": {"worker_get_slices": 5, "worker_get_run_ns": 5 * 2 * 840 * 1000}},
        {**base, "row": "gateway unix+segments (own shm L1)", "gateway_stats": gs},
        {**base, "row": "gateway unix+ring", "gateway_stats": {"batch_gets": 5, "batch_get_ns": 1}},
    ]
    lines = [x for x in bench_connector.segment_load_table(rows, 2) if x.startswith("| 2 MiB | 4 |")]
    assert [[c.strip() for c in line.strip("|").split("|")][2:] for line in lines] == [
        [
            "gateway unix+segments (own shm L1)",
            *("840", "950", "900.0", "10.0", "860.0", "4.0", "6.0", "850.0", "50.0"),
            *("3", "64", "12.5"),
        ]
    ]
    assert bench_connector.segment_load_table(rows[:1] + rows[2:], 2) == []


def test_a_relative_dir_is_the_callers_not_the_gateways(tmp_path):
    """The gateway the bench starts runs in its card's directory (audit 13: not a checkout's cwd); a
    relative --dir is the caller's, so the card the gateway opens is the one the bench made (review r13 S1:
    a relative --dir failed "card ... does not exist" once the gateway resolved it from its own cwd)."""
    cmd = [sys.executable, str(BENCH), "--workers", "1", "--sizes-mb", "1", "--total-mb", "2", "--reps", "1"]
    cmd += ["--gateway-rows", "pieces", "--dir", "card", "--out", "out"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(next((tmp_path / "out").glob("raw/*/rows.json")).read_text())["rows"]
    (gw,) = [x for x in rows if x["row"].startswith("gateway")]
    assert "error" not in gw and gw["load_s"] and not gw["mismatched"], gw
    assert not (tmp_path / "card" / "card").exists()


def test_timed_threads_waits_for_every_thread_and_raises_the_first_error():
    """The medium rows' thread runner (also probe_store_sync.py's): every thread runs to its end, then one
    thread's error is raised (a short O_DIRECT transfer, a failed fdatasync) instead of a time."""
    import bench_connector

    ran = []
    assert bench_connector.timed_threads(3, ran.append) >= 0 and sorted(ran) == [0, 1, 2]

    def work(t: int) -> None:
        ran.append(t)
        if t == 1:
            raise OSError("short transfer 4096 of 8192")

    ran.clear()
    with pytest.raises(OSError, match="short transfer 4096 of 8192"):
        bench_connector.timed_threads(3, work)
    assert sorted(ran) == [0, 1, 2]


def test_probe_store_sync_syncs_as_the_connector_does_and_checks_the_stores(tmp_path):
    """benchmarks/probe_store_sync.py, tiny: 8 objects of 1 MiB, 2 threads, 2 objects a slice: each "sync per
    slice" row (the plain one, 2 I/Os, 1 I/O, CRC + 1 I/O) makes 2 fdatasyncs a thread per repetition (4),
    timed; the end-sync rows (the plain one, 1 I/O, CRC + 1 I/O: durable=false's medium, session 36) none timed;
    both connector rows store every key (0 failed), and every row (9) has its repetitions' times."""
    out = tmp_path / "times.json"
    probe = ROOT / "benchmarks" / "probe_store_sync.py"
    cmd = [sys.executable, str(probe), "--dir", str(tmp_path / "w"), "--sizes-mb", "1", "--workers", "2"]
    cmd += ["--total-mb", "8", "--reps", "2", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())["sizes"]["1.0"]
    assert res["objects"] == 8 and res["failed"] == {"embedded durable": 0, "embedded durable=false": 0}
    per_slice = (
        "medium, sync per slice",
        "medium, 2 I/Os + sync",
        "medium, 1 I/O + sync",
        "medium, CRC + 1 I/O + sync",
    )
    assert {k: len(v) for k, v in res["syncs_s"].items()} == dict.fromkeys(per_slice, 8)
    assert all(len(t) == 2 for t in res["times_s"].values()) and len(res["times_s"]) == 9
    assert {"medium, end sync", "medium, 1 I/O", "medium, CRC + 1 I/O"} <= set(res["times_s"])
    assert "| medium, CRC + 1 I/O | " in r.stdout
    assert "| embedded durable | " in r.stdout and not list((tmp_path / "w").iterdir())


def test_importing_it_changes_neither_sys_path_nor_pythonpath():
    """It put its tree first on sys.path and on PYTHONPATH as it was imported (tests import it), so every child
    a test started after that inherited the change; now only when run as a script (tools.use_own_tree)."""
    probe = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "before = (list(sys.path), os.environ.get('PYTHONPATH'))\n"
        "import bench_connector\n"
        "after = (list(sys.path), os.environ.get('PYTHONPATH'))\n"
        "print('same' if after == before else f'changed: {before} -> {after}')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "same", r.stdout + r.stderr


def test_interleave_without_gateway_rows_says_the_rows_ran_back_to_back(tmp_path):
    """--interleave with --no-gateway has nothing to pair: the run warns on stderr and its report's order is
    "back to back" (session 35 ran it so, and nothing said the flag did nothing)."""
    out = tmp_path / "out"
    args = ["--workers", "2", "--sizes-mb", "1", "--total-mb", "4", "--reps", "1", "--interleave", "--no-gateway"]
    cmd = [sys.executable, str(BENCH), *args, "--dir", str(tmp_path / "card"), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "with --no-gateway there are none, so the rows run back to back" in r.stderr
    (md,) = out.glob("*.md")
    assert "- order: back to back" in md.read_text()
