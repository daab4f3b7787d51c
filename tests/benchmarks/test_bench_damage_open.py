# SPDX-License-Identifier: Apache-2.0
"""benchmarks/bench_damage_open.py --open rw: the pad a clean close leaves over the frontier's tail is found (the
`closed` image), and zeroing it leaves the image an open pads again (the `cut` image)."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_damage_open  # noqa: E402

from lmcache_adp import CardStore  # noqa: E402


def test_tail_pad_found_after_a_clean_close_and_padded_again_after_a_cut(tmp_path):
    path = str(tmp_path / "card.img")
    s = CardStore(path, 64 << 20)
    for i in range(5):
        s.put(f"k{i}", bytes([i]) * 300_000)
    s.close()
    at = bench_damage_open.tail_pad(path)
    assert at > 0
    pad = bench_damage_open.read_block(path, at)
    assert pad[:8] == b"ADPOBJT1" and struct.unpack_from("<I", pad, 48)[0] & 4, "a pad record"
    image = Path(path).read_bytes()
    CardStore(path).close()  # an open after a clean close writes nothing
    assert Path(path).read_bytes() == image
    bench_damage_open.write_block(path, at, bytes(bench_damage_open.BLOCK))
    assert bench_damage_open.tail_pad(path) == -1, "the cut image: no pad over the tail"
    s = CardStore(path)  # the open pads the cut again
    assert s.get("k4") == bytes([4]) * 300_000
    s.close()
    assert bench_damage_open.read_block(path, at) == pad
