# SPDX-License-Identifier: Apache-2.0
"""Build of lmcache-adp: the Python package plus the pybind11 core in src_cpp/."""

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup
from setuptools.errors import CompileError

ROOT = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src_cpp").rglob("*.cc"))

# The C++ sources' digest goes into the module (_native.SOURCE_DIGEST): benchmarks/tools.native_build()
# compares it with the tree's sources to tell a stale build by content. It is compiled into one generated
# translation unit (source_digest.digest_unit), not defined for every one, so an edit recompiles only the
# objects it touches. SNAPSHOT: each source's sha256 from the same read, what the objects are judged by.
digest_ns = {}
exec((ROOT / "lmcache_adp" / "source_digest.py").read_text(), digest_ns)
SOURCE_DIGEST, SNAPSHOT = digest_ns["source_snapshot"](ROOT)

# Warnings are always on; ADP_WERROR=1 (set by the test script and CI) makes
# them errors, so none lands, without breaking a user's build on a newer compiler.
WARNINGS = ["-Wall", "-Wextra", "-Wno-missing-field-initializers"]
if os.environ.get("ADP_WERROR") == "1":
    WARNINGS.append("-Werror")


def _dry_run(obj) -> bool:
    """--dry-run, where the setuptools has it (84 removed it from the compiler and the commands)."""
    return bool(getattr(obj, "dry_run", False))


def _sha256(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _dependencies(depfile: str) -> list[str]:
    """The files a -MD dependency file lists (its first rule's prerequisites), paths as the compiler wrote them."""
    text = Path(depfile).read_text().replace("\\\n", " ")
    rule = text.split("\n", 1)[0]
    words = rule.split(": ", 1)[1].replace("\\ ", "\0").split()
    return [w.replace("\0", " ") for w in words]


def incremental_compile(compiler, sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                        extra_preargs=None, extra_postargs=None, depends=None):  # fmt: skip
    """CCompiler.compile that reuses an object when what built it is unchanged: the same compile command
    (flags, defines, -Werror, include dirs; the compiler's --version) and the same content of its source and of
    every header the compiler read (-MD dependency file), by sha256. An object's record (<object>.stamp) is
    written only after the object is in place, and only when none of its src_cpp inputs differs from the
    snapshot the build records as SOURCE_DIGEST; so a stale object is never reused, nor one compiled from an
    edit saved during the build. Objects compile in parallel (ADP_BUILD_JOBS, 0 or unset: one per core)."""
    macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs
    )
    cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
    version = subprocess.run([compiler.compiler_so[0], "--version"], capture_output=True, text=True).stdout
    command = json.dumps([compiler.compiler_so, cc_args, extra_postargs, version])
    hashes = {}  # path -> sha256, each file read once per build (src_cpp's: the snapshot's)

    def content(path):
        rel = os.path.relpath(path, ROOT)
        if rel in SNAPSHOT:
            return SNAPSHOT[rel]
        if path not in hashes:
            hashes[path] = _sha256(path)
        return hashes[path]

    def as_built(path, sha):
        """Whether the content `path` had when compiled (`sha`) is the snapshot's (for a file outside src_cpp:
        no snapshot, taken as such)."""
        rel = os.path.relpath(path, ROOT)
        return SNAPSHOT[rel] == sha if rel in SNAPSHOT else not rel.startswith("src_cpp" + os.sep)

    def up_to_date(obj):
        try:
            stamp = json.loads(Path(obj + ".stamp").read_text())
        except (OSError, ValueError):
            return False
        if compiler.force or not os.path.exists(obj) or stamp.get("command") != command:
            return False
        return all(content(path) == sha for path, sha in stamp["deps"].items())

    todo = [obj for obj in objects if obj in build and not up_to_date(obj)]
    print(
        f"lmcache_adp._native: compiling {len(todo)} of {len(objects)} objects ({len(objects) - len(todo)} up to date)"
    )

    def compile_one(obj):
        src, ext = build[obj]
        if _dry_run(compiler):
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)  # logs the command only
            return
        Path(obj + ".stamp").unlink(missing_ok=True)
        tmp = f"{obj}.{os.getpid()}.tmp"
        try:
            compiler._compile(tmp, src, ext, cc_args + ["-MD", "-MF", tmp + ".d"], extra_postargs, pp_opts)
            deps = {os.path.normpath(d): _sha256(d) for d in _dependencies(tmp + ".d")}
            os.replace(tmp, obj)
        finally:
            Path(tmp).unlink(missing_ok=True)
            Path(tmp + ".d").unlink(missing_ok=True)
        # An input edited while it compiled (its content now not the snapshot's): no record, so the next build
        # compiles it again; this build's module records the snapshot's digest, which the tree no longer has.
        if all(as_built(d, sha) for d, sha in deps.items()):
            Path(obj + ".stamp.tmp").write_text(json.dumps({"command": command, "deps": deps}))
            os.replace(obj + ".stamp.tmp", obj + ".stamp")

    jobs = int(os.environ.get("ADP_BUILD_JOBS", "0")) or os.cpu_count() or 1
    with ThreadPoolExecutor(max(1, min(jobs, len(todo)))) as pool:
        list(pool.map(compile_one, todo))
    if not _dry_run(compiler) and digest_ns["source_snapshot"](ROOT)[0] != SOURCE_DIGEST:
        raise CompileError("src_cpp changed during the build: run it again")
    return objects


class BuildExt(build_ext):
    """build_ext whose compile step reuses unchanged objects (incremental_compile) and whose link records the
    sources' digest through one generated translation unit (source_digest.digest_unit, under build_temp).

    distutils skips a module newer than its sources by file times; here the module is never skipped by times
    (an edit saved while a build compiled is older than that build's module, and a checkout can leave files
    older than it): every build judges each object by content, relinks when an object was compiled, and
    relinks a module that records other sources than the tree's."""

    def build_extension(self, ext):
        if getattr(self, "editable_mode", False):
            # pip install -e: setuptools builds in a new temporary directory each time; the tree's build/
            # keeps the objects, as for build_ext --inplace (they are judged by content and command).
            self.build_temp = str(ROOT / "build" / f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")
        self.compiler.compile = incremental_compile.__get__(self.compiler)
        Path(self.build_temp).mkdir(parents=True, exist_ok=True)
        unit = Path(self.build_temp) / "adp_source_digest.cc"
        text = digest_ns["digest_unit"](SOURCE_DIGEST)
        if not _dry_run(self) and (not unit.exists() or unit.read_text() != text):
            unit.write_text(text)
        if str(unit) not in ext.sources:
            ext.sources.append(str(unit))
        built = Path(self.get_ext_fullpath(ext.name))
        if built.exists() and digest_ns["recorded_digest"](built) != SOURCE_DIGEST and not _dry_run(self):
            built.unlink()  # the link below then runs whatever the objects' times
        # One build at a time per build directory: two at once would mix their objects and records.
        with open(Path(self.build_temp) / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            force, self.force = self.force, True  # past distutils' skip by times; the compiler keeps --force
            try:
                super().build_extension(ext)
            finally:
                self.force = force

    def copy_extensions_to_source(self):
        """--inplace: the package's module is replaced when it differs from the one built, whatever the two
        files' times (distutils copies only a newer file: a module copied in later, e.g. main's, stayed), and
        by a new file, not rewritten in place under a process that has it mapped; left alone when the same.
        The new file is copied beside it under a temporary name and renamed over it (os.replace, atomic): a
        process importing the package meanwhile finds the old module or the new one, never none or half of
        one (review r13 N3: an unlink, then a copy, left it without _native in between)."""
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace, regular = (Path(p) for p in self._get_inplace_equivalent(build_py, ext))
            if inplace.exists() and regular.exists() and inplace.read_bytes() == regular.read_bytes():
                continue
            if _dry_run(self):
                self.copy_file(str(regular), str(inplace), level=self.verbose)  # logs the copy only
                continue
            tmp = inplace.with_name(f"{inplace.name}.{os.getpid()}.tmp")
            try:
                shutil.copy2(regular, tmp)
                os.replace(tmp, inplace)
            finally:
                tmp.unlink(missing_ok=True)


ext = Pybind11Extension(
    "lmcache_adp._native",
    SOURCES,
    include_dirs=["src_cpp"],
    cxx_std=20,
    extra_compile_args=["-O2", *WARNINGS],
    extra_link_args=["-pthread"],
)

version = {}
exec((ROOT / "lmcache_adp" / "_version.py").read_text(), version)

setup(
    name="lmcache-adp",
    version=version["__version__"],
    description="ADP storage card as the L2 tier of the LMCache multiprocess server",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["lmcache_adp", "lmcache_adp.*"]),
    package_data={"lmcache_adp": ["_native.pyi"]},  # the binding's type stubs
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
    install_requires=["numpy", "prometheus_client", "tqdm"],
    extras_require={
        "lmcache": ["lmcache>=0.5.4,<0.6"],
        "test": [
            "pytest>=8",
            "pytest-benchmark",
            "numpy",
            "google-crc32c",
            # the style gate (scripts/check_style.sh), pinned so every machine formats alike
            "ruff==0.17.6",
            "clang-format==23.1.5",
            # scripts/sanitize.sh asan-python compiles bindings.cc outside setup.py's build env
            "pybind11>=2.12",
        ],
    },
    entry_points={"console_scripts": ["lmcache-adp=lmcache_adp.cli:main"]},
    zip_safe=False,
)
