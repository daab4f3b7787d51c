# SPDX-License-Identifier: Apache-2.0
"""setup.py's build_ext compiles only what changed and never links a stale object: each object is judged by the
compile command that built it and the content of its source and of every header it read (its .stamp), not by
file times; the sources' digest is compiled into one generated translation unit, so an edit recompiles its own
objects and that one; the module records the digest of what it was linked from.

Driven in a copy of setup.py over a tiny src_cpp made here (three translation units, a plain C-API module for
bindings.cc): the real sources take minutes to build. A compiler wrapper (CC, CXX) logs every compile and link.
About 40-90 s on the 2-core development machine at load 8-12 (sixteen builds of 2-5 s each): marked slow."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from lmcache_adp.source_digest import MARKER, recorded_digest, source_digest

ROOT = Path(__file__).resolve().parents[2]
SO_NAME = "_native" + sysconfig.get_config_var("EXT_SUFFIX")

pytestmark = pytest.mark.slow

SOURCES = {
    "src_cpp/util/a.h": "#pragma once\nint a_value();\n",
    "src_cpp/util/a.cc": '#include "util/a.h"\nint a_value() { return 1; }\n',
    "src_cpp/util/b.cc": "int b_value() { return 2; }\n",
    # The record the real bindings.cc exposes, defined by the generated unit (source_digest.digest_unit).
    "src_cpp/python/bindings.cc": (
        "#include <Python.h>\n"
        '#include "util/a.h"\n'
        "namespace adp {\nextern const char kSourceDigestRecord[];\n}\n"
        'static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_native", nullptr, -1, nullptr};\n'
        "PyMODINIT_FUNC PyInit__native() {\n  PyObject* m = PyModule_Create(&def);\n"
        '  PyModule_AddStringConstant(m, "SOURCE_DIGEST", adp::kSourceDigestRecord + 18);\n'
        '  PyModule_AddIntConstant(m, "A", a_value());\n  return m;\n}\n'
    ),
}

# Logs each compile (its source) and link, then runs g++; after compiling the source named in $EDIT_AFTER (once,
# while $EDIT_AFTER.flag exists) it appends a line to it: an edit saved just after the compiler read the file.
WRAPPER = """#!/bin/sh
for a in "$@"; do
  case "$a" in
    -shared) echo link >> "$LOG" ;;
    *.cc) src=$a; echo "compile $a" >> "$LOG" ;;
  esac
done
g++ "$@" || exit $?
if [ -n "$EDIT_AFTER" ] && [ "$src" = "$EDIT_AFTER" ] && [ -e "$EDIT_AFTER.flag" ]; then
  rm "$EDIT_AFTER.flag"; echo "// saved during the build" >> "$src"
fi
"""


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "tree"
    (t / "lmcache_adp").mkdir(parents=True)
    (t / "scripts").mkdir()
    for name in (
        "setup.py",
        "README.md",
        "scripts/object_stamps.py",
        *(f"lmcache_adp/{m}.py" for m in ("source_digest", "_version")),
    ):
        shutil.copy(ROOT / name, t / name)
    (t / "lmcache_adp" / "__init__.py").write_text("")
    for name, text in SOURCES.items():
        (t / name).parent.mkdir(parents=True, exist_ok=True)
        (t / name).write_text(text)
    (tmp_path / "cc").write_text(WRAPPER)
    (tmp_path / "cc").chmod(0o755)
    return t


class Built:
    def __init__(self, tree: Path, result: subprocess.CompletedProcess):
        log = tree.parent / "log"
        lines = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        self.output = result.stdout + result.stderr
        self.returncode = result.returncode
        self.compiled = sorted(line.split()[1] for line in lines if line.startswith("compile "))
        self.links = lines.count("link")
        self.module = tree / "lmcache_adp" / SO_NAME


# Runs setup.py (argv[1:]) with an audit hook that writes to $WATCH_LOG each file operation of the build
# (open, rename, replace, remove) at which the package's module ($WATCH_MODULE) is missing, and each open of it
# for writing: an import of the package at that moment would find no _native, or half of one.
WATCH = """
import os, runpy, sys
module, log = os.path.abspath(os.environ["WATCH_MODULE"]), open(os.environ["WATCH_LOG"], "a", buffering=1)
EVENTS = ("open", "os.rename", "os.replace", "os.remove")
WRITE = os.O_WRONLY | os.O_RDWR | os.O_TRUNC

def hook(event, args):
    if event not in EVENTS or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.path.abspath(os.fsdecode(args[0]))
    if not os.path.exists(module):
        log.write(f"missing at {event} {path}\\n")
    elif event == "open" and path == module and (any(c in (args[1] or "") for c in "wax+") or args[2] & WRITE):
        log.write(f"written in place: {event} {path}\\n")

sys.addaudithook(hook)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def build(
    tree: Path, werror: bool = True, edit_after: str = "", watch: str = "", env_set: dict[str, str] | None = None
) -> Built:
    """setup.py build_ext --inplace in `tree`; with `watch` (a log file), under WATCH; `env_set` on top."""
    drop = ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDSHARED", "ADP_WERROR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    wrapper = str(tree.parent / "cc")
    env.update(CC=wrapper, CXX=wrapper, LOG=str(tree.parent / "log"), EDIT_AFTER=edit_after, ADP_BUILD_JOBS="2")
    env.update(WATCH_MODULE=str(tree / "lmcache_adp" / SO_NAME), WATCH_LOG=watch)
    if werror:
        env["ADP_WERROR"] = "1"
    env.update(env_set or {})
    r = subprocess.run(
        [sys.executable, *(["-c", WATCH] if watch else []), "setup.py", "-q", "build_ext", "--inplace"],
        cwd=tree, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    b = Built(tree, r)
    if edit_after == "":
        assert r.returncode == 0, b.output[-3000:]
        assert recorded_digest(b.module) == source_digest(tree), "the module records other sources than the tree's"
    return b


UNIT = "build/temp"  # the generated translation unit's path starts so (build_temp/adp_source_digest.cc)


def units(b: Built) -> list[str]:
    """The compiled sources, the generated digest unit as 'digest'."""
    return sorted("digest" if s.startswith(UNIT) and s.endswith("adp_source_digest.cc") else s for s in b.compiled)


ALL = ["digest", "src_cpp/python/bindings.cc", "src_cpp/util/a.cc", "src_cpp/util/b.cc"]


def test_an_edit_recompiles_the_objects_it_touches_and_the_digest_unit(tree):
    b = build(tree)
    assert units(b) == ALL and b.links == 1, b.output
    module = b.module.read_bytes()

    b = build(tree)  # nothing changed: nothing compiled, nothing linked, the package's module left as it was
    assert units(b) == [] and b.links == 0, b.output
    assert "compiling 0 of 4 objects (4 up to date)" in b.output, b.output
    assert b.module.read_bytes() == module

    (tree / "src_cpp/util/b.cc").write_text("int b_value() { return 3; }\n")  # one .cc: its object
    b = build(tree)
    assert units(b) == ["digest", "src_cpp/util/b.cc"] and b.links == 1, b.output

    (tree / "src_cpp/util/a.h").write_text("#pragma once\nint a_value();\nint a_twice();\n")  # a header: its includers
    b = build(tree)
    assert units(b) == ["digest", "src_cpp/python/bindings.cc", "src_cpp/util/a.cc"] and b.links == 1, b.output


def test_objects_are_judged_by_content_not_file_times(tree):
    build(tree)
    a = tree / "src_cpp/util/a.cc"
    os.utime(a, (4_000_000_000, 4_000_000_000))  # touched (2096), same bytes: nothing to compile
    b = build(tree)
    assert units(b) == [] and b.links == 0, b.output

    a.write_text('#include "util/a.h"\nint a_value() { return 7; }\n')
    os.utime(a, (1_000_000_000, 1_000_000_000))  # other bytes, older than every object (2001): compiled
    b = build(tree)
    assert units(b) == ["digest", "src_cpp/util/a.cc"] and b.links == 1, b.output


def test_a_change_of_flags_recompiles_everything(tree):
    build(tree)
    b = build(tree, werror=False)  # ADP_WERROR toggled
    assert units(b) == ALL and b.links == 1, b.output
    b = build(tree, werror=True)
    assert units(b) == ALL and b.links == 1, b.output


def built_value(tree: Path) -> int:
    """_native.A of the tree's package module, imported in a new interpreter."""
    code = "import lmcache_adp._native as n; print(n.A)"
    return int(
        subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True).stdout
    )


def test_objects_of_another_cxx_or_cxxflags_are_not_reused(tree):
    """distutils compiles a .cc with CXX and CXXFLAGS where it has them (setuptools 80: compiler_so_cxx), CC and
    CFLAGS in older ones: the object's record holds the command that compiled it, so a change of CXX or
    CXXFLAGS is a change of command. Judged by what the module computes: the same as a build from nothing."""
    (tree / "src_cpp/util/a.cc").write_text(
        '#include "util/a.h"\n#ifndef ADP_V\n#define ADP_V 1\n#endif\nint a_value() { return ADP_V; }\n'
    )
    (tree.parent / "cxx2").write_text(WRAPPER.replace('g++ "$@"', 'g++ -DADP_V=3 "$@"'))
    (tree.parent / "cxx2").chmod(0o755)
    for env in ({}, {"CXXFLAGS": "-DADP_V=2"}, {"CXX": str(tree.parent / "cxx2")}, {}):
        build(tree, env_set=env)
        incremental = built_value(tree)
        shutil.rmtree(tree / "build")
        build(tree, env_set=env)
        assert incremental == built_value(tree), f"{env}: an object of another command was reused"


def test_a_compiler_behind_a_launcher_is_judged_by_its_own_version(tree):
    """Review r14a N3: with CC/CXX "ccache <compiler>" the record holds the compiler's --version, not the
    launcher's, so a compiler upgraded in place (the same path, another version) recompiles everything."""
    launcher = tree.parent / "ccache"
    launcher.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "ccache version 4.8"; exit 0; }\nexec "$@"\n')
    cxx = tree.parent / "cxxv"  # the logging wrapper, whose --version is $VERSION_FILE
    cxx.write_text(
        WRAPPER.replace("#!/bin/sh\n", '#!/bin/sh\n[ "$1" = --version ] && { cat "$VERSION_FILE"; exit 0; }\n')
    )
    for f in (launcher, cxx):
        f.chmod(0o755)
    version = tree.parent / "version"
    version.write_text("g++ (Debian 12.2.0-14) 12.2.0\n")
    env = {"CC": f"{launcher} {cxx}", "CXX": f"{launcher} {cxx}", "VERSION_FILE": str(version)}
    b = build(tree, env_set=env)
    assert units(b) == ALL, b.output
    b = build(tree, env_set=env)
    assert units(b) == [], b.output
    version.write_text("g++ (Debian 13.1.0-1) 13.1.0\n")  # upgraded in place
    b = build(tree, env_set=env)
    assert units(b) == ALL, b.output


def test_a_module_of_other_sources_is_relinked_and_replaced_in_place_though_newer(tree):
    """A module recording other sources than the tree's is relinked though newer than every object (an edit
    saved while a build compiled is older than that build's module); the package's module is replaced when it
    is not the one built, whatever its time (a module copied in from another tree)."""
    build(tree)
    future = 4_000_000_000
    (regular,) = (tree / "build").glob(f"lib*/lmcache_adp/{SO_NAME}")  # the module build_ext links
    regular.write_bytes(b"\x7fELF..." + MARKER + b"0" * 64 + b"\0...")
    os.utime(regular, (future, future))
    b = build(tree)
    assert units(b) == [] and b.links == 1, b.output

    b.module.write_bytes(b"\x7fELF... copied from another tree")
    os.utime(b.module, (future, future))
    b = build(tree)
    assert units(b) == [] and b.links == 0, b.output  # (build() checks the digest the package's module records)


def test_the_package_never_lacks_its_module_while_a_build_replaces_it(tree):
    """Review r13 N3: the package's module is replaced by a rename of a copy made beside it, so a process
    importing the package during an in-place build finds the old module or the new one: at every file operation
    of a build that relinks (an edit) or only copies (the package's module not the one built), the module is
    there and is never opened for writing; no temporary file is left; the new module is in place."""
    watch = tree.parent / "watch"
    build(tree)
    (tree / "src_cpp/util/b.cc").write_text("int b_value() { return 3; }\n")
    b = build(tree, watch=str(watch))
    assert units(b) == ["digest", "src_cpp/util/b.cc"] and b.links == 1, b.output
    b.module.write_bytes(b"\x7fELF... copied from another tree")
    b = build(tree, watch=str(watch))
    assert units(b) == [] and b.links == 0, b.output  # (build() checks the digest the package's module records)
    assert watch.read_text() == "", watch.read_text()[:3000]
    assert not list(b.module.parent.glob("*.tmp")), list(b.module.parent.iterdir())


def lock_waiters(lock: Path) -> int:
    """Processes blocked in flock() on `lock` (/proc/locks' "->" lines for its inode)."""
    ino = f":{lock.stat().st_ino} "
    return sum(1 for line in Path("/proc/locks").read_text().splitlines() if "->" in line and ino in line)


def test_a_build_touches_the_digest_unit_and_the_module_only_under_the_lock(tree):
    """Review r14a N2: a build of other sources that finds another build holding the build directory's lock
    waits for it before it rewrites the generated digest unit or removes the module it would relink: it did both
    before taking the lock, under the other build's compiler and linker. Then it builds as usual."""
    build(tree)
    (unit,) = (tree / "build").glob("temp*/adp_source_digest.cc")
    (regular,) = (tree / "build").glob(f"lib*/lmcache_adp/{SO_NAME}")
    before = unit.read_text()
    (tree / "src_cpp/util/b.cc").write_text("int b_value() { return 3; }\n")  # other sources: another digest
    built = []
    with open(unit.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build's, for the test
        waiter = threading.Thread(target=lambda: built.append(build(tree)))
        waiter.start()
        deadline = time.monotonic() + 120
        while lock_waiters(unit.parent / "build.lock") == 0:
            assert waiter.is_alive() and time.monotonic() < deadline, "the build never waited for the lock"
            time.sleep(0.05)
        assert unit.read_text() == before, "the digest unit was rewritten before the lock was taken"
        assert regular.exists(), "the module was removed before the lock was taken"
    waiter.join(300)
    assert units(built[0]) == ["digest", "src_cpp/util/b.cc"] and built[0].links == 1, built[0].output


def test_an_edit_saved_during_the_build_is_compiled_by_the_next(tree):
    """a.cc is edited just after the compiler read it: the build fails rather than record sources it did not
    compile, keeps no record for a.o, and the next build compiles a.cc again."""
    build(tree)
    (tree / "src_cpp/util/a.cc").write_text('#include "util/a.h"\nint a_value() { return 5; }\n')
    (tree / "src_cpp/util/a.cc.flag").write_text("")
    b = build(tree, edit_after="src_cpp/util/a.cc")
    assert b.returncode != 0 and "src_cpp changed during the build: run it again" in b.output, b.output
    assert "src_cpp/util/a.cc" in units(b)
    b = build(tree)
    assert units(b) == ["digest", "src_cpp/util/a.cc"] and b.links == 1, b.output


def sanitize_build(tree: Path, *flags: str) -> list[str]:
    """scripts/object_stamps.py as scripts/sanitize.sh runs it (its own build directory, its own flags) on
    a.cc and b.cc: the sources it compiled (after checking that it prints their objects)."""
    out, sources = "build/sanitize/x", ["src_cpp/util/a.cc", "src_cpp/util/b.cc"]
    env = dict(os.environ, LOG=str(tree.parent / "log"), EDIT_AFTER="", ADP_BUILD_JOBS="2")
    r = subprocess.run(
        [sys.executable, "scripts/object_stamps.py", out, str(tree.parent / "cc"), "-Isrc_cpp", *flags,
         "--", *sources],
        cwd=tree, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == [f"{out}/src_cpp_util_a.o", f"{out}/src_cpp_util_b.o"], r.stdout
    return Built(tree, r).compiled


def test_the_sanitizer_build_reuses_its_objects_by_the_same_rules(tree):
    """scripts/sanitize.sh's objects (scripts/object_stamps.py, which setup.py's build shares): a second
    build with nothing changed compiles nothing; a header edit compiles its includer; other flags compile all."""
    assert sanitize_build(tree) == ["src_cpp/util/a.cc", "src_cpp/util/b.cc"]
    assert sanitize_build(tree) == []
    (tree / "src_cpp/util/a.h").write_text("#pragma once\nint a_value();\nint a_twice();\n")
    assert sanitize_build(tree) == ["src_cpp/util/a.cc"]
    assert sanitize_build(tree, "-DSANITIZED") == ["src_cpp/util/a.cc", "src_cpp/util/b.cc"]
    assert sanitize_build(tree, "-DSANITIZED") == []


BAD_JOBS = "ADP_BUILD_JOBS must be a whole number of compilers at once (0: one per core), got {!r}"


@pytest.mark.parametrize("jobs", ["x", "-1", "2.5"])
def test_a_bad_build_jobs_value_is_one_clear_error(tree, jobs):
    """ADP_BUILD_JOBS=x gave a bare ValueError traceback from setup.py (review r14); now one line naming the
    variable, before anything compiles, from setup.py's build and from sanitize.sh's (scripts/object_stamps.py)."""
    wrapper = str(tree.parent / "cc")
    env = dict(os.environ, CC=wrapper, CXX=wrapper, LOG=str(tree.parent / "log"), EDIT_AFTER="", ADP_BUILD_JOBS=jobs)
    for argv, code in (
        (["setup.py", "-q", "build_ext", "--inplace"], 1),
        (["scripts/object_stamps.py", "build/x", wrapper, "-Isrc_cpp", "--", "src_cpp/util/a.cc"], 2),
    ):
        r = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1] == "error: " + BAD_JOBS.format(jobs), r.stderr
        assert not (tree.parent / "log").exists(), "it compiled"


def test_the_runtime_package_holds_no_build_helper(tmp_path):
    """object_stamps.py (setup.py's and sanitize.sh's object records) shipped in the lmcache_adp package, though
    nothing imports it at run time (review r14): it lives in scripts/ now. The package's files as a wheel holds
    them (setup.py build_py): not it."""
    r = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    shipped = {p.name for p in (tmp_path / "lmcache_adp").glob("*.py")}
    assert "cli.py" in shipped and "source_digest.py" in shipped, shipped  # source_digest: read by a build's checks
    assert "object_stamps.py" not in shipped, shipped
