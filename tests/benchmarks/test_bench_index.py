# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_index.py: memory per object counts the store's own (anonymous) memory, not the card image
the store maps from /dev/shm."""

from __future__ import annotations

import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_index  # noqa: E402

MiB = 1 << 20


def test_anon_rss_leaves_out_a_mapped_and_touched_dev_shm_file(tmp_path):
    """64 MiB of a /dev/shm file mapped and written: resident (VmRSS grows by it) but not the process's
    anonymous memory, which bench_index counts; 16 MiB of anonymous memory touched is counted."""
    path = f"/dev/shm/adp-test-anon-rss-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 64 * MiB)
        before = bench_index.anon_rss_bytes()
        with mmap.mmap(fd, 64 * MiB) as card:
            for off in range(0, 64 * MiB, 4096):
                card[off] = 1
            assert bench_index.anon_rss_bytes() - before < 8 * MiB
            anon = bytearray(16 * MiB)
            for off in range(0, len(anon), 4096):
                anon[off] = 1
            assert bench_index.anon_rss_bytes() - before >= 15 * MiB
            del anon
    finally:
        os.close(fd)
        os.unlink(path)


def test_a_run_on_a_dev_shm_card_reports_the_stores_memory_per_object_not_the_cards():
    """20,000 one-byte objects on a /dev/shm card: each touches 8 KiB of the mapped card; the store's own
    memory is tens of bytes an object (docs/card_format.md, "In memory"). Both columns under 1 KiB."""
    card = f"/dev/shm/adp-test-bench-index-{os.getpid()}.img"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        out = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "bench_index.py"), "--card", card, "--steps", "20000"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        if os.path.exists(card):
            os.unlink(card)
    assert out.returncode == 0, out.stderr
    row = re.search(r"^\| 20000 \|(.*)\|$", out.stdout, re.M)
    assert row, out.stdout
    per_object, reopened = (float(x) for x in row.group(1).split("|")[4:6])
    assert 0 < per_object < 1024 and 0 < reopened < 1024, out.stdout
