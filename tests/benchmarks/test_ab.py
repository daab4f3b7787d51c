# SPDX-License-Identifier: Apache-2.0
"""benchmarks/ab.py and ab_metrics.py: the rounds alternate A,B / B,A, a failed run is reported and left out of
the figures, the B/A and spread arithmetic, the import check, the lock around each run, the figures taken from
each benchmark's JSON, and the scratch trees removed. The trees are injected (no build): each is a directory
with a stub lmcache_adp package, and the "benchmark" a small script that prints a figure."""

from __future__ import annotations

import json
import signal
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ab  # noqa: E402
import ab_metrics  # noqa: E402

# The fake benchmark: its tree's side (tree/side.txt) and how many runs that side had before (the log) give
# its figure: BASE[side] * FACTOR[run], so each side's rounds differ as a real benchmark's do. It exits 3 on
# the runs FAIL names ("B2": B's second run), and reports whether --lock's file was held around it.
BENCH = textwrap.dedent(
    """
    import fcntl, json, sys
    from pathlib import Path
    log, fail, lock = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
    side = Path("side.txt").read_text()
    runs = log.read_text().split() if log.exists() else []
    n = sum(r == side for r in runs) + 1
    log.write_text(" ".join(runs + [side]))
    held = 0
    if lock != "-":
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held = 1
    if f"{side}{n}" in fail:
        sys.exit(3)
    print(f"rate {json.loads(Path('base.json').read_text())[n - 1]} held {held}")
    """
)


def fake_tree(bases: dict, made: list):
    """A make_tree for run_ab: revision "a" or "b" -> a directory with a stub lmcache_adp, side.txt, and its
    figures (base.json); with package=False, no lmcache_adp (the import check must fail)."""

    def make(repo, rev, dest, build_from, log):
        dest.mkdir(parents=True)
        made.append(dest)
        side = rev.removesuffix("-nopkg").upper()
        if not rev.endswith("-nopkg"):
            (dest / "lmcache_adp").mkdir()
            (dest / "lmcache_adp" / "__init__.py").write_text("")
        (dest / "side.txt").write_text(side)
        (dest / "base.json").write_text(json.dumps(bases[side]))
        return f"fake {rev}"

    return make


def run(tmp_path, bases, rounds=4, fail="", lock=None, a="a", b="b"):
    (tmp_path / "bench.py").write_text(BENCH)
    argv = ["--a", a, "--b", b, "--rounds", str(rounds), "--raw", str(tmp_path / "raw"), "--scratch", str(tmp_path)]
    argv += ["--metric", r"rate=re:rate ([0-9.]+)", "--metric", r"held=re:held (\d)"]
    argv += [*(["--lock", lock] if lock else []), "--", sys.executable, str(tmp_path / "bench.py")]
    argv += [str(tmp_path / "log"), fail or "-", lock or "-"]
    made: list[Path] = []
    rc = ab.run_ab(ab.parse_args(argv), make_tree=fake_tree(bases, made))
    summary = json.loads((tmp_path / "raw" / "summary.json").read_text())
    return rc, summary, made


def test_rounds_alternate_a_b_then_b_a_and_each_run_imports_its_own_tree(tmp_path):
    rc, summary, made = run(tmp_path, {"A": [100] * 4, "B": [100] * 4})
    assert rc == 0 and summary["complete"] is True
    assert (tmp_path / "log").read_text().split() == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert [(r["round"], r["side"]) for r in summary["runs"]] == [
        (1, "A"), (1, "B"), (2, "B"), (2, "A"), (3, "A"), (3, "B"), (4, "B"), (4, "A"),
    ]  # fmt: skip
    for r in summary["runs"]:
        tree = made[0] if r["side"] == "A" else made[1]
        assert Path(r["imported"]) == tree / "lmcache_adp" / "__init__.py"
        assert r["imported"] in (Path(r["out"]) / "output.txt").read_text()
        assert "load average" in r["uptime_before"]


def test_b_over_a_per_round_median_pooled_and_spread(tmp_path):
    """A: 100, 90, 110, 100; B: 120, 99, 121, 105 (its runs in order) -> per round B/A 1.2, 1.1, 1.1, 1.05."""
    rc, summary, _ = run(tmp_path, {"A": [100, 90, 110, 100], "B": [120, 99, 121, 105]})
    assert rc == 0
    s = summary["metrics"]["rate"]
    assert s["rounds"] == [{"A": 100, "B": 120}, {"A": 90, "B": 99}, {"A": 110, "B": 121}, {"A": 100, "B": 105}]
    assert s["ratios"] == pytest.approx([1.2, 1.1, 1.1, 1.05])
    assert s["median_ratio"] == pytest.approx(1.1)
    assert s["pooled_ratio"] == pytest.approx(112.5 / 100)  # median of B's rounds (105, 120) over A's (100)
    assert s["a_spread"] == pytest.approx(0.1)  # 90 and 110 around 100
    assert s["b_spread"] == pytest.approx(1 - 99 / 112.5)
    assert "inside the noise" in s["verdict"]


def test_a_difference_larger_than_either_sides_spread_is_called_outside_the_noise():
    s = ab_metrics.summarize([{"A": 100, "B": 150}, {"A": 102, "B": 149}, {"A": 98, "B": 152}])
    assert s["median_ratio"] == pytest.approx(150 / 100)
    assert s["noise"] == pytest.approx(3 / 150)  # B's 152 around 150 (A's is 2%)
    assert "OUTSIDE the noise" in s["verdict"]


def test_a_failed_run_is_reported_and_left_out_of_the_figures(tmp_path, capsys):
    """B's second run (round 2, where B goes first) exits 3: that round has no B/A, A's value that round still
    counts in A's spread and pooled median, the summary names the failure, and run_ab returns 1."""
    rc, summary, _ = run(tmp_path, {"A": [100, 100, 100, 100], "B": [110, 999, 120, 130]}, fail="B2")
    assert rc == 1
    s = summary["metrics"]["rate"]
    assert s["rounds"][1] == {"A": 100}
    assert s["ratios"][1] is None
    assert s["ratios"][0] == pytest.approx(1.1) and s["ratios"][2] == pytest.approx(1.2)
    assert s["median_ratio"] == pytest.approx(1.2)  # of 1.1, 1.2, 1.3: the failed round not counted as 0 or 1
    assert s["pooled_ratio"] == pytest.approx(1.2)  # B's median of 110, 120, 130
    failed = [r for r in summary["runs"] if "failed" in r]
    assert [(r["round"], r["side"], r["failed"]) for r in failed] == [(2, "B", "exit 3")]
    text = (tmp_path / "raw" / "summary.md").read_text()
    assert "FAILED round 2 B: exit 3" in text
    assert "| 2 | B,A | 100 | FAILED | - |" in text
    assert "FAILED round 2 B" in capsys.readouterr().out


def test_a_run_that_imports_another_lmcache_adp_than_its_trees_fails(tmp_path):
    """B's tree has no lmcache_adp: whatever the import finds elsewhere (or nothing), B's runs fail."""
    rc, summary, _ = run(tmp_path, {"A": [100] * 2, "B": [100] * 2}, rounds=2, b="b-nopkg")
    assert rc == 1
    for r in summary["runs"]:
        assert ("failed" in r) == (r["side"] == "B")
        if r["side"] == "B":
            assert "not from the tree" in r["failed"]
    assert summary["metrics"]["rate"]["median_ratio"] is None


def test_the_lock_is_held_around_each_run(tmp_path):
    rc, summary, _ = run(tmp_path, {"A": [100] * 2, "B": [100] * 2}, rounds=2, lock=str(tmp_path / "bench.lock"))
    assert rc == 0
    assert [r["values"]["held"] for r in summary["runs"]] == [1, 1, 1, 1]
    (tmp_path / "nolock").mkdir()
    rc, summary, _ = run(tmp_path / "nolock", {"A": [100] * 2, "B": [100] * 2}, rounds=2)
    assert [r["values"]["held"] for r in summary["runs"]] == [0, 0, 0, 0]


def test_the_scratch_trees_are_removed_after_the_run_and_on_ctrl_c(tmp_path):
    _, _, made = run(tmp_path, {"A": [100], "B": [100]}, rounds=1)
    assert made and not made[0].parent.exists()

    def interrupted(repo, rev, dest, build_from, log):
        dest.mkdir(parents=True)
        made.append(dest)
        if rev == "b":
            raise KeyboardInterrupt
        return "fake"

    args = ab.parse_args(["--rounds", "1", "--raw", str(tmp_path / "raw2"), "--scratch", str(tmp_path),
                          "--a", "a", "--b", "b", "--metric", "x=re:x", "--", "true"])  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        ab.run_ab(args, make_tree=interrupted)
    assert not made[-1].parent.exists()


def test_figures_from_bench_l2_rows_copied_from_the_tree(tmp_path):
    """bench_l2.py writes results/<stamp>-disk.md and results/raw/<stamp>-disk/rows.json in its tree and says
    "wrote <md>": ab.py copies both into the run's directory, and l2:ROW:OP[:KB] reads the row there."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    raw = tree / "benchmarks" / "results" / "raw" / "2026-12-04-1900-disk"
    raw.mkdir(parents=True)
    rows = {
        "2097152": [
            {"name": "fio O_DIRECT QD4", "status": "psync, sequential", "store": 2500.0, "load": 1200.0},
            {"name": "ADP", "status": "verified", "store": 2000.0, "load": 1500.0},
        ]
    }
    raw.joinpath("rows.json").write_text(json.dumps(rows))
    md = tree / "benchmarks" / "results" / "2026-12-04-1900-disk.md"
    md.write_text("# report")
    out.mkdir()
    ab.collect_reports(f"disk: ...\nwrote {md}\n", tree, out)
    assert (out / md.name).read_text() == "# report"
    assert ab_metrics.extract("l2:ADP:load", out, "") == 1500.0
    assert ab_metrics.extract("l2:ADP:store:2048", out, "") == 2000.0
    assert ab_metrics.extract("l2:fio O_DIRECT QD4:store", out, "") == 2500.0
    with pytest.raises(ab_metrics.MetricMissing):
        ab_metrics.extract("l2:ADP:store:256", out, "")
    rows["2097152"][1]["status"] = "FAILED: bytes differ"
    raw.joinpath("rows.json").write_text(json.dumps(rows))
    (tmp_path / "out2").mkdir()
    ab.collect_reports(f"wrote {md}\n", tree, tmp_path / "out2")
    with pytest.raises(ab_metrics.MetricMissing, match="bytes differ"):
        ab_metrics.extract("l2:ADP:load", tmp_path / "out2", "")


def test_figures_from_bench_connector_and_probe_store_sync_json(tmp_path):
    """GB/s from the median of the repetitions' seconds: bytes / median(seconds) / 1e9."""
    (tmp_path / "c" / "raw" / "x").mkdir(parents=True)
    rows = [
        {"row": "embedded", "object_mb": 2.0, "workers": 2, "bytes": 4e9, "store_s": [1.0, 4.0, 2.0]},
        {"row": "embedded", "object_mb": 32.0, "workers": 2, "bytes": 4e9, "store_s": [8.0]},
    ]
    (tmp_path / "c" / "raw" / "x" / "rows.json").write_text(json.dumps({"meta": {}, "rows": rows}))
    assert ab_metrics.extract("connector:embedded:store:2", tmp_path / "c", "") == pytest.approx(2.0)
    with pytest.raises(ab_metrics.MetricMissing):
        ab_metrics.extract("connector:embedded:store", tmp_path / "c", "")  # two sizes: which?
    # The medium's row comes twice (its passes before and after the connector rows): the better pass, as the
    # bench's report takes it.
    medium = [
        {"row": "medium O_DIRECT", "pass": 1, "object_mb": 2.0, "workers": 2, "bytes": 4e9, "load_s": [2.0, 2.0]},
        {"row": "medium O_DIRECT", "pass": 2, "object_mb": 2.0, "workers": 2, "bytes": 4e9, "load_s": [1.0, 1.0]},
    ]
    (tmp_path / "c" / "raw" / "x" / "rows.json").write_text(json.dumps({"meta": {}, "rows": rows + medium}))
    assert ab_metrics.extract("connector:medium O_DIRECT:load:2:2", tmp_path / "c", "") == pytest.approx(4.0)
    (tmp_path / "p").mkdir()
    sizes = {"2.0": {"bytes": 3e9, "times_s": {"embedded durable": [3.0, 1.0, 1.5]}}}
    (tmp_path / "p" / "probe.json").write_text(json.dumps({"sizes": sizes}))
    assert ab_metrics.extract("probe:embedded durable", tmp_path / "p", "") == pytest.approx(2.0)
    assert ab_metrics.extract("probe:embedded durable:2", tmp_path / "p", "") == pytest.approx(2.0)


def test_a_metric_of_no_known_kind_is_refused():
    with pytest.raises(SystemExit):
        ab.parse_args(["--raw", "x", "--metric", "x=csv:col", "--", "true"])


def test_a_figure_that_cannot_be_read_fails_that_run_not_the_whole_ab(tmp_path):
    """A rows.json of another shape (a list): that run is reported failed with the reason, the rounds go on."""
    made: list[Path] = []
    write = "import json, sys; open(sys.argv[1] + '/rows.json', 'w').write(json.dumps([1]))"
    argv = ["--a", "a", "--b", "b", "--rounds", "1", "--raw", str(tmp_path / "raw"), "--scratch", str(tmp_path)]
    argv += ["--metric", "store=l2:ADP:store", "--", sys.executable, "-c", write, "{out}"]
    rc = ab.run_ab(ab.parse_args(argv), make_tree=fake_tree({"A": [1], "B": [1]}, made))
    runs = json.loads((tmp_path / "raw" / "summary.json").read_text())["runs"]
    assert rc == 1
    assert [r["side"] for r in runs] == ["A", "B"]
    assert all(r["failed"].startswith("metric store (l2:ADP:store): ") for r in runs)


INTERRUPTING = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    marker, first = Path(sys.argv[1]), Path(sys.argv[2])
    if not first.exists():
        first.write_text("ran")
        print("x 1")
    else:
        try:
            os.kill(os.getppid(), signal.SIGTERM)  # ab.py (here: pytest) told to stop while this run is on
            time.sleep(30)
        finally:
            marker.write_text("cleaned up")
    """
)


def test_sigterm_mid_run_lets_the_benchmark_clean_up_removes_the_trees_and_keeps_the_finished_runs(
    tmp_path, monkeypatch
):
    """SIGTERM to ab.py during B's run of round 1: the benchmark gets SIGINT (its Ctrl-C default restored,
    though ab.py's children inherit it ignored when started in the background) and its finally runs; the
    scratch trees are removed; summary.json keeps A's finished run, marked incomplete; SIGTERM's handler is
    given back."""
    monkeypatch.setattr(ab, "GRACE_S", (0.2, 5.0))
    (tmp_path / "bench.py").write_text(INTERRUPTING)
    argv = ["--a", "a", "--b", "b", "--rounds", "2", "--raw", str(tmp_path / "raw"), "--scratch", str(tmp_path)]
    argv += ["--metric", r"x=re:x (\d)", "--", sys.executable, str(tmp_path / "bench.py")]
    argv += [str(tmp_path / "marker"), str(tmp_path / "first")]
    made: list[Path] = []
    before = signal.getsignal(signal.SIGTERM)
    sigint = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as for `nohup ab.py ... &` from a script
    try:
        with pytest.raises(KeyboardInterrupt):
            ab.run_ab(ab.parse_args(argv), make_tree=fake_tree({"A": [1], "B": [1]}, made))
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert signal.getsignal(signal.SIGTERM) == before
    assert (tmp_path / "marker").read_text() == "cleaned up"
    assert not made[0].parent.exists()
    summary = json.loads((tmp_path / "raw" / "summary.json").read_text())
    assert summary["complete"] is False
    assert [(r["round"], r["side"], r["values"]) for r in summary["runs"]] == [(1, "A", {"x": 1.0})]
    assert "PARTIAL: 1 runs so far" in (tmp_path / "raw" / "summary.md").read_text()
