# SPDX-License-Identifier: Apache-2.0
"""Build of lmcache-adp: the Python package plus the pybind11 core in src_cpp/."""

import fcntl
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup
from setuptools.errors import CompileError, OptionError

ROOT = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "src_cpp").rglob("*.cc"))

# The C++ sources' digest goes into the module (_native.SOURCE_DIGEST): benchmarks/tools.native_build()
# compares it with the tree's sources to tell a stale build by content. It is compiled into one generated
# translation unit (source_digest.digest_unit), not defined for every one, so an edit recompiles only the
# objects it touches. SNAPSHOT: each source's sha256 from the same read, what the objects are judged by.
digest_ns = {}
exec((ROOT / "lmcache_adp" / "source_digest.py").read_text(), digest_ns)
SOURCE_DIGEST, SNAPSHOT = digest_ns["source_snapshot"](ROOT)
# Which objects are up to date (by content and command), shared with scripts/sanitize.sh.
stamps_ns = {"__name__": "object_stamps"}
exec((ROOT / "scripts" / "object_stamps.py").read_text(), stamps_ns)

# Warnings are always on; ADP_WERROR=1 (set by the test script and CI) makes
# them errors, so none lands, without breaking a user's build on a newer compiler.
WARNINGS = ["-Wall", "-Wextra", "-Wno-missing-field-initializers"]
if os.environ.get("ADP_WERROR") == "1":
    WARNINGS.append("-Werror")

# Flags of one source beside the common ones. crc32c.cc: every loop head at a 64-byte boundary. The copy+CRC
# loop (pclmul_raw<true>) of a load otherwise lands wherever the code before it in the module ends: load36 saw
# tmpfs loads move 0.79-0.88x between two builds differing only in unrelated code, the loop 64-byte aligned in
# one and 32 off in the other (a loop whose head straddles a 32/64-byte fetch or uop-cache line decodes more
# lines an iteration). A per-function aligned attribute aligns the function, not the loops in it, and an asm
# .p2align in the body lands where the compiler puts the asm, not necessarily at the loop head it lays out; the
# compiler's own -falign-loops pads at the head it chose, GCC's and clang's (13 on) alike, and makes the
# object's .text 64-aligned, so the linker keeps the boundary in the module. Checked on the built module by
# tests/util/test_crc32c.py (test_crc_loops_are_64_byte_aligned). A flag the compiler does not accept (clang
# before 13 does not know -falign-loops: with ADP_WERROR=1 the build failed) is left out, logged: each probed once a
# build with the build's other arguments (scripts/object_stamps.py, accepted_flags; tests/packaging/test_setup_flags.py);
# a probe that times out or cannot run leaves the flag out too, its line saying so.
SOURCE_FLAGS = {"src_cpp/util/crc32c.cc": ["-falign-loops=64"]}


def _dry_run(obj) -> bool:
    """--dry-run, where the setuptools has it (84 removed it from the compiler and the commands)."""
    return bool(getattr(obj, "dry_run", False))


def incremental_compile(compiler, sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                        extra_preargs=None, extra_postargs=None, depends=None):  # fmt: skip
    """CCompiler.compile that reuses an object when what built it is unchanged (scripts/object_stamps.py): the
    same compile command (CC and CXX with their flags, defines, -Werror, include dirs; the compilers' --version)
    and the same content of its source and of every header the compiler read, by sha256, judged against the
    snapshot the build records as SOURCE_DIGEST. Objects compile in parallel (ADP_BUILD_JOBS, 0 or unset: one
    per core)."""
    macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs
    )
    cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
    # The command a .cc compiles with: distutils with C++ support (setuptools 80 here) spawns compiler_so_cxx
    # (CXX, CXXFLAGS), older ones compiler_so (CC, CFLAGS); both recorded, and each compiler's --version (past a
    # launcher: "ccache g++" is g++'s).
    cxx = getattr(compiler, "compiler_so_cxx", None)
    compilers = dict.fromkeys(stamps_ns["compiler_of"](c) for c in (compiler.compiler_so, cxx) if c)
    versions = [stamps_ns["compiler_version"](exe) for exe in compilers]
    command = json.dumps([compiler.compiler_so, cxx, cc_args, extra_postargs, versions])

    # A source's own flags that this compiler accepts beside the build's other arguments (defines, include dirs,
    # -std=c++20 and the extra compile args: a flag is judged as it will be compiled): each probed once a build
    # (scripts/object_stamps.py, accepted_flags; clang before 13 rejects -falign-loops=64); one rejected, or whose
    # probe timed out or could not run, left out with a line saying which.
    accepted = {}
    probe_args = [a for a in cc_args if a != "-c"] + list(extra_postargs)

    def own_flags(obj):
        source = os.path.relpath(build[obj][0], ROOT)
        if source not in accepted:
            accepted[source] = stamps_ns["accepted_flags"](
                cxx or compiler.compiler_so, SOURCE_FLAGS.get(source, []), args=probe_args
            )
        return accepted[source]

    # A source with flags of its own (SOURCE_FLAGS) is judged by a command with them: an object built without them
    # (or with others) compiles again, the rest keep the common command (and their objects).
    stamps_by_flags = {}

    def stamps_of(obj):
        flags = tuple(own_flags(obj))
        if flags not in stamps_by_flags:
            text = json.dumps([*json.loads(command), list(flags)]) if flags else command
            stamps_by_flags[flags] = stamps_ns["ObjectStamps"](ROOT, SNAPSHOT, text, force=compiler.force)
        return stamps_by_flags[flags]

    todo = [obj for obj in objects if obj in build and not stamps_of(obj).up_to_date(obj)]
    print(
        f"lmcache_adp._native: compiling {len(todo)} of {len(objects)} objects ({len(objects) - len(todo)} up to date)"
    )

    def compile_one(obj, tmp, depfile):
        src, ext = build[obj]
        compiler._compile(tmp, src, ext, cc_args + ["-MD", "-MF", depfile], extra_postargs + own_flags(obj), pp_opts)

    if _dry_run(compiler):
        for obj in todo:
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs + own_flags(obj), pp_opts)  # logs the command only
        return objects
    for flags, stamps in stamps_by_flags.items():
        stamps.compile_all([obj for obj in todo if tuple(own_flags(obj)) == flags], compile_one, stamps_ns["jobs"]())
    if digest_ns["source_snapshot"](ROOT)[0] != SOURCE_DIGEST:
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
        try:
            stamps_ns["jobs"]()  # ADP_BUILD_JOBS judged before any work: a bad one is "error: ..." and exit 1
        except ValueError as e:
            raise OptionError(str(e)) from None
        if getattr(self, "editable_mode", False):
            # pip install -e: setuptools builds in a new temporary directory each time; the tree's build/
            # keeps the objects, as for build_ext --inplace (they are judged by content and command).
            self.build_temp = str(ROOT / "build" / f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")
        self.compiler.compile = incremental_compile.__get__(self.compiler)
        Path(self.build_temp).mkdir(parents=True, exist_ok=True)
        unit = Path(self.build_temp) / "adp_source_digest.cc"
        if str(unit) not in ext.sources:
            ext.sources.append(str(unit))
        # One build at a time per build directory: two at once would mix their objects and records, and one of
        # other sources would rewrite the digest unit or remove the module under the other's compiler or linker.
        with open(Path(self.build_temp) / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            text = digest_ns["digest_unit"](SOURCE_DIGEST)
            if not _dry_run(self) and (not unit.exists() or unit.read_text() != text):
                unit.write_text(text)
            built = Path(self.get_ext_fullpath(ext.name))
            if built.exists() and digest_ns["recorded_digest"](built) != SOURCE_DIGEST and not _dry_run(self):
                built.unlink()  # the link below then runs whatever the objects' times
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
