# SPDX-License-Identifier: Apache-2.0
"""Loads from a disk card, deadline-safe: large objects straight into LMCache's buffer in pieces
of 32 MiB, the header block in the first piece's request (an object of up to 32 MiB in one request),
each piece's CRC beside the next one's read; objects of 4 MiB or less staged and copied under the
batch's guard.

Builds tests/cpp/disk_load_test.cc with the store, the connector, the embedded
backend and the fault device, and runs it: on a card whose reads are slow, a
load past its deadline fails and writes nothing into its buffer after that (64 MiB
into 4 KiB aligned and unaligned buffers, 4 MiB into an aligned one), a load
within its deadline returns the object (64 MiB: 2 requests), a damaged byte (in
the first or the last piece of a 64 MiB object, in the 4 MiB one) is a miss,
counted and dropped, and an object deleted while it is read is a miss with its
buffer untouched (4 MiB, staged) or a hit ordered before the delete (64 MiB,
straight into the buffer) (see the .cc file). And collision_load_test.cc.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_disk_loads_in_pieces_on_a_slow_card(tmp_path):
    cxx = os.environ.get("CXX", "g++")
    assert shutil.which(cxx), f"{cxx} not found: this test needs a C++20 compiler (set CXX)"
    src = ROOT / "src_cpp"
    sources = sorted(str(p) for d in ("store", "util", "connector", "testing") for p in (src / d).glob("*.cc"))
    sources += [str(src / "transport" / "embedded_backend.cc"), str(ROOT / "tests" / "cpp" / "disk_load_test.cc")]
    binary = tmp_path / "disk_load_test"
    cmd = [cxx, "-std=c++20", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers"]
    cmd += [f"-I{src}", "-pthread", *sources, "-o", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    env = dict(os.environ, ADP_LOG_LEVEL="ERROR")
    proc = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    assert "disk_load_test: PASS" in proc.stdout


def test_disk_loads_of_colliding_keys(tmp_path):
    """One request per object (header, payload and tail blocks, straight into the buffer), so the
    miss cases are decided before it: a key sharing its 64-bit hash with the stored one but not its
    key tag is a miss without a read, its buffer untouched; one sharing the tag too (the residual
    case) is a miss, no damage (tests/cpp/collision_load_test.cc)."""
    from tests.support import cpp

    binary = cpp.build("collision_load_test", tmp_path, ("store", "util", "connector", "testing"),
                       ("transport/embedded_backend.cc",))  # fmt: skip
    cpp.run(binary)
