# SPDX-License-Identifier: Apache-2.0
"""benchmarks/tools.py: what a benchmark records about the build it measured, and how it stops when a
process it measures dies."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import tools  # noqa: E402


def test_fail_fast_raises_in_a_blocked_main_thread_when_the_watched_process_dies():
    """A benchmark blocked in a long wait (a client's 600 s timeout) gets ProcessDied with the log tail as
    soon as the watched process exits; here the wait would otherwise last 60 s and end without error."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    threading.Timer(0.5, proc.kill).start()
    try:
        with pytest.raises(tools.ProcessDied, match=r"(?s)server exited with -9 while it was measured:\n.*the log"):
            with tools.fail_fast({"server": (proc, lambda: "the log's last lines")}, poll_s=0.1):
                threading.Event().wait(60)
    finally:
        proc.kill()
        proc.wait()


def test_fail_fast_leaves_a_block_alone_while_the_process_lives():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with tools.fail_fast({"server": (proc, lambda: "")}, poll_s=0.05):
            threading.Event().wait(0.3)
    finally:
        proc.kill()
        proc.wait()


def test_native_build_names_the_module_and_records_the_sources_it_was_built_from():
    """The module built by setup.py carries the digest of this tree's C++ sources, findable in its bytes
    without importing it; the suite runs on a fresh build (scripts/run_tests.sh installs it), so not stale."""
    import lmcache_adp._native as native
    from lmcache_adp.source_digest import recorded_digest, source_digest

    b = tools.native_build()
    assert b["module"] == str(Path(native.__file__).resolve())
    assert len(b["sha256"]) == 16 and b["built"].endswith("+00:00")
    assert recorded_digest(Path(native.__file__)) == native.SOURCE_DIGEST
    assert native.SOURCE_DIGEST == source_digest(ROOT), "the extension was built from other sources: rebuild it"
    assert b["sources"] == native.SOURCE_DIGEST[:12] and b["stale"] == []


def copy_of_tree(tmp_path: Path, module_bytes: bytes) -> tuple[Path, Path]:
    """A tree as a benchmark run from a copy sees it (no git checkout): this package's source_digest.py, a
    module of the given bytes, and this tree's src_cpp. Returns (tree, module)."""
    from lmcache_adp import _native

    tree = tmp_path / "tree"
    (tree / "lmcache_adp").mkdir(parents=True)
    shutil.copy(ROOT / "lmcache_adp" / "source_digest.py", tree / "lmcache_adp")
    so = tree / "lmcache_adp" / Path(_native.__file__).name
    so.write_bytes(module_bytes)
    shutil.copytree(ROOT / "src_cpp", tree / "src_cpp")
    return tree, so


def test_native_build_is_stale_when_the_sources_differ_not_when_their_times_moved(tmp_path):
    """A rebase rewrites sources and their times without changing a byte: not stale. One byte changed in one
    source (dated before the build, even): stale. A module without a recorded digest: stale, saying why."""
    from lmcache_adp.source_digest import MARKER, source_digest

    digest = source_digest(ROOT)
    tree, so = copy_of_tree(tmp_path, b"\x7fELF..." + MARKER + digest.encode() + b"\0...")
    os.utime(so, (1_000_000_000, 1_000_000_000))  # built 2001-09-09; every source is newer
    b = tools.native_build(tree / "lmcache_adp")
    assert b["commit"] == f"none ({tree} is not a git checkout)"
    assert b["stale"] == [] and b["sources"] == digest[:12]
    assert "STALE" not in tools.describe_build(b) and "2001-09-09" in tools.describe_build(b)

    src = tree / "src_cpp" / "store" / "card_device.cc"
    src.write_bytes(src.read_bytes() + b"\n")
    os.utime(src, (900_000_000, 900_000_000))  # older than the build
    b = tools.native_build(tree / "lmcache_adp")
    assert b["stale"] == [f"src_cpp differs from the sources built (built {digest[:12]}, tree now "
                          f"{source_digest(tree)[:12]})"]  # fmt: skip
    assert "STALE: src_cpp differs" in tools.describe_build(b)

    so.write_bytes(b"\x7fELF... built outside setup.py")
    assert tools.native_build(tree / "lmcache_adp")["stale"] == [
        "the module records no source digest (built outside setup.py, or before it recorded one)"
    ]


def test_bench_connector_report_says_why_a_row_is_not_ok():
    """A row marked NO is explained under the table: its error, counts, process counters and the gateway log's
    refusal (the work directory, gateway log included, is gone by the time the report is read)."""
    import bench_connector

    base = {"object_mb": 2.0, "workers": 2, "bytes": 2 << 20, "store_s": [0.001], "load_s": [0.001]}
    medium = {**base, "row": "medium O_DIRECT", "pass": 1, "mismatched": 0}
    good = {**base, "row": "embedded", "failed_keys": 0, "mismatched": 0}
    refusal = "gateway: client #4 (unix pid 7 uid 0): process memory refused, the ring stays: no access"
    bad = {**base, "row": "gateway unix+process", "failed_keys": 3, "mismatched": 0,
           "stats": {"process_loads": 0, "process_stores": 5}, "error": "loads or stores did not go through process memory",
           "gateway_log": [refusal]}  # fmt: skip
    meta = {"command": "bench_connector.py"}
    text = bench_connector.report([medium, good, bad], None, meta)
    assert "| gateway unix+process | 2.10 | 2.10 | 1.00x | 1.00x | 1.00x, 1.00x | NO |" in text
    why = text.split("Rows not ok:", 1)[1]
    assert "gateway unix+process: NO: loads or stores did not go through process memory; 3 failed keys" in why
    assert "(process loads 0, process stores 5)" in why and refusal in why and "embedded" not in why
    assert "Rows not ok" not in bench_connector.report([medium, good], None, meta)


def test_device_matrix_leaves_what_the_device_tool_returns(tmp_path):
    """benchmarks/device_matrix.sh on two trees: every file, rows.json included, at most 2 folders below the
    device tool's $OUT and at most 8 of them (what the tool brings back, /work/.library/device/README.md).
    Builds are stubbed (a python3 that skips pip and setup.py: nothing is installed); bench_connector runs,
    tiny, from this tree's in-place build."""
    shim = tmp_path / "bin" / "python3"
    shim.parent.mkdir()
    shim.write_text(
        "#!/bin/bash\n"
        'case "$1" in\n'
        "  -m|setup.py) exit 0 ;;  # pip install, build_ext: stubbed\n"
        '  -) cat >/dev/null; echo "crc32c (stub)"; exit 0 ;;\n'
        f'  *) exec {sys.executable} "$@" ;;\n'
        "esac\n"
    )
    shim.chmod(0o755)
    trees = [tmp_path / "a" / "main", tmp_path / "b" / "other"]  # two trees, as an A/B call
    for t in trees:
        t.parent.mkdir()
        t.symlink_to(ROOT)
    device_out = tmp_path / "OUT"
    out = device_out / "m1"
    env = {**os.environ, "PATH": f"{shim.parent}:{os.environ['PATH']}", "OUT": str(device_out)}
    env["BENCH_ARGS"] = (
        f"--dir {tmp_path / 'card'} --workers 1 --sizes-mb 1 --total-mb 4 --reps 1 --gateway-rows pieces"
    )
    r = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "device_matrix.sh"), str(out), *map(str, trees)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bench main: exit 0" in r.stdout and "bench other: exit 0" in r.stdout, r.stdout + r.stderr
    files = [p.relative_to(device_out) for p in device_out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(f.parts) <= 3 for f in files), files  # $OUT/a/b/file at most
    rows = sorted(f for f in files if f.name.endswith(".rows.json"))
    assert [r.name.split("-")[-1] for r in rows] == ["main.rows.json", "other.rows.json"], files
    for f in rows:
        assert [row["row"] for row in json.loads((device_out / f).read_text())["rows"]][:2] == [
            "medium O_DIRECT",
            "embedded",
        ]
    assert "device tool returns 8 at most" not in r.stdout


def test_native_build_names_the_uncommitted_native_sources(tmp_path):
    """A module measured from a git checkout names its commit and, where the tree's native sources (src_cpp,
    setup.py) have uncommitted changes, which files: the first three, then how many more. A change elsewhere
    (README.md) is not named: it does not change the module."""
    from lmcache_adp.source_digest import MARKER, source_digest

    tree, _ = copy_of_tree(tmp_path, b"\x7fELF..." + MARKER + source_digest(ROOT).encode() + b"\0...")
    (tree / "setup.py").write_text("# setup\n")
    (tree / "README.md").write_text("# readme\n")
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "src_cpp", "setup.py", "README.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "tree"], check=True)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert tools.native_build(tree / "lmcache_adp")["commit"] == head

    (tree / "README.md").write_text("# readme, changed\n")
    assert tools.native_build(tree / "lmcache_adp")["commit"] == head
    src = tree / "src_cpp" / "store" / "card_device.cc"
    src.write_bytes(src.read_bytes() + b"\n")
    (tree / "setup.py").write_text("# setup, changed\n")
    assert tools.native_build(tree / "lmcache_adp")["commit"] == (
        f"{head} with uncommitted changes in setup.py, src_cpp/store/card_device.cc"
    )
    for name in ("card_store.cc", "recovery.cc", "verify.cc"):
        (tree / "src_cpp" / "store" / name).write_text("// changed\n")
    assert tools.native_build(tree / "lmcache_adp")["commit"] == (
        f"{head} with uncommitted changes in setup.py, src_cpp/store/card_device.cc, "
        "src_cpp/store/card_store.cc and 2 more"
    )


def test_native_build_measures_the_module_the_import_would_load(tmp_path):
    """Beside the module the import loads (_native<this interpreter's suffix>) a package may hold another
    interpreter's build, an .abi3.so or a plain .so: native_build judges the one `import lmcache_adp._native`
    would load there (source_digest.native_module, the test session's rule too), not whichever a glob of
    _native*.so lists first; with none there, FileNotFoundError, not StopIteration."""
    from lmcache_adp.source_digest import MARKER, native_module, source_digest

    digest = source_digest(ROOT)
    tree, so = copy_of_tree(tmp_path, b"\x7fELF..." + MARKER + digest.encode() + b"\0...")
    pkg = tree / "lmcache_adp"
    assert so.name == "_native" + EXTENSION_SUFFIXES[0]
    later = [pkg / f"_native{suffix}" for suffix in EXTENSION_SUFFIXES[1:]]  # what the import tries next
    other = pkg / "_native.cpython-39-x86_64-linux-gnu.so"  # another interpreter's: never loaded here
    recorded = {f: str(i) * 64 for i, f in enumerate([other, *later])}  # each records a digest of its own
    for f, d in recorded.items():
        f.write_bytes(b"\x7fELF..." + MARKER + d.encode() + b"\0...")
    b = tools.native_build(pkg)
    assert b["module"] == str(so) and b["stale"] == [] and b["sources"] == digest[:12], b
    so.unlink()
    for f in later:
        assert native_module(pkg) == f
        b = tools.native_build(pkg)
        assert b["module"] == str(f) and b["sources"] == recorded[f][:12] and b["stale"], b
        f.unlink()
    assert native_module(pkg) is None
    with pytest.raises(FileNotFoundError, match=re.escape(f"no native module (lmcache_adp._native) in {pkg}")):
        tools.native_build(pkg)


def test_native_build_judges_a_sanitizer_build_by_its_tree_sources(tmp_path):
    """scripts/sanitize.sh asan-python's module (<tree>/build/sanitize/asan-python/py/lmcache_adp) records the
    sources' digest: native_build names it a sanitizer build and judges it against <tree>'s src_cpp, stale
    only when they differ (or when it records none, as such builds did before session seven)."""
    from lmcache_adp.source_digest import MARKER, source_digest

    digest = source_digest(ROOT)
    tree, so = copy_of_tree(tmp_path, b"")
    pkg = tree / "build" / "sanitize" / "asan-python" / "py" / "lmcache_adp"
    pkg.mkdir(parents=True)
    shutil.copy(tree / "lmcache_adp" / "source_digest.py", pkg)
    sanitized = pkg / so.name
    sanitized.write_bytes(b"\x7fELF asan..." + MARKER + digest.encode() + b"\0...")
    b = tools.native_build(pkg)
    assert b["sanitizer"] == "asan-python" and b["stale"] == [] and b["sources"] == digest[:12], b
    assert "(sanitizer build: asan-python)" in tools.describe_build(b) and "STALE" not in tools.describe_build(b)

    src = tree / "src_cpp" / "python" / "bindings.cc"
    src.write_bytes(src.read_bytes() + b"\n")
    assert tools.native_build(pkg)["stale"] == [
        f"src_cpp differs from the sources built (built {digest[:12]}, tree now {source_digest(tree)[:12]})"
    ]
    sanitized.write_bytes(b"\x7fELF asan, no digest")
    assert tools.native_build(pkg)["stale"] == [
        "the module records no source digest (built outside setup.py, or before it recorded one)"
    ]
    assert tools.native_build(tree / "lmcache_adp")["sanitizer"] is None  # the tree's own build


def test_round_orders_shuffle_the_first_round_by_the_seed_and_reverse_every_other():
    """bench_restore.py's tier order: with one round, each tier comes first for some seed (it ran the given
    order, fs_native before the card, in every one-round run); the same seed gives the same orders (recorded
    with the results); every other round is the reverse of the first."""
    tiers = ["mock", "adp", "adp_gw", "fs_native"]
    firsts = {tools.round_orders(tiers, 1, seed)[0][0] for seed in range(50)}
    assert firsts == set(tiers)
    orders = tools.round_orders(tiers, 4, 7)
    assert orders == tools.round_orders(tiers, 4, 7)
    assert sorted(orders[0]) == sorted(tiers)
    assert orders[1] == orders[0][::-1] and orders[2] == orders[0] and orders[3] == orders[1]
