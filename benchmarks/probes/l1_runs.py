# SPDX-License-Identifier: Apache-2.0
"""Probe (issue 10 item 4, session 27): how physically contiguous `lmcache bench l2`'s L1 is.

Allocates the L1 as `lmcache bench l2 --l1-align-bytes 4096` does for bench_l2.py's rounds (make_aligned_tensor
of 2 x 128 keys x OBJ bytes, each object's slice written by fill_ as make_memory_objects does) and prints the
physically contiguous runs per object from /proc/self/pagemap (root only): an O_DIRECT read of an object into
L1 is one segment per run, and a request holds at most max_segments (254 on this VM's virtio disk).

Run: python benchmarks/probes/l1_runs.py [OBJ_KiB=2048]   (one fresh process per run: that is what varies)
"""

import os
import struct
import sys

from lmcache.cli.commands.bench.l2_adapter_bench.data import make_aligned_tensor

obj = int(sys.argv[1] if len(sys.argv) > 1 else 2048) * 1024
keys = 128
l1 = make_aligned_tensor(2 * keys * obj, 4096)
for i in range(2 * keys):
    l1[i * obj : (i + 1) * obj].fill_(i & 0xFF)
base = l1.data_ptr()
runs = []
with open("/proc/self/pagemap", "rb") as f:
    for i in range(2 * keys):
        f.seek((base + i * obj) // 4096 * 8)
        pfns = [e & ((1 << 55) - 1) for e in struct.unpack(f"{obj // 4096}Q", f.read(obj // 4096 * 8))]
        if not all(pfns):
            sys.exit("pagemap hides frames (not root?)")
        runs.append(1 + sum(1 for a, b in zip(pfns, pfns[1:], strict=False) if b != a + 1))
runs.sort()
n = len(runs)
print(
    f"pid {os.getpid()}: L1 {2 * keys * obj >> 20} MiB, runs per {obj >> 10} KiB object: median {runs[n // 2]}, "
    f"min {runs[0]}, max {runs[-1]}, objects over 254 runs: {sum(r > 254 for r in runs)}/{n}"
)
