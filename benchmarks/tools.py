# SPDX-License-Identifier: Apache-2.0
"""What the benchmarks share: external tools found or refused with how to get them, tables, and the
connector driven as LMCache's adapter drives it."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

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


def card_against_peer(conn, keys: list[str], src: list, dst: list, peer_name: str, peer_round, reps: int) -> dict:
    """Stores `src` (buffer views) under `keys`, then `reps` rounds, alternating: one submit_batch_get of every key
    into `dst` (buffer views), then peer_round() (the peer's load of the same objects). Then dst is zeroed, loaded
    once more and compared with src byte for byte (zeroed first: the peer's last round filled dst too, so a card
    load that wrote nothing would pass otherwise). Returns the seconds of each row, by row name."""
    import numpy as np

    assert all(wait_future(conn, conn.submit_batch_set(keys, src)))
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
    loaded = [np.frombuffer(d, dtype=np.uint8) for d in dst]
    for d in loaded:
        d[:] = 0
    hits = wait_future(conn, conn.submit_batch_get(keys, dst))
    stored = [np.frombuffer(s, dtype=np.uint8) for s in src]
    if not all(hits) or not all(np.array_equal(d, s) for d, s in zip(loaded, stored, strict=True)):
        raise RuntimeError("loaded bytes differ from the stored ones")
    return times


def print_rounds(times: dict, gib: float, about: str) -> None:
    """`about` (what was loaded, by whom) with the host's CPUs and load average, one line per row of
    card_against_peer's times, then the card's median per-round ratio to the peer."""
    print(f"{about}, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    width = max(len(name) for name in times)
    for name, ts in times.items():
        print(f"{name:{width}s} median {statistics.median(ts):.3f} s [{min(ts):.3f}-{max(ts):.3f}]  "
              f"{gib / statistics.median(ts):.2f} GiB/s  all {[round(t, 3) for t in ts]}")  # fmt: skip
    peer = next(name for name in times if name != "card")
    ratio = statistics.median(a / b for a, b in zip(times["card"], times[peer], strict=True))
    print(f"card / {peer}, median of the per-round ratios: {ratio:.2f}x; bytes checked: yes")


def exit_on_sigterm() -> None:
    """From now on SIGTERM raises SystemExit(143) in the main thread: a benchmark stopped by it unwinds as on
    Ctrl-C (its finally blocks remove its work files, subprocess.run kills the child it waits for, atexit
    handlers run) and exits non-zero, instead of dying with its card images and peers' files left behind. A
    second SIGTERM while it cleans up is ignored (a handler that does nothing: children started meanwhile get
    the default action back at exec, not an ignored signal); SIGKILL still stops it."""

    def stop(signum: int, frame) -> None:
        signal.signal(signal.SIGTERM, lambda *_: None)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def round_orders(names: list[str], rounds: int, seed: int) -> list[list[str]]:
    """The order `names` run in, round by round: shuffled by `seed` (random.Random) in the first round, reversed
    every other round. A single round then favours none of them by the order they were given (bench_restore.py
    ran fs_native before the card in every one-round run), and two rounds put each early once and late once."""
    import random

    first = list(names)
    random.Random(seed).shuffle(first)
    return [first if r % 2 == 0 else first[::-1] for r in range(rounds)]


def _uncommitted(porcelain: str, shown: int = 3) -> str:
    """' with uncommitted changes in <the changed paths>' from `git status --porcelain` lines (a rename's
    new path; the first `shown`, then how many more), or '' where nothing changed."""
    paths = [line[3:].split(" -> ")[-1] for line in porcelain.splitlines() if line.strip()]
    if not paths:
        return ""
    more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
    return f" with uncommitted changes in {', '.join(paths[:shown])}{more}"


def native_build(package: Path | None = None) -> dict:
    """Which native module is measured (the one this process imported, or the one in `package`, an
    lmcache_adp directory): its file, the commit of the tree it was built in (or why there is none), when it
    was built, a digest of it, and whether it is stale: built from other C++ sources than the tree's now.
    That is judged by content (the source digest setup.py compiles into the module against the tree's), not by
    file times, which a rebase or checkout moves without changing a byte. From a copy of the tree (no git
    checkout) the digest and build time still tell builds apart."""
    import datetime
    import hashlib

    if package is None:
        import lmcache_adp._native as native

        so = Path(native.__file__).resolve()
    else:
        # The file the import would load there (one rule with tests/support/native_build.py's), not any
        # _native*.so: a module left for another interpreter, or a .so beside the ABI-tagged one, is not it.
        package = Path(package).resolve()
        so = native_module(package)
        if so is None:
            raise FileNotFoundError(f"no native module (lmcache_adp._native) in {package}")
    tree = so.parent.parent
    # scripts/sanitize.sh asan-python builds into <tree>/build/sanitize/<mode>/py/lmcache_adp: judged against
    # <tree>'s sources (it records their digest as setup.py does).
    sanitizer = None
    up = tree.parents
    if tree.name == "py" and len(up) > 3 and (up[2].name, up[1].name) == ("build", "sanitize"):
        sanitizer, tree = up[0].name, up[3]
    digests = _load_source_digest(so.parent)
    git = ["git", "-C", str(tree)]
    r = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip():
        native_src = ["status", "--porcelain", "-uno", "--", "src_cpp", "setup.py"]
        dirty = subprocess.run([*git, *native_src], capture_output=True, text=True).stdout
        commit = r.stdout.strip() + _uncommitted(dirty)
    else:
        commit = f"none ({tree} is not a git checkout)"
    built_from = digests.recorded_digest(so)
    stale = []
    if (tree / "src_cpp").is_dir():
        now = digests.source_digest(tree)
        if built_from is None:
            stale = ["the module records no source digest (built outside setup.py, or before it recorded one)"]
        elif built_from != now:
            stale = [f"src_cpp differs from the sources built (built {built_from[:12]}, tree now {now[:12]})"]
    return {
        "module": str(so),
        "commit": commit,
        "built": datetime.datetime.fromtimestamp(so.stat().st_mtime, datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "sha256": hashlib.sha256(so.read_bytes()).hexdigest()[:16],
        "sources": built_from[:12] if built_from else "unknown",
        "sanitizer": sanitizer,
        "stale": stale,
    }


def use_own_tree(root: Path) -> bool:
    """For a benchmark run as a script: when the tree `root` it lives in is built in place, its lmcache_adp is the
    one measured, by this process and by every child it starts (MP servers, gateways: root first on sys.path and on
    PYTHONPATH, ahead of an editable install that may point at another tree), as bench_l2.py and
    bench_connector.py do; else the installed one. Call before importing lmcache_adp, only from a script's
    __main__ (it changes sys.path and os.environ). Returns whether the tree's package is used."""
    if native_module(root / "lmcache_adp") is None:
        return False
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    return True


def native_module(package: Path) -> Path | None:
    """The file `import lmcache_adp._native` would load from the package directory `package` (its
    source_digest.native_module, the one rule), or None: whether a tree is built in place."""
    return _load_source_digest(Path(package)).native_module(Path(package))


def _load_source_digest(package: Path):
    """lmcache_adp/source_digest.py of the package measured, loaded by path (importing the package would
    import a native module, maybe another one than `package`'s); this tree's for a package older than it
    (bench_l2.py --extra-adp: a build of an older commit, whose module then records no digest)."""
    import importlib.util

    path = package / "source_digest.py"
    if not path.exists():
        path = Path(__file__).resolve().parent.parent / "lmcache_adp" / "source_digest.py"
    spec = importlib.util.spec_from_file_location("adp_source_digest", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def describe_build(b: dict) -> str:
    """native_build() in one line for a results file."""
    stale = f"; STALE: {', '.join(b['stale'])}" if b["stale"] else ""
    sanitizer = f" (sanitizer build: {b['sanitizer']})" if b.get("sanitizer") else ""
    return (
        f"native module {b['module']}{sanitizer}, commit {b['commit']}, built {b['built']}, sha256 {b['sha256']}, "
        f"sources {b['sources']}{stale}"
    )


class ProcessDied(RuntimeError):
    """A child process a benchmark depends on (the MP server, a gateway) exited while it was measured."""


def dead_process(watched: dict, grace_s: float = 0.0) -> str | None:
    """The first of fail_fast's watched processes that has exited (waiting up to grace_s for each, as a
    failure seen by a client can come just before its exit is), as ProcessDied's message; None if all live."""
    for name, (proc, tail) in watched.items():
        if proc is None:
            continue
        try:
            proc.wait(timeout=grace_s) if grace_s else proc.poll()
        except subprocess.TimeoutExpired:
            pass
        if proc.returncode is not None:
            return f"{name} exited with {proc.returncode} while it was measured:\n{tail()}"
    return None


@contextlib.contextmanager
def fail_fast(watched: dict, poll_s: float = 0.5):
    """Runs the block while watching processes: {name: (Popen, log_tail)}, log_tail() -> str. If one exits
    first, ProcessDied (its exit code and log tail) is raised in this thread at once (SIGUSR1 interrupts its
    sleeps and waits), instead of the block waiting out a client's timeout. Main thread only."""
    stop = threading.Event()
    dead: list[str] = []

    def watch() -> None:
        while not stop.wait(poll_s):
            message = dead_process(watched)
            if message is not None:
                dead.append(message)
                os.kill(os.getpid(), signal.SIGUSR1)
                return

    def raise_dead(signum, frame) -> None:
        if dead and not stop.is_set():
            raise ProcessDied(dead[0])

    previous = signal.signal(signal.SIGUSR1, raise_dead)
    watcher = threading.Thread(target=watch, name="fail-fast", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)


HUGETLB = Path("/sys/kernel/mm/hugepages/hugepages-2048kB")


@contextlib.contextmanager
def hugetlb_pool(pages: int, root: Path = HUGETLB):
    """Grows the 2 MiB hugetlb pool by `pages` for the run (one L1: bench_l2's rows and bench_restore's servers run one at a time) and gives
    them back after it, also on an error or Ctrl-C. SystemExit with the reason if the pool cannot be had (not
    root, or the kernel found too little free contiguous memory)."""
    total, free = root / "nr_hugepages", root / "free_hugepages"
    try:
        before = int(total.read_text())
        total.write_text(str(before + pages))
    except (OSError, ValueError) as e:
        raise SystemExit(f"--l1-hugetlb: cannot grow the 2 MiB hugetlb pool ({total}): {e}") from None
    try:
        got = int(free.read_text())
        if got < pages:
            raise SystemExit(
                f"--l1-hugetlb: the 2 MiB hugetlb pool has {got} free pages after asking for {pages} more "
                f"(one L1 needs {pages}): too little free contiguous memory; try again when the machine is quieter"
            )
        yield before + pages
    finally:
        total.write_text(str(before))
