# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_l2.py: the same-run pairs pass by pass, rows picked by name, and an extra ADP row that runs
another built package (--extra-adp LABEL=DIR) in the same run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("lmcache")
import bench_l2  # noqa: E402


def test_importing_it_leaves_the_environment_and_the_import_path_alone():
    """Imported, as these tests do while pytest collects them, bench_l2 changes neither os.environ nor sys.path
    (the bench run as a script quiets its own format_card and imports its snapshot): it set ADP_LOG_LEVEL=WARNING
    for every gateway the whole test session started afterwards, hiding their ready lines."""
    code = (
        "import os, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "env, path = dict(os.environ), list(sys.path)\n"
        "import bench_l2, lmcache_adp\n"
        "assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())\n"
        "assert sys.path == path, (sys.path, path)\n"
        "assert 'lmcache-adp-bench-' not in lmcache_adp.__file__, lmcache_adp.__file__\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ADP_LOG_LEVEL"}
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def row(name: str, role: str, passes: list[tuple[float, float]], status: str = "verified") -> dict:
    rates = [{"store": s, "load": ld, "status": status} for s, ld in passes]
    return {"name": name, "role": role, "align": 4096, "status": status, "passes": rates,
            "store": max(s for s, _ in passes), "load": max(ld for _, ld in passes), "lookup_us": 1.0}  # fmt: skip


def test_pass_pairs_divide_each_pass_by_the_best_peer_of_that_pass():
    """Pass 1: ADP 100 against peers 80 and 125 (the best, 125) = 0.80x; pass 2: 150 against 100 = 1.50x. The
    best-of-passes ratio (150 / 125 = 1.20x) hides pass 1's miss; the pairs show it, with the minimum."""
    rows = [
        row("fio O_DIRECT QD4", "fio", [(500, 500), (500, 500)]),
        row("ADP", "adp", [(200, 100), (200, 150)]),
        row("fs_native O_DIRECT", "odirect", [(100, 80), (100, 100)]),
        row("raw_block", "odirect", [(50, 125), (400, 90)]),
        row("fs_native buffered", "buffered", [(900, 900)]),
    ]
    lines = bench_l2.pass_pairs(rows)
    assert "| ADP | 2.00x, 0.50x (min 0.50x) | 0.80x, 1.50x (min 0.80x) |" in lines
    assert not any("buffered" in line or "fio" in line.split("|")[1] for line in lines[5:])
    text = bench_l2.report({256 * 1024: rows}, "disk", Path("/var/tmp/x/run-1"), (0.5, 0.7), 60, passes=2)
    assert "each row is the better of 2 passes" in text
    assert "| ADP | 2.00x, 0.50x (min 0.50x) | 0.80x, 1.50x (min 0.80x) |" in text


def test_pass_pairs_mark_a_failed_pass_and_skip_it_in_the_minimum():
    rows = [
        row("fio O_DIRECT QD4", "fio", [(500, 500), (500, 500)]),
        {**row("ADP", "adp", [(200, 100), (200, 150)]), "passes": [
            {"store": None, "load": None, "status": "FAILED (exit 1, all keys: False)"},
            {"store": 200, "load": 150, "status": "verified"}]},
        row("fs_native O_DIRECT", "odirect", [(100, 80), (100, 100)]),
    ]  # fmt: skip
    assert "| ADP | -, 2.00x (min 2.00x) | -, 1.50x (min 1.50x) |" in bench_l2.pass_pairs(rows)


def built_tree(tmp_path: Path, marker: str) -> Path:
    """A tree whose lmcache_adp is 'built' (a _native module file, never loaded) and says `marker` on import."""
    pkg = tmp_path / "tree" / "lmcache_adp"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"MARK = {marker!r}\n")
    (pkg / f"_native{EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF not a real module")
    return pkg.parent


def test_extra_adp_takes_a_tree_or_its_package_and_refuses_one_without_a_build(tmp_path):
    tree = built_tree(tmp_path, "old")
    assert bench_l2.extra_adp(f"b22={tree}") == ("b22", tree / "lmcache_adp")
    assert bench_l2.extra_adp(f"b22={tree / 'lmcache_adp'}") == ("b22", tree / "lmcache_adp")
    with pytest.raises(Exception, match="expected LABEL=DIR"):
        bench_l2.extra_adp(str(tree))
    (tree / "lmcache_adp" / f"_native{EXTENSION_SUFFIXES[0]}").unlink()
    with pytest.raises(Exception, match="no built lmcache_adp._native"):
        bench_l2.extra_adp(f"b22={tree}")


def test_an_extra_row_runs_its_own_package_and_the_others_this_one(tmp_path, monkeypatch):
    """run_size with --row ADP --row 'fs_native O_DIRECT' and one --extra-adp row: only those rows (and fio) run,
    in reverse order on pass 2; the extra row's bench and its card's format import the extra package (checked by
    a subprocess under the env it gets), the others this tree's; each row keeps every pass's rates."""
    monkeypatch.setattr(bench_l2, "EXTRA", {})
    bench_l2.add_extra("old", built_tree(tmp_path, "old") / "lmcache_adp")
    calls = []

    def which_package(env) -> str:
        code = "import lmcache_adp; print(getattr(lmcache_adp, 'MARK', 'this tree'))"
        return subprocess.run([sys.executable, "-c", code], env=env or bench_l2.SUB_ENV, cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip

    def fake_bench(spec, align, bs, rounds, out, only, env=None):
        calls.append((out.name, which_package(env)))
        return {"status": "verified", "store": 100.0 + len(calls), "load": 50.0 + len(calls), "lookup_us": 1.0}

    formatted = []
    monkeypatch.setattr(bench_l2, "fio", lambda *a, **k: 10.0)
    monkeypatch.setattr(bench_l2, "lmcache_bench", fake_bench)
    monkeypatch.setattr(bench_l2, "native_lookup_us", lambda spec, n: 0.5)
    monkeypatch.setattr(bench_l2, "reset", lambda work, env=None: formatted.append(env and env["PYTHONPATH"]))
    only = bench_l2.selected(["ADP", "fs_native O_DIRECT"])
    assert only == ("ADP", "fs_native O_DIRECT", "ADP old") and bench_l2.selected([]) == ()
    rows = bench_l2.run_size(tmp_path, tmp_path, 256 * 1024, 1 << 30, 4, "disk", passes=2, only=only)

    assert [c[0] for c in calls] == [
        "256k-adp-pass1.json", "256k-adp-old-pass1.json", "256k-fs-native-o-direct-pass1.json",
        "256k-fs-native-o-direct-pass2.json", "256k-adp-old-pass2.json", "256k-adp-pass2.json",
    ]  # fmt: skip
    assert {c[0]: c[1] for c in calls}["256k-adp-old-pass1.json"] == "old"
    assert [c[1] for c in calls if "-old-" not in c[0]] == ["this tree"] * 4
    assert formatted[1].startswith(str(bench_l2.EXTRA["ADP old"]["env"]["PYTHONPATH"]))
    assert [f is None for f in formatted] == [True, False, True, True, False, True, True]
    by_name = {r["name"]: r for r in rows}
    assert [p["load"] for p in by_name["ADP old"]["passes"]] == [52.0, 55.0]
    assert by_name["ADP old"]["load"] == 55.0 and "native_lookup_us" not in by_name["ADP old"]
    assert by_name["ADP"]["native_lookup_us"] == 0.5
    assert set(by_name) == {"fio O_DIRECT QD4", "fio O_DIRECT QD8", bench_l2.FIO_SYNC_ROW, *only}


def test_fio_at_adps_durability_syncs_after_every_slice_and_adp_is_set_beside_it(tmp_path, monkeypatch):
    """Each pass runs one more fio row: QD4 writes with an fdatasync after every 8 writes in each job (a batch of 32
    keys cut into 4 slices, each acknowledged by ADP only once synced); fio QD4 itself syncs only at the end. The
    ratio table sets each ADP row's store beside it, the target (store / fio QD4) unchanged: 85 MiB/s is 0.85x MISS
    of fio QD4 (100) and 1.06x of fio with ADP's syncs (80)."""
    fio_cmds = []

    def fake_sh(cmd, log=None, env=None, cwd=None):
        if cmd[0] == "fio":
            fio_cmds.append(cmd)
            rate = 80 if any(a.startswith("--fdatasync") for a in cmd) else 100
            out = Path(next(a for a in cmd if a.startswith("--output=")).split("=", 1)[1])
            mib = {"bw_bytes": rate * bench_l2.MiB}
            out.write_text(json.dumps({"jobs": [{"write": mib, "read": mib}]}))
        return 0

    monkeypatch.setattr(bench_l2, "sh", fake_sh)
    monkeypatch.setattr(bench_l2, "EXTRA", {})
    bench = {"status": "verified", "store": 85.0, "load": 50.0, "lookup_us": 1.0}
    monkeypatch.setattr(bench_l2, "lmcache_bench", lambda *a, **k: dict(bench))
    monkeypatch.setattr(bench_l2, "native_lookup_us", lambda spec, n: 0.5)
    monkeypatch.setattr(bench_l2, "reset", lambda work, env=None: True)
    rows = bench_l2.run_size(tmp_path, tmp_path, 256 * 1024, 1 << 30, 4, "disk", passes=1, only=("ADP",))

    synced = [c for c in fio_cmds if any(a.startswith("--fdatasync") for a in c)]
    assert len(synced) == 1, fio_cmds
    assert {"--fdatasync=8", "--numjobs=4", "--rw=write", "--bs=262144", "--direct=1"} <= set(synced[0])
    name = "fio O_DIRECT QD4, fdatasync every 8 writes (ADP's syncs)"
    by_name = {r["name"]: r for r in rows}
    assert by_name[name]["store"] == 80 and by_name[name].get("load") is None
    text = bench_l2.report({256 * 1024: rows}, "disk", tmp_path / "run-1", (0.5, 0.7), 60, passes=1)
    assert f"| {name} | fio-sync | - | 80 | - |" in text
    assert "| store / fio QD4 | load / fio QD4 | lookup / fs_native | same, connector only | store / fio QD4 with " \
        "ADP's syncs |" in text  # fmt: skip
    adp = next(line for line in text.splitlines() if line.startswith("| ADP | ") and "MISS" in line)
    assert adp.split(" | ")[3:4] == ["0.85x MISS"] and adp.endswith("| 1.06x ok |"), adp


def test_an_extra_rows_card_is_formatted_by_its_own_package(tmp_path, monkeypatch):
    """reset() for an extra row formats the card in a subprocess that imports the extra package, even when run
    from a checkout (pytest runs in one: `python -c` would import the checkout's lmcache_adp from the cwd); a
    format that fails stops the run, naming the package path."""
    monkeypatch.setattr(bench_l2, "EXTRA", {})
    tree = built_tree(tmp_path, "old")
    (tree / "lmcache_adp" / "__init__.py").write_text(
        "def format_card(path):\n    open(path, 'w').write('formatted by the old package')\n"
    )
    bench_l2.add_extra("old", tree / "lmcache_adp")
    work = tmp_path / "work"
    work.mkdir()
    bench_l2.reset(work, bench_l2.EXTRA["ADP old"]["env"])
    assert (work / "card.img").read_text() == "formatted by the old package"
    (tree / "lmcache_adp" / "__init__.py").write_text("")  # the snapshot is a copy: still formats
    bench_l2.reset(work, bench_l2.EXTRA["ADP old"]["env"])
    snap = Path(bench_l2.EXTRA["ADP old"]["env"]["PYTHONPATH"].split(":")[0])
    (snap / "lmcache_adp" / "__init__.py").write_text("")
    with pytest.raises(RuntimeError, match=f"format_card.*failed with {snap}"):
        bench_l2.reset(work, bench_l2.EXTRA["ADP old"]["env"])


FAKE_DD = """#!/bin/sh
# bench_l2's prefill, stopped in the middle: the image named, its writer waiting (its PID kept for the test)
echo $$ >> "$DD_PIDS"
for a in "$@"; do case "$a" in of=*) : > "${a#of=}";; esac; done
exec sleep 30
"""


def test_sigterm_removes_the_run_directory_and_the_snapshot_as_ctrl_c_does(tmp_path):
    """bench_l2.py stopped by SIGTERM while it writes its images (a dd on PATH that names the image, then
    waits) exits non-zero and leaves neither its run-<pid>/ (card images, fs_native files) nor its package
    snapshot behind; the dd it waited for is gone too. Without a handler SIGTERM killed it where it stood."""
    bin_dir, tmp, work = tmp_path / "bin", tmp_path / "tmp", tmp_path / "work"
    for d in (bin_dir, tmp, work):
        d.mkdir()
    (bin_dir / "dd").write_text(FAKE_DD)
    (bin_dir / "dd").chmod(0o755)
    pids = tmp_path / "dd.pids"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp)}
    env["DD_PIDS"] = str(pids)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_l2.py"), "--medium", "disk", "--dir", str(work)]
    cmd += ["--quick", "--sizes-kb", "256", "--passes", "1", "--row", "ADP"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(work.glob("run-*/card.img")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert list(work.glob("run-*/card.img")), "the bench never started its images"
        assert list(tmp.glob("lmcache-adp-bench-*")), "no snapshot in TMPDIR"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode != 0, out
        assert list(work.iterdir()) == [], (list(work.rglob("*")), out)
        assert list(tmp.iterdir()) == [], list(tmp.rglob("*"))
        for pid in map(int, pids.read_text().split()):
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in map(int, pids.read_text().split()) if pids.exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def fake_pool(tmp_path: Path, total: int, free_after: int) -> Path:
    """A stand-in for /sys/kernel/mm/hugepages/hugepages-2048kB: nr_hugepages as given, free_hugepages what the
    kernel would report after the pool was grown."""
    (tmp_path / "nr_hugepages").write_text(f"{total}\n")
    (tmp_path / "free_hugepages").write_text(f"{free_after}\n")
    return tmp_path


def test_hugetlb_pool_grows_by_one_l1_for_the_run_and_gives_it_back_also_on_an_error(tmp_path):
    """--l1-hugetlb: a 2 MiB L1 of 2 x 32 x 4 chunks is 256 pages (+1); the pool (another user's 10 pages in it)
    is grown by that for the run and set back to 10 after it, also when the run fails."""
    assert bench_l2.l1_pages([256, 2048]) == 257
    root = fake_pool(tmp_path, 10, 257)
    with bench_l2.hugetlb_pool(257, root) as total:
        assert total == 267 and (root / "nr_hugepages").read_text() == "267"
    assert (root / "nr_hugepages").read_text() == "10"
    with pytest.raises(KeyboardInterrupt), bench_l2.hugetlb_pool(257, root):
        raise KeyboardInterrupt
    assert (root / "nr_hugepages").read_text() == "10"


def test_hugetlb_pool_that_cannot_be_had_stops_the_run_with_the_reason_and_gives_back_what_it_got(tmp_path):
    """The kernel found room for only 100 of the 257 pages: the run stops before any row, saying so, and the pool
    is back at 10 (not left at 267 with 100 pages taken from the machine's other users)."""
    root = fake_pool(tmp_path, 10, 100)
    ran = False
    with pytest.raises(SystemExit, match="has 100 free pages after asking for 257 more"):
        with bench_l2.hugetlb_pool(257, root):
            ran = True
    assert not ran and (root / "nr_hugepages").read_text() == "10"
    with pytest.raises(SystemExit, match="cannot grow the 2 MiB hugetlb pool"):
        with bench_l2.hugetlb_pool(1, tmp_path / "missing"):
            pass


def test_the_report_says_which_l1_every_row_had(monkeypatch):
    rows = [row("fio O_DIRECT QD4", "fio", [(500, 500)]), row("ADP", "adp", [(200, 100)])]
    text = bench_l2.report({2048 * 1024: rows}, "disk", Path("/var/tmp/x/run-1"), (0.5, 0.7), 60, passes=1)
    assert "- L1 of every row: ordinary memory" in text
    monkeypatch.setattr(bench_l2, "L1_HUGETLB", True)
    text = bench_l2.report({2048 * 1024: rows}, "disk", Path("/var/tmp/x/run-1"), (0.5, 0.7), 60, passes=1)
    assert "- L1 of every row: hugetlb, 2 MiB pages" in text


def test_a_rows_leftovers_are_moved_aside_not_deleted_before_the_next_row(tmp_path, monkeypatch):
    """reset() before each row: fs_native's files and the other card images go to run-<pid>/retired/<n>/ (deleted
    with the run), because deleting them on a `discard` mount slowed the next row's stores 3-4x
    (results/2026-12-06-1040-fsnative-reset.md). Each retire gets a slot of its own; nothing to retire is fine."""
    work = tmp_path / "run-1"
    (work / "files").mkdir(parents=True)
    (work / "files" / "k0").write_bytes(b"x" * 4096)
    (work / "sparse.img").write_bytes(b"s")
    assert bench_l2.retire(work)
    assert not (work / "files").exists() and not (work / "sparse.img").exists()
    assert (work / "retired" / "0" / "files" / "k0").read_bytes() == b"x" * 4096
    assert (work / "retired" / "0" / "sparse.img").read_bytes() == b"s"
    assert bench_l2.retire(work)  # nothing left: no slot
    (work / "files").mkdir()
    (work / "files" / "k1").write_bytes(b"y")
    assert bench_l2.retire(work)
    assert (work / "retired" / "1" / "files" / "k1").read_bytes() == b"y"
    # Too little free space: deleted (False), and the report names the row that ran after the delete
    monkeypatch.setattr(bench_l2, "RETIRE_MIN_FREE", 1 << 62)
    (work / "files").mkdir()
    (work / "files" / "k2").write_bytes(b"z")
    assert not bench_l2.retire(work)
    assert not (work / "files").exists() and sorted(p.name for p in (work / "retired").iterdir()) == ["0", "1"]
    monkeypatch.setattr(bench_l2, "DELETED_BEFORE", ["fs_native O_DIRECT, 256 KiB, pass 2"])
    rows = [row("fio O_DIRECT QD4", "fio", [(500, 500)]), row("ADP", "adp", [(200, 100)])]
    text = bench_l2.report({256 * 1024: rows}, "disk", work, (0.5, 0.7), 60, passes=1)
    assert "deleted for want of free space" in text and "fs_native O_DIRECT, 256 KiB, pass 2" in text


@pytest.mark.parametrize(
    "seen, refused",
    [
        ([], "no L1 mapped through hugetlb_l1.py (none recorded)"),
        ([{"pid": 7, "bytes": 1 << 29, "ok": False, "check": "no mapping of >= 512 MiB on 2 MiB hugetlb pages: x"}],
         "no mapping of >= 512 MiB on 2 MiB hugetlb pages: x"),
        ([{"pid": 7, "bytes": 1 << 29, "ok": True, "check": "L1 on 2 MiB hugetlb pages: y"}], None),
    ],
)  # fmt: skip
def test_l1_hugetlb_runs_each_bench_through_the_launcher_and_refuses_a_row_whose_l1_is_not_hugetlb(
    tmp_path, monkeypatch, seen, refused
):
    """--l1-hugetlb: `lmcache bench l2 --l1-use-hugepages` ran on ordinary memory (LMCache 0.5.6 without CUDA)
    and the report said hugetlb. Now each bench runs through benchmarks/hugetlb_l1.py, which writes what its
    /proc/self/smaps showed after mapping the L1 to HUGETLB_L1_REPORT; a row with none recorded, or one not on
    hugetlb pages, stops the run with what was seen."""
    calls, report_env = [], "HUGETLB_L1_REPORT"

    def fake_sh(cmd, log, env=None, cwd=None):
        calls.append((cmd, env or {}))
        if report_env in (env or {}):
            Path(env[report_env]).write_text("".join(json.dumps(s) + "\n" for s in seen))
        return 0

    monkeypatch.setattr(bench_l2, "L1_HUGETLB", True)
    monkeypatch.setattr(bench_l2, "sh", fake_sh)
    out = tmp_path / "2048k-adp-pass1.json"
    if refused:
        with pytest.raises(SystemExit, match="--l1-hugetlb: `lmcache bench l2` \\(2048k-adp-pass1.json, exit 0\\): "):
            bench_l2.lmcache_bench({}, 4096, 2 << 20, 2, out, [])
        with pytest.raises(SystemExit, match=refused.replace("(", "\\(").replace(")", "\\)")):
            bench_l2.lmcache_bench({}, 4096, 2 << 20, 2, out, [])
    else:
        assert bench_l2.lmcache_bench({}, 4096, 2 << 20, 2, out, [])["status"] == "FAILED (exit 0)"
    cmd, env = calls[0]
    assert cmd[:4] == [sys.executable, str(ROOT / "benchmarks" / "hugetlb_l1.py"), "bench", "l2"], cmd
    assert "--l1-use-hugepages" in cmd and env.get(report_env) == str(tmp_path / "2048k-adp-pass1.l1.jsonl")
