# SPDX-License-Identifier: Apache-2.0
"""Whether the lmcache_adp._native this process loaded was built from the C++ sources beside it, where the
package sits in a source tree (src_cpp/ beside lmcache_adp/: an editable or in-place install). A module built
from other sources (main moved, or a bindings.cc change landed, and nobody rebuilt) failed `lmcache-adp
gateway` or ADPConnector(...) with a 30-line pybind TypeError about constructor arguments (audit 15 item 23).
The command line (lmcache_adp/cli.py) and ADPConnector ask once per process and stop with one line naming the
rebuild command; ADP_ALLOW_STALE_NATIVE=1 (the tests' switch, tests/support/native_build.py) makes it a
warning. A wheel or the image has no src_cpp/ beside the package: nothing is read.

A source tree with no module built in its package (a fresh clone, a new worktree) is named as that, with the same
command: where the import found none, and where it found another tree's (an editable install of another checkout:
setuptools' finder serves `lmcache_adp._native` from there once the package's own directory has none), which was
judged against that other tree's sources and passed, or named that tree's rebuild (review r16).

Cost: one digest of src_cpp (about 80 files, 0.7 MB) per process, measured in
benchmarks/results/*-native-check.md."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from lmcache_adp.log import get_logger
from lmcache_adp.source_digest import native_module, rebuild_command, recorded_digest, source_digest

ALLOW = "ADP_ALLOW_STALE_NATIVE"


@functools.cache
def stale_native() -> str | None:
    """One line saying that lmcache_adp._native was built from other sources than the src_cpp/ beside it and
    what rebuilds it; None when it was built from them, or when the package is in no source tree."""
    from lmcache_adp import _native

    module, package = Path(_native.__file__).resolve(), Path(__file__).resolve().parent
    if module.parent != package:  # not this package's own
        return _not_built(package, module)
    return _judge(module, lambda: getattr(_native, "SOURCE_DIGEST", ""))


def stale_native_file(package: Path) -> str | None:
    """stale_native() for the module file in the package directory `package`, judged by the digest recorded in
    its bytes: for where importing it, or the package, failed (lmcache_adp/__init__.py)."""
    module = native_module(package)
    if module is None:
        return _not_built(Path(package).resolve(), None)
    return _judge(module.resolve(), lambda: recorded_digest(module) or "")


def _not_built(package: Path, loaded: Path | None) -> str | None:
    """The line for a package in a source tree with no native module of its own (None outside a source tree);
    `loaded`: the module imported in its place."""
    tree = package.parent
    if not (tree / "src_cpp").is_dir():
        return None
    instead = f"; {loaded} was imported in its place, another tree's" if loaded else ""
    return f"lmcache_adp._native is not built in {package}{instead}: build it: {rebuild_command(tree)}"


def _judge(module: Path, built_from) -> str | None:
    tree = module.parent.parent
    if not (tree / "src_cpp").is_dir():
        return None
    built, now = built_from(), source_digest(tree)
    if built == now:
        return None
    sources = f"sources {built[:12]}" if built else "no source digest"
    return (
        f"lmcache_adp._native ({module}, {sources}) was built from other C++ sources than {tree / 'src_cpp'} "
        f"(digest {now[:12]}): rebuild it: {rebuild_command(tree)}"
    )


def check_native() -> str | None:
    """stale_native(), unless ADP_ALLOW_STALE_NATIVE=1: then its line is logged once as a WARNING, and None."""
    why = stale_native()
    if why and os.environ.get(ALLOW) == "1":
        _warn_once(why)
        return None
    return why


@functools.cache
def _warn_once(why: str) -> None:
    get_logger().warning("%s (%s=1: going on with it)", why, ALLOW)
