#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs an `lmcache` command (`server ...`, `bench l2 ...`) in this process with its L1 on 2 MiB hugetlb pages on a
host without CUDA, and checks a process's L1 in /proc/PID/smaps.

    python benchmarks/hugetlb_l1.py server --l1-use-hugepages --l1-size-gb 3 ...

Why: LMCache 0.5.6 allocates the L1 pool (`lmcache.v1.memory_management._allocate_cpu_memory`) through
`lmcache.device_ops.alloc_hugepage_pinned_ptr` when asked for hugepages (`--l1-use-hugepages`). On CUDA that maps
the 2 MiB hugetlb pool; without CUDA (`DeviceOps`, the CPU-only `StubCPUDevice` host) it is
`lmcache.v1.platform.torch_ops.mem_alloc.alloc_hugepage_pinned_ptr`, the "non-CUDA fallback": a RuntimeWarning and
the ordinary page-aligned `torch.empty` allocation, on 4 KiB pages, scattered by the kernel's free lists anew in
every process (results/2026-12-07-1945-item5v.md). Here, before LMCache's command runs, the two hugepage hooks of
that device object (and the NUMA variants) are replaced by an anonymous `mmap(MAP_HUGETLB | MAP_POPULATE)` of whole
2 MiB pages from the pool (the caller grows it: benchmarks/tools.py hugetlb_pool) and its `munmap`. Nothing of
LMCache's on disk changes; an ordinary allocation (no --l1-use-hugepages) is left as it is.

Where the device's ops override the hooks (a CUDA host: LMCache's own hugepage path works) nothing is replaced. An
LMCache without these hooks (another version laid out otherwise) is refused with exit status 2 and the reason on
stderr, never run on ordinary memory: `l1_check` of the running process is what a benchmark trusts in the end.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import importlib.metadata
import json
import os
import sys
from dataclasses import dataclass

HUGE_PAGE = 2 << 20
MAP_HUGETLB = 0x40000  # <linux/mman.h> (x86, arm64): not in Python 3.11's mmap module
MAP_POPULATE = 0x8000
MAP_HUGE_2MB = 21 << 26  # MAP_HUGE_SHIFT 26: the 2 MiB pool, whatever the default hugepage size
PROT_READ, PROT_WRITE = 0x1, 0x2
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
MAP_FAILED = ctypes.c_void_p(-1).value

# Set to a file's path, each L1 mapped here appends a JSON line there: its size and what /proc/self/smaps showed
# right after it was mapped (l1_check), for a caller whose `lmcache` process ends before it could look itself.
REPORT_ENV = "HUGETLB_L1_REPORT"

_mapped: dict[int, int] = {}  # address -> length of every L1 mapped here


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def alloc_hugetlb(size: int, *_: object) -> int:
    """`size` bytes (rounded up to whole 2 MiB pages) of the 2 MiB hugetlb pool, faulted in; the address.
    RuntimeError "mmap failed ..." (LMCache then logs the pool's state) when the pool has too few free pages."""
    length = -(-size // HUGE_PAGE) * HUGE_PAGE
    flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB | MAP_POPULATE
    addr = _libc().mmap(None, length, PROT_READ | PROT_WRITE, flags, -1, 0)
    if addr is None or addr == MAP_FAILED:
        err = ctypes.get_errno()
        raise RuntimeError(f"mmap failed: MAP_HUGETLB of {length} bytes (2 MiB pages): {os.strerror(err)}")
    _mapped[addr] = length
    print(f"hugetlb_l1: {length} bytes at {addr:#x} on 2 MiB hugetlb pages", file=sys.stderr, flush=True)
    report = os.environ.get(REPORT_ENV)
    if report:  # a short-lived process (`lmcache bench l2`): its caller reads what smaps showed once it is gone
        check = l1_check_pid(os.getpid(), length)
        with open(report, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "bytes": length, "ok": check.ok, "check": check.text}) + "\n")
    return addr


def free_hugetlb(ptr: int, *_: object) -> None:
    length = _mapped.pop(ptr, None)
    if length is not None:
        _libc().munmap(ptr, length)


def install() -> str:
    """Replaces LMCache's hugepage hooks where they fall back to ordinary memory; says what it did. SystemExit(2)
    with the reason where this LMCache has no such hooks."""
    version = importlib.metadata.version("lmcache")
    try:
        import lmcache
        from lmcache.v1 import memory_management
        from lmcache.v1.platform.base.device_ops import DeviceOps
    except ImportError as e:
        raise SystemExit(f"hugetlb_l1: LMCache {version}: cannot import its L1 allocation ({e})") from None
    ops = getattr(lmcache, "device_ops", None)
    hooks = (
        "alloc_hugepage_pinned_ptr",
        "free_hugepage_pinned_ptr",
        "alloc_hugepage_pinned_numa_ptr",
        "free_hugepage_pinned_numa_ptr",
    )
    missing = [h for h in hooks if not hasattr(DeviceOps, h) or not hasattr(ops, h)]
    if missing or not hasattr(memory_management, "_resolve_pinned_alloc_free"):
        raise SystemExit(
            f"hugetlb_l1: LMCache {version} allocates its L1 otherwise than 0.5.6 (no lmcache.device_ops."
            f"{', '.join(missing) or '?'} or memory_management._resolve_pinned_alloc_free): refusing to run it, "
            "its L1 would not be on hugetlb pages"
        )
    if getattr(type(ops), hooks[0]) is not getattr(DeviceOps, hooks[0]):
        return f"LMCache {version}: {type(ops).__name__} has its own hugepage allocation, left as it is"
    ops.alloc_hugepage_pinned_ptr = alloc_hugetlb
    ops.free_hugepage_pinned_ptr = free_hugetlb
    ops.alloc_hugepage_pinned_numa_ptr = alloc_hugetlb
    ops.free_hugepage_pinned_numa_ptr = free_hugetlb
    return f"LMCache {version}: {type(ops).__name__}'s hugepage allocation replaced by mmap(MAP_HUGETLB)"


@dataclass
class Mapping:
    start: int
    end: int
    name: str
    fields: dict[str, int]  # kB

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def page_kb(self) -> int:
        return self.fields.get("KernelPageSize", 0)

    @property
    def hugetlb_bytes(self) -> int:
        return (self.fields.get("Private_Hugetlb", 0) + self.fields.get("Shared_Hugetlb", 0)) << 10


def parse_smaps(text: str) -> list[Mapping]:
    maps: list[Mapping] = []
    for line in text.splitlines():
        head = line.split()
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):
            lo, hi = head[0].split("-")
            maps.append(Mapping(int(lo, 16), int(hi, 16), " ".join(head[5:]), {}))
        elif maps and head[0].endswith(":") and len(head) >= 2 and head[1].isdigit():
            maps[-1].fields[head[0][:-1]] = int(head[1])
    return maps


@dataclass
class L1Check:
    ok: bool
    text: str  # what was found, for the report or the refusal


def l1_check(smaps: str, l1_bytes: int) -> L1Check:
    """Is a process's L1 of `l1_bytes` on 2 MiB hugetlb pages? Its smaps must hold one mapping of at least that
    size with KernelPageSize 2048 kB and that many bytes of hugetlb pages in it (Private_ + Shared_Hugetlb:
    faulted in). What it found either way: the largest mapping's size, page size and hugetlb bytes."""
    maps = parse_smaps(smaps)
    if not maps:
        return L1Check(False, "no mappings in its smaps")
    huge = [m for m in maps if m.page_kb == 2048 and m.size >= l1_bytes and m.hugetlb_bytes >= l1_bytes]
    m = max(huge or maps, key=lambda m: m.size)
    seen = (
        f"its largest mapping {m.size / (1 << 20):.0f} MiB ({m.name or 'anonymous'}), KernelPageSize "
        f"{m.page_kb} kB, Private_Hugetlb + Shared_Hugetlb {m.hugetlb_bytes >> 20} MiB"
    )
    if huge:
        return L1Check(True, f"L1 on 2 MiB hugetlb pages: {seen}")
    return L1Check(False, f"no mapping of >= {l1_bytes / (1 << 20):.0f} MiB on 2 MiB hugetlb pages: {seen}")


def l1_check_pid(pid: int, l1_bytes: int) -> L1Check:
    try:
        with open(f"/proc/{pid}/smaps") as f:
            return l1_check(f.read(), l1_bytes)
    except OSError as e:
        return L1Check(False, f"cannot read /proc/{pid}/smaps: {e}")


def main(argv: list[str]) -> int:
    print(f"hugetlb_l1: {install()}", file=sys.stderr, flush=True)
    ep = next(iter(importlib.metadata.entry_points(group="console_scripts", name="lmcache")), None)
    if ep is None:
        raise SystemExit("hugetlb_l1: LMCache installs no `lmcache` command here")
    sys.argv = ["lmcache", *argv]
    return getattr(importlib.import_module(ep.module), ep.attr)()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
