# SPDX-License-Identifier: Apache-2.0
"""The compile flags of the sanitized builds, the one place they are written: scripts/sanitize.sh reads them (running
this file) and tests/support/cpp.py reads them (loading it by path), so the two compile src_cpp under a sanitizer with
the same command into the same build/sanitize/<mode>/ and reuse each other's objects (scripts/object_stamps.py: the
same command, the same content). Flags written in either place instead would make the sharing stop without a failure,
only a second compile of src_cpp (tests/sanitizers/test_sanitize_flags.py checks that both use these).

    python scripts/sanitize_flags.py asan|tsan

prints the flags of `mode`, one a line. Standard library only, no package imports.

asan is AddressSanitizer + UndefinedBehaviorSanitizer, compiled -fPIC -fvisibility=hidden: sanitize.sh asan-python
links the same objects into the Python extension (a shared object, its symbols hidden as setup.py's Pybind11Extension
builds it), so its build compiles only bindings.cc and the digest unit of its own. In the test programs and
connector_stress (executables) they change no check: the instrumentation is the same, and an executable exports
none of its symbols anyway (-fPIC with hidden symbols generates what -fPIE does). tsan is ThreadSanitizer.
"""

from __future__ import annotations

import sys

SANITIZERS = {
    "asan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-fPIC",
             "-fvisibility=hidden"],
    "tsan": ["-fsanitize=thread"],
}  # fmt: skip


def flags(mode: str) -> list[str]:
    """The compile (and link) flags of sanitizer `mode` (a key of SANITIZERS); paths relative to the tree."""
    return ["-std=c++20", "-g", "-O1", "-D_GLIBCXX_ASSERTIONS", *SANITIZERS[mode], "-Wall", "-Wextra", "-Werror",
            "-Wno-missing-field-initializers", "-Isrc_cpp", "-pthread"]  # fmt: skip


def object_dir(mode: str) -> str:
    """Where the objects of `mode` go, relative to the tree (sanitize.sh asan-python's shared ones too: asan's)."""
    return f"build/sanitize/{mode}"


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in SANITIZERS:
        print(f"usage: {sys.argv[0]} {'|'.join(SANITIZERS)}", file=sys.stderr)
        sys.exit(2)
    print("\n".join(flags(sys.argv[1])))
