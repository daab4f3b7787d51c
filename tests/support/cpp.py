# SPDX-License-Identifier: Apache-2.0
"""Builds and runs the C++ test programs of tests/cpp against the sources they test.

A program links the .cc files of the given src_cpp/ directories (and any single
files), prints "<name>: PASS" and exits 0 when every check held.

Each source is compiled once a test session for each set of flags (the objects
kept in a directory of the session's, removed at its end), on as many compilers
at once as there are CPUs: the suite links the same store, util and gateway
sources into some thirty programs, half of them under a sanitizer. The objects
sit in /tmp for the session, one set for each of the plain, ASan and TSan
flags: all of src_cpp with -g takes about 100 MB under ASan and 65 MB under
TSan (scripts/sanitize.sh's objects, the same flags), so a whole run some
200 MB. A session killed before its end leaves its directory behind; the
next one removes it (named by the pid that made it).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import subprocess
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src_cpp"


SANITIZERS = {
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"],
    "tsan": ["-fsanitize=thread"],
}


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


def _compile_all(cxx: str, flags: list[str], sources: list[str]) -> list[Path]:
    """The objects of `sources` compiled with `flags`, compiling those this session has not yet."""
    global _object_dir
    if _object_dir is None:
        tmp = Path(tempfile.gettempdir())
        _remove_orphaned_object_dirs(tmp)
        _object_dir = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=tmp))
        atexit.register(shutil.rmtree, _object_dir, True)
    key = tuple(flags)
    todo = {src: _object_dir / f"{next(_object_numbers)}-{Path(src).stem}.o"
            for src in dict.fromkeys(sources) if (src, key) not in _objects}  # fmt: skip

    def compile_one(src: str) -> tuple[str, Path, subprocess.CompletedProcess]:
        obj = todo[src]
        proc = subprocess.run([cxx, *flags, "-c", src, "-o", str(obj)], capture_output=True, text=True, timeout=600)
        return src, obj, proc

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        done = list(pool.map(compile_one, todo))
    for src, obj, proc in done:
        assert proc.returncode == 0, f"{src}:\n{proc.stderr[-5000:]}"
        _objects[(src, key)] = obj
    return [_objects[(src, key)] for src in sources]


def build(
    name: str,
    out: Path,
    dirs: tuple[str, ...] = ("store", "util", "testing"),
    extra: tuple[str, ...] = (),
    sanitize: str | None = None,
) -> Path:
    """Compiles tests/cpp/<name>.cc with the sources of `dirs` and `extra` (paths under src_cpp/)
    into out/<name>, warnings as errors, under a sanitizer of SANITIZERS if given; returns the
    binary's path."""
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} not found: this test needs a C++20 compiler (set CXX)"
    sources = sorted(str(p) for d in dirs for p in (SRC / d).glob("*.cc"))
    sources += [str(SRC / f) for f in extra] + [str(ROOT / "tests" / "cpp" / f"{name}.cc")]
    binary = out / name
    flags = ["-std=c++20", "-O1", "-g", "-D_GLIBCXX_ASSERTIONS", "-Wall", "-Wextra", "-Werror"]
    flags += SANITIZERS[sanitize] if sanitize else []
    flags += ["-Wno-missing-field-initializers", f"-I{SRC}", "-pthread"]
    objects = _compile_all(cxx, flags, sources)
    proc = subprocess.run(
        [cxx, *flags, *map(str, objects), "-o", str(binary)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    return binary


def run(binary: Path, *args: str, timeout: float = 300, shown: int = 5000) -> str:
    """Runs a built test program (store logging at ERROR); asserts it passed (a sanitizer's report
    makes it exit non-zero), showing the last `shown` characters of its output if not; returns its
    output."""
    env = {**os.environ, "ADP_LOG_LEVEL": "ERROR"}
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout, env=env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and f"{binary.name}: PASS" in proc.stdout, output[-shown:]
    return output


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
