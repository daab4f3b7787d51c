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
straight into the buffer) (see the .cc file). And collision_load_test.cc. And the staging of a disk
load is in transparent huge pages (advised MADV_HUGEPAGE: src_cpp/util/aligned_buffer.h).
"""

from __future__ import annotations

from pathlib import Path

from tests.support import cpp


def test_disk_loads_in_pieces_on_a_slow_card(tmp_path):
    # Built by tests/support/cpp.py (the session's objects, a compiler per core, -D_GLIBCXX_ASSERTIONS) rather than
    # by one g++ command of all ~30 sources: that was about a minute of a CI run on one core.
    binary = cpp.build("disk_load_test", tmp_path, ("store", "util", "connector", "testing"),
                       ("transport/embedded_backend.cc",))  # fmt: skip
    cpp.run(binary, timeout=300)


def test_disk_loads_of_colliding_keys(tmp_path):
    """One request per object (header, payload and tail blocks, straight into the buffer): a key
    sharing its 64-bit hash_key with the stored one but not its index hash (a crafted key) loads
    its own object beside it; one sharing the index hash too (the residual case, the hash narrowed
    to 16 bits to make one) is a miss, no damage (tests/cpp/collision_load_test.cc)."""
    binary = cpp.build("collision_load_test", tmp_path, ("store", "util", "connector", "testing"),
                       ("transport/embedded_backend.cc",))  # fmt: skip
    cpp.run(binary)


def _huge_advised_mappings() -> dict[str, int]:
    """This process's mappings advised MADV_HUGEPAGE (VmFlags "hg" in /proc/self/smaps): range -> bytes."""
    found, current = {}, None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if "-" in first and not first.endswith(":"):
            current = first
        elif first == "VmFlags:" and "hg" in line.split()[1:]:
            lo, hi = (int(x, 16) for x in current.split("-"))
            found[current] = hi - lo
    return found


def test_disk_load_stages_in_huge_pages(tmp_path):
    """A disk load of an object of one piece or less is read into the worker's staging, then copied into the
    buffer: that staging is 2 MiB aligned, whole 2 MiB pages, advised MADV_HUGEPAGE, so the O_DIRECT read lands in
    a few physically contiguous segments (on this VM's virtio disk a read into scattered 4 KiB pages ran at
    0.5-0.85x: benchmarks/probes/l1_dest.py). The object still loads whole, its CRC checked."""
    import numpy as np

    from lmcache_adp import ADPConnector
    from tests.helpers import MIB, RawConnector, payload

    if not Path("/sys/kernel/mm/transparent_hugepage").is_dir():
        import pytest

        pytest.skip("this kernel has no transparent huge pages")
    before = _huge_advised_mappings()
    conn = ADPConnector(card=str(tmp_path / "card.img"), card_size_gb=0.0625, num_workers=1)
    try:
        c = RawConnector(conn)
        size = 256 << 10
        raw = np.empty(size + 4096, dtype=np.uint8)
        src = raw[(-raw.ctypes.data) % 4096 :][:size]
        src[:] = np.frombuffer(payload("k", size), dtype=np.uint8)
        assert c.set(["k"], [memoryview(src)])[0]
        raw2 = np.zeros(size + 4096, dtype=np.uint8)
        dst = raw2[(-raw2.ctypes.data) % 4096 :][:size]
        ok, _, per_key = c.get(["k"], [memoryview(dst)])
        assert ok and per_key == [True]
        assert bytes(dst) == payload("k", size)
        new = {r: n for r, n in _huge_advised_mappings().items() if r not in before}
        assert new, "no mapping advised MADV_HUGEPAGE after a staged disk load"
        for r, n in new.items():
            assert int(r.split("-")[0], 16) % (2 * MIB) == 0 and n % (2 * MIB) == 0, (r, n)
    finally:
        conn.close()
