# SPDX-License-Identifier: Apache-2.0
"""Compiled objects reused by content, for setup.py's build_ext and scripts/sanitize.sh: an object is reused when
what built it is unchanged, the same compile command (the compiler and its --version, flags, defines, include
dirs) and the same content of its source and of every header the compiler read (its -MD dependency file), by
sha256, never by file times. Its record, <object>.stamp, is written only after the object is in place, and only
when none of its src_cpp inputs differs from the snapshot the build took at its start
(source_digest.source_snapshot); so a stale object is never reused, nor one compiled from an edit saved during
the build.

Standard library only, no package imports: setup.py loads this file by path before the extension exists, and
scripts/sanitize.sh runs it as a script:

    python scripts/object_stamps.py OUT_DIR CXX [FLAG ...] -- SOURCE ...

compiles each SOURCE (a path relative to the tree) into OUT_DIR/<its path, '/' as '_', .cc as .o> with
`CXX FLAG ... -c`, those whose object is not up to date only, ADP_BUILD_JOBS at once (0 or unset: one per core);
prints the objects' paths, in the sources' order, on stdout and how many it compiled on stderr. The caller runs
one build at a time per OUT_DIR (sanitize.sh holds a lock over the compile and the link)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def sha256(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def dependencies(depfile: str) -> list[str]:
    """The files a -MD dependency file lists (its first rule's prerequisites), paths as the compiler wrote them."""
    text = Path(depfile).read_text().replace("\\\n", " ")
    rule = text.split("\n", 1)[0]
    words = rule.split(": ", 1)[1].replace("\\ ", "\0").split()
    return [w.replace("\0", " ") for w in words]


# Programs that run the compiler named after them (CC="ccache g++"): a compiler's version is the compiler's.
LAUNCHERS = {"ccache", "sccache", "distcc", "icecc"}


def compiler_of(argv: list[str]) -> str:
    """The compiler a command line runs: its first word that is not a launcher."""
    return next((w for w in argv if os.path.basename(w) not in LAUNCHERS), argv[0])


def compiler_version(compiler: str) -> str:
    return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout


# How long one flag's probe may take (an empty file: well under a second on an idle host). Past it the probe is
# stopped, its compiler's whole process group killed (a driver's cc1plus too), and the flag left out, said so.
PROBE_TIMEOUT_S = 120


def accepted_flags(
    compiler: list[str],
    flags: list[str],
    log: Callable[[str], None] = print,
    args: list[str] | tuple[str, ...] = (),
    timeout: float = PROBE_TIMEOUT_S,
) -> list[str]:
    """Those of `flags` that `compiler` (a command line: the compiler and its own flags) accepts together with
    `args`, the build's other arguments for the source (setup.py: distutils' include dirs, defines and extra
    compile args, -std=c++20 among them): each probed once (an empty C++ file compiled with them, the flag and
    -Werror, which makes an unknown or ignored flag fail, as ADP_WERROR=1's build would). A flag is judged with
    the arguments it will be compiled with: one that a compiler accepts alone but rejects beside them (or the
    reverse) is judged as the build will meet it (review of 6afff83: probed alone, such a flag was kept and
    failed the build). Kept only when the probe succeeds; every other flag is left out with a line through `log`
    naming the flag, the compiler and why: rejected, the probe timed out (`timeout` seconds), or the probe could
    not run (the compiler not found). setup.py's SOURCE_FLAGS: clang before 13 does not know -falign-loops=64 (a
    warning, -Wignored-optimization-argument, or an error), and with ADP_WERROR=1 the build failed on it."""
    kept = []
    for flag in flags:
        verdict = _flag_verdict(tuple(compiler), tuple(args), flag, timeout)
        if verdict == "accepted":
            kept.append(flag)
        elif verdict == "rejected":
            log(
                f"lmcache_adp._native: {compiler_of(compiler)} does not accept {flag} (probed with -Werror and the "
                "build's arguments): built without it"
            )
        else:
            log(f"lmcache_adp._native: {flag} not judged, {verdict}: built without it (the next build probes again)")
    return kept


@functools.cache
def _flag_verdict(compiler: tuple[str, ...], args: tuple[str, ...], flag: str, timeout: float) -> str:
    """'accepted', 'rejected', or why the probe gave no answer."""
    with tempfile.TemporaryDirectory(prefix="adp-flag-probe-") as tmp:
        source = Path(tmp) / "probe.cc"
        source.write_text("")
        command = [*compiler, *args, "-Werror", flag, "-c", str(source), "-o", str(Path(tmp) / "probe.o")]
        try:
            # A session of its own: on a timeout the whole group goes (the driver and the cc1plus it runs, which
            # holds the pipes: killing the driver alone left communicate() waiting for the compiler to finish).
            proc = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
            )
        except OSError as e:
            return f"the probe could not run {compiler_of(list(compiler))} ({e.strerror or e})"
        try:
            return "accepted" if proc.wait(timeout=timeout) == 0 else "rejected"
        except subprocess.TimeoutExpired:
            return f"the probe with {compiler_of(list(compiler))} timed out after {timeout:g} s"
        finally:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def jobs() -> int:
    """ADP_BUILD_JOBS: compilers at once (0 or unset: one per core). ValueError, naming the variable, for a value
    that is not a whole number >= 0."""
    value = os.environ.get("ADP_BUILD_JOBS", "").strip()
    if not value:
        return os.cpu_count() or 1
    if not value.isdigit():
        raise ValueError(f"ADP_BUILD_JOBS must be a whole number of compilers at once (0: one per core), got {value!r}")
    return int(value) or os.cpu_count() or 1


class ObjectStamps:
    """The objects of one build: `root` the tree, `snapshot` its src_cpp files' sha256 by relative path (read
    once, at the start), `command` what identifies the compile command (a string: compiler, its --version,
    flags); `force` compiles every object."""

    def __init__(self, root: Path, snapshot: dict[str, str], command: str, force: bool = False):
        self.root, self.snapshot, self.command, self.force = Path(root), snapshot, command, force
        self._hashes: dict[str, str | None] = {}  # each file outside the snapshot read once per build

    def content(self, path: str) -> str | None:
        rel = os.path.relpath(path, self.root)
        if rel in self.snapshot:
            return self.snapshot[rel]
        if path not in self._hashes:
            self._hashes[path] = sha256(path)
        return self._hashes[path]

    def as_built(self, path: str, sha: str | None) -> bool:
        """Whether the content `path` had when compiled (`sha`) is the snapshot's (for a file outside src_cpp: no
        snapshot, taken as such)."""
        rel = os.path.relpath(path, self.root)
        return self.snapshot[rel] == sha if rel in self.snapshot else not rel.startswith("src_cpp" + os.sep)

    def up_to_date(self, obj: str) -> bool:
        try:
            stamp = json.loads(Path(obj + ".stamp").read_text())
        except (OSError, ValueError):
            return False
        if self.force or not os.path.exists(obj) or stamp.get("command") != self.command:
            return False
        return all(self.content(path) == sha for path, sha in stamp["deps"].items())

    def compile(self, obj: str, run: Callable[[str, str], None]) -> None:
        """Compiles `obj` anew: run(tmp, depfile) compiles its source into the object file `tmp`, writing the -MD
        dependency file `depfile`; the object is then renamed into place, and recorded when its inputs were the
        snapshot's. An input edited while it compiled: no record, so the next build compiles it again."""
        Path(obj + ".stamp").unlink(missing_ok=True)
        tmp = f"{obj}.{os.getpid()}.tmp"
        try:
            run(tmp, tmp + ".d")
            deps = {os.path.normpath(d): sha256(d) for d in dependencies(tmp + ".d")}
            os.replace(tmp, obj)
        finally:
            Path(tmp).unlink(missing_ok=True)
            Path(tmp + ".d").unlink(missing_ok=True)
        if all(self.as_built(d, sha) for d, sha in deps.items()):
            Path(tmp + ".stamp").write_text(json.dumps({"command": self.command, "deps": deps}))
            os.replace(tmp + ".stamp", obj + ".stamp")

    def compile_all(self, todo: list[str], run: Callable[[str, str, str], None], jobs: int) -> None:
        """compile() each object of `todo`, `jobs` at once; run(obj, tmp, depfile) compiles obj's source."""
        with ThreadPoolExecutor(max(1, min(jobs, len(todo)))) as pool:
            list(pool.map(lambda obj: self.compile(obj, lambda tmp, dep: run(obj, tmp, dep)), todo))


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") < 2:
        print(f"usage: {sys.argv[0]} OUT_DIR CXX [FLAG ...] -- SOURCE ...", file=sys.stderr)
        return 2
    out, cxx, *flags = argv[: argv.index("--")]
    try:
        n_jobs = jobs()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    sources = argv[argv.index("--") + 1 :]
    root = Path(__file__).resolve().parents[1]
    digests: dict = {}
    exec((root / "lmcache_adp" / "source_digest.py").read_text(), digests)
    digest, snapshot = digests["source_snapshot"](root)
    Path(out).mkdir(parents=True, exist_ok=True)
    stamps = ObjectStamps(root, snapshot, json.dumps([cxx, flags, compiler_version(cxx)]))
    objects = {src: os.path.join(out, src.removesuffix(".cc").replace("/", "_") + ".o") for src in sources}
    source_of = {obj: src for src, obj in objects.items()}
    todo = [obj for obj in objects.values() if not stamps.up_to_date(obj)]
    print(f"compiling {len(todo)} of {len(objects)} objects ({len(objects) - len(todo)} up to date)", file=sys.stderr)

    def run(obj: str, tmp: str, depfile: str) -> None:
        subprocess.run([cxx, *flags, "-c", source_of[obj], "-o", tmp, "-MD", "-MF", depfile], check=True)

    try:
        stamps.compile_all(todo, run, n_jobs)
    except subprocess.CalledProcessError as e:
        print(f"compile failed: {' '.join(e.cmd)}", file=sys.stderr)
        return 1
    if digests["source_snapshot"](root)[0] != digest:
        print("src_cpp changed during the build: run it again", file=sys.stderr)
        return 1
    print("\n".join(objects.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
