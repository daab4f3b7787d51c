# SPDX-License-Identifier: Apache-2.0
"""Builds and runs the C++ test programs of tests/cpp against the sources they test.

A program links the .cc files of the given src_cpp/ directories (and any single
files), prints "<name>: PASS" and exits 0 when every check held.

Each source is compiled once for each set of flags, on as many compilers at once
as there are CPUs: the suite links the same store, util and gateway sources into
some thirty programs, half of them under a sanitizer. The plain objects are kept
in a directory of the session's in /tmp, removed at its end (a session killed
before its end leaves it behind; the next one removes it, named by the pid that
made it). The sanitized ones (ASan, TSan) are scripts/sanitize.sh's: the same
compile command as its asan and tsan modes (both read the flags from
scripts/sanitize_flags.py; asan-python links asan's) into
the same directory, build/sanitize/<mode>, judged up to date by
scripts/object_stamps.py (the command, the content of the source and of every
header it read) under sanitize.sh's lock; so the suite's sanitizer stress runs
(tests/sanitizers) and its sanitized test programs compile src_cpp once between
them, not twice (all of src_cpp with -g: about 100 MB under ASan, 65 MB under
TSan, kept between runs as sanitize.sh's are).

A program is linked once a session for its sources and flags: the tests that
run the same program (the crash harnesses, plain and sanitized) share the
binary, hard-linked into each test's own directory.

Every compiler, link and program runs in a process group of its own
(tests/support/process_group.py), killed whole when it times out or the test is
interrupted: none is left running beside the tests that follow.
"""

from __future__ import annotations

import atexit
import fcntl
import importlib.util
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.support import process_group

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src_cpp"


def _load_sanitize_flags():
    """scripts/sanitize_flags.py, loaded by its path (sys.path untouched): the sanitized builds' flags, which
    scripts/sanitize.sh reads too."""
    spec = importlib.util.spec_from_file_location("adp_sanitize_flags", ROOT / "scripts" / "sanitize_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_sanitize_flags = _load_sanitize_flags()
SANITIZERS = _sanitize_flags.SANITIZERS


def sanitize_flags(mode: str) -> list[str]:
    """scripts/sanitize.sh's compile flags for `mode` (asan or tsan): scripts/sanitize_flags.py's, which it reads, so
    that build() reuses its objects (a difference would cost a second compile of src_cpp, nothing else)."""
    return _sanitize_flags.flags(mode)


def sanitize_object_dir(mode: str) -> str:
    """Where sanitize.sh and build() put the objects of `mode`, relative to the tree."""
    return _sanitize_flags.object_dir(mode)


# This session's objects: (source, flags) -> object file. The sources do not change during a session.
_objects: dict[tuple[str, tuple[str, ...]], Path] = {}
_object_dir: Path | None = None
_object_numbers = itertools.count()  # each object file's name starts with its own number
_DIR_PREFIX = "adp-cpp-objects-"


def _remove_orphaned_object_dirs(tmp: Path) -> None:
    """Removes the object directories of sessions whose process is gone (killed before atexit ran)."""
    for d in tmp.glob(f"{_DIR_PREFIX}*-*"):
        pid = d.name[len(_DIR_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            pass  # another user's live process


def _session_dir() -> Path:
    global _object_dir
    if _object_dir is None:
        tmp = Path(tempfile.gettempdir())
        _remove_orphaned_object_dirs(tmp)
        _object_dir = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=tmp))
        atexit.register(shutil.rmtree, _object_dir, True)
    return _object_dir


def _compile_all(cxx: str, flags: list[str], sources: list[str]) -> list[Path]:
    """The objects of `sources` compiled with `flags`, compiling those this session has not yet."""
    _session_dir()
    key = tuple(flags)
    todo = {src: _object_dir / f"{next(_object_numbers)}-{Path(src).stem}.o"
            for src in dict.fromkeys(sources) if (src, key) not in _objects}  # fmt: skip

    def compile_one(src: str) -> tuple[str, Path, subprocess.CompletedProcess]:
        obj = todo[src]
        proc = process_group.run([cxx, *flags, "-c", src, "-o", str(obj)], timeout=600)
        return src, obj, proc

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        try:
            done = list(pool.map(compile_one, todo))
        except BaseException:  # interrupted: the compilers of the other threads too, not only waited for
            process_group.kill_all()
            raise
    for src, obj, proc in done:
        assert proc.returncode == 0, f"{src}:\n{proc.stderr[-5000:]}"
        _objects[(src, key)] = obj
    return [_objects[(src, key)] for src in sources]


def _compile_sanitized(cxx: str, mode: str, sources: list[str]) -> list[Path]:
    """The objects of `sources` (paths relative to the tree) under sanitizer `mode`, in build/sanitize/<mode>: those
    not up to date compiled by scripts/object_stamps.py, as sanitize.sh compiles them. The caller holds the lock."""
    proc = process_group.run(
        [sys.executable, "scripts/object_stamps.py", sanitize_object_dir(mode), cxx, *sanitize_flags(mode), "--",
         *sources],
        cwd=ROOT, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, f"the {mode} compile failed:\n{proc.stderr[-5000:]}"
    objects = [ROOT / line for line in proc.stdout.split()]
    assert len(objects) == len(sources), proc.stdout[-5000:] + proc.stderr[-5000:]
    return objects


# This session's programs: (compiler, flags, sources) -> the binary linked from them (in the session's directory).
_binaries: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Path] = {}


def _link(cxx: str, flags: list[str], objects: list[Path], binary: Path) -> None:
    tmp = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
    proc = process_group.run([cxx, *flags, *map(str, objects), "-o", str(tmp)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    os.replace(tmp, binary)


def build(
    name: str,
    out: Path,
    dirs: tuple[str, ...] = ("store", "util", "testing"),
    extra: tuple[str, ...] = (),
    sanitize: str | None = None,
) -> Path:
    """Compiles tests/cpp/<name>.cc with the sources of `dirs` and `extra` (paths under src_cpp/)
    into out/<name>, warnings as errors, under a sanitizer of SANITIZERS if given; returns the
    binary's path. A program already linked this session from the same sources and flags is not
    linked again: out/<name> is a hard link to it (a copy where the link is refused)."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} not found: this test needs a C++20 compiler (set CXX)"
    sources = sorted(f"src_cpp/{d}/{p.name}" for d in dirs for p in (SRC / d).glob("*.cc"))
    sources += [f"src_cpp/{f}" for f in extra] + [f"tests/cpp/{name}.cc"]
    if sanitize:
        flags = sanitize_flags(sanitize)
    else:
        flags = ["-std=c++20", "-O1", "-g", "-D_GLIBCXX_ASSERTIONS", "-Wall", "-Wextra", "-Werror"]
        flags += ["-Wno-missing-field-initializers", f"-I{SRC}", "-pthread"]
    key = (cxx, tuple(flags), tuple(sources))
    if key not in _binaries:
        linked = _session_dir() / f"{next(_object_numbers)}-{name}" / name
        linked.parent.mkdir()
        if sanitize:
            # sanitize.sh's lock over the compile and the link: no run of it rewrites an object this link reads.
            lock_path = ROOT / sanitize_object_dir(sanitize) / "build.lock"
            lock_path.parent.mkdir(parents=True, exist_ok=True)
            with open(lock_path, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                _link(cxx, flags, _compile_sanitized(cxx, sanitize, sources), linked)
        else:
            _link(cxx, flags, _compile_all(cxx, flags, [str(ROOT / src) for src in sources]), linked)
        _binaries[key] = linked
    binary = out / name
    binary.unlink(missing_ok=True)
    try:
        os.link(_binaries[key], binary)
    except OSError:
        shutil.copy2(_binaries[key], binary)
    return binary


def run(binary: Path, *args: str, timeout: float = 300, shown: int = 5000) -> str:
    """Runs a built test program (store logging at ERROR); asserts it passed (a sanitizer's report
    makes it exit non-zero), showing the last `shown` characters of its output if not; returns its
    output. Past `timeout`, subprocess.TimeoutExpired, the program and every process it started killed."""
    env = {**os.environ, "ADP_LOG_LEVEL": "ERROR"}
    proc = process_group.run([str(binary), *args], timeout=timeout, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and f"{binary.name}: PASS" in proc.stdout, output[-shown:]
    return output


SPLIT = 2  # processes a split crash program runs in: the CI VM's two cores


def shard_lines(output: str) -> list[tuple[str, int, int, int, int, str]]:
    """A crash program's shares ("crash harness: <list>: shard K/N ran R of S <what>"; a run without `shard=`
    prints 0/1, its whole selection) as (list, K, N, R, S, what), in the order printed."""
    return [
        (name, int(k), int(n), int(ran), int(selected), what)
        for name, k, n, ran, selected, what in re.findall(
            r"^crash harness: (.+): shard (\d+)/(\d+) ran (\d+) of (\d+) (.+)$", output, re.MULTILINE
        )
    ]


def check_sync_points(output: str, every: bool) -> None:
    """Asserts a crash program's lists (tests/cpp/crash_harness.h) fail the sync points its workloads have: each
    workload ("crash harness: <list> workload: W writes, S syncs ...": the syncs from the store's open, the points
    fail_sync_at counts) has a list of sync points ("<list>: shard K/N ran R of S' sync points"), chosen among as
    many as it has (crash_everywhere's "<list>: ... R of S sync points" where printed), and, if `every`, it selects
    all of them. Once the workload line counted the open's sync too (the fill test's 40 syncs against "of 39 sync
    points"), and card_crash_test's spanning workload had no sync points at all."""
    workloads = {
        name: int(syncs)
        for name, syncs in re.findall(r"^crash harness: (\S+) workload: \d+ writes, (\d+) syncs", output, re.MULTILINE)
    }
    assert workloads, "no workload lines printed:\n" + output[-3000:]
    selected = {name: chosen for name, _, _, _, chosen, what in shard_lines(output) if what == "sync points"}
    among = dict(re.findall(r"^crash harness: (\S+): \d+ of \d+ write points, \d+ of (\d+) sync points", output, re.M))
    assert selected.keys() == workloads.keys(), (workloads, selected)
    for name, syncs in workloads.items():
        assert int(among.get(name, syncs)) == syncs, (name, syncs, among)
        assert 0 < selected[name] <= syncs and (selected[name] == syncs or not every), (name, syncs, selected[name])


def run_split(binary: Path, *args: str, timeout: float = 300, shown: int = 5000) -> list[str]:
    """Runs a crash program (tests/cpp/crash_harness.h) as SPLIT processes at once, the K-th with the argument
    `shard=K/SPLIT`: between them they crash at every point of its selection, each point in one of them. Asserts
    every one passed (the failure message shows the last `shown` characters of each one's output) and that the
    shares each list printed ("crash harness: <list>: shard K/N ran R of S ...") add up to its selection, each
    list printed by every process with the same S. Returns their outputs, shard 0's first (it alone runs the
    programs' one-off scenarios)."""
    env = {**os.environ, "ADP_LOG_LEVEL": "ERROR"}
    with ThreadPoolExecutor(SPLIT) as pool:
        procs = list(
            pool.map(
                lambda k: process_group.run([str(binary), *args, f"shard={k}/{SPLIT}"], timeout=timeout, env=env),
                range(SPLIT),
            )
        )
    outputs = [p.stdout + p.stderr for p in procs]
    passed = [p.returncode == 0 and f"{binary.name}: PASS" in p.stdout for p in procs]
    report = "\n".join(
        f"--- {binary.name} shard={k}/{SPLIT} exited {p.returncode} ---\n{out[-shown:]}"
        for k, (p, out) in enumerate(zip(procs, outputs, strict=True))
    )
    assert all(passed), report
    shares: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for k, out in enumerate(outputs):
        for name, shard, count, ran, selected, what in shard_lines(out):
            assert (shard, count) == (k, SPLIT), report
            shares.setdefault((name, what), []).append((k, ran, selected))
    assert shares, f"no shard lines printed:\n{report}"
    for key, got in shares.items():
        # One line a process, the same selection in each; their shares add up to it.
        assert sorted(k for k, _, _ in got) == list(range(SPLIT)), (key, got)
        assert len({sel for _, _, sel in got}) == 1 and sum(ran for _, ran, _ in got) == got[0][2], (key, got)
    return outputs


def run_on_cards(binary: Path, tmp_path: Path, tmpfs_says: str = "", disk: bool = True, timeout: float = 300) -> None:
    """Runs a card program, whose one argument is its card image, on an image on tmpfs (/dev/shm: the store maps
    it), whose output must say `tmpfs_says` where given, then, if `disk`, on one in tmp_path (staged, unless tmp_path
    is tmpfs too). The tmpfs image is removed afterwards, whether the program removed it or not."""
    shm = Path("/dev/shm")
    assert shm.is_dir() and os.access(shm, os.W_OK), "this test needs a writable /dev/shm (tmpfs: the mapped card)"
    image = shm / f"adp-{binary.name}-{uuid.uuid4().hex}.img"
    try:
        out = run(binary, str(image), timeout=timeout)
    finally:
        image.unlink(missing_ok=True)
    assert tmpfs_says in out, out[-2000:]
    if disk:
        run(binary, str(tmp_path / "card.img"), timeout=timeout)
