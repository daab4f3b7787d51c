# SPDX-License-Identifier: Apache-2.0
"""How the connector finds the /dev/shm file holding a load's buffer (RemoteBackend::find_segment, docs/protocol.md
"Segments"): the kernel's answer for the one address (PROCMAP_QUERY, Linux 6.11+; session 32) and, on a kernel
without it (ADP_TEST_NO_PROCMAP_QUERY=1 stands in for one), a read of the whole of /proc/self/maps. Either way: only
a shared, writable mapping of a regular file under /dev/shm that is not deleted is a segment, at the file offset of
its mapping, and a file mapped twice is one segment."""

from __future__ import annotations

import ctypes
import mmap
import os
import time

import pytest

from lmcache_adp import ADPConnector
from lmcache_adp.gateway_stats import read_gateway_stats
from tests.helpers import RawConnector, payload

SIZE = 64 << 10
N = 4
PAGE = mmap.PAGESIZE

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FIXED = 0x10
RW = mmap.PROT_READ | mmap.PROT_WRITE


def map_at(addr: int | None, size: int, fd: int = -1, offset: int = 0) -> int:
    """mmap: anonymous (fd -1) or shared of fd at `offset`; at addr exactly (MAP_FIXED) where given."""
    flags = (mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if fd < 0 else mmap.MAP_SHARED
    got = libc.mmap(addr, size, RW, flags | (MAP_FIXED if addr else 0), fd, offset)
    assert got not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    assert addr is None or got == addr
    return got


def views(addr: int, n: int) -> list[memoryview]:
    raw = memoryview((ctypes.c_char * (n * SIZE)).from_address(addr)).cast("B")
    return [raw[i * SIZE : (i + 1) * SIZE] for i in range(n)]


def shm_file(size: int, tag: str) -> tuple[str, int]:
    path = f"/dev/shm/adp-test-lookup-{tag}-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, size)
    return path, fd


@pytest.fixture(params=["procmap_query", "maps_scan"])
def lookup(request, monkeypatch):
    """The connector's way to find segments: the kernel's ioctl (this VM's kernel has it), or the whole maps file."""
    if request.param == "maps_scan":
        monkeypatch.setenv("ADP_TEST_NO_PROCMAP_QUERY", "1")
    return request.param


@pytest.fixture
def stored(gateway, lookup):
    """The gateway and N keys stored in it; a connector of one worker (one connection: its segments are the
    gateway's), made after `lookup` set its way (the hooks are read at a connector's start)."""
    keys = [f"lookup@{i}" for i in range(N)]
    c = RawConnector(ADPConnector(gateway=gateway.unix_url, num_workers=1, timeout_ms=10000))
    try:
        assert c.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
        yield gateway, c, keys
    finally:
        c.conn.close()


def load(gw, c: RawConnector, keys: list[str], bufs: list[memoryview]) -> int:
    """Loads keys into bufs, checks the bytes, and says how many objects went straight into a segment."""
    before = read_gateway_stats(gw.unix_url)["segment_loads"]
    for b in bufs:
        b[:] = b"\0" * SIZE
    ok, _, per_key = c.get(keys, bufs)
    assert ok and all(per_key)
    assert [bytes(b) for b in bufs] == [payload(k, SIZE) for k in keys]
    return read_gateway_stats(gw.unix_url)["segment_loads"] - before


def test_a_buffer_remapped_into_shm_at_its_address_is_a_segment(stored, lookup):
    """A load into anonymous memory, then the same addresses remapped onto a /dev/shm file (MAP_FIXED). With
    PROCMAP_QUERY the next batch asks the kernel again about a mapping cached as anonymous (one ioctl), so it goes
    in place at once; the read of the whole maps file does that at most once a second, so it takes the ring until
    then (a load a second, at most, that still does: the waits are on the counter, not on the clock)."""
    gw, c, keys = stored
    addr = map_at(None, N * SIZE)
    path, fd = shm_file(N * SIZE, "remap")
    try:
        assert load(gw, c, keys, views(addr, N)) == 0  # anonymous: process memory or the ring
        map_at(addr, N * SIZE, fd)
        if lookup == "procmap_query":
            assert load(gw, c, keys, views(addr, N)) == N
        else:
            deadline = time.monotonic() + 30
            while load(gw, c, keys, views(addr, N)) == 0:
                assert time.monotonic() < deadline, "the remapped buffers never went in place"
                time.sleep(0.2)
        assert os.pread(fd, SIZE, SIZE) == payload(keys[1], SIZE)  # in the file: the same memory
    finally:
        libc.munmap(addr, N * SIZE)
        os.close(fd)
        os.unlink(path)


def test_an_unlinked_file_whose_name_was_taken_again_is_not_a_segment(stored):
    """The buffers' /dev/shm file is unlinked and another file made under its name: the mapping is not that file
    (the kernel's name of the mapping ends in " (deleted)"; a name is only ever checked against the mapping's
    device and inode), so the loads take the ring and the new file is left as it was."""
    gw, c, keys = stored
    path, fd = shm_file(N * SIZE, "deleted")
    addr = map_at(None, N * SIZE, fd)
    os.unlink(path)
    other = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(other, N * SIZE)
        assert load(gw, c, keys, views(addr, N)) == 0
        assert os.pread(other, N * SIZE, 0) == b"\0" * (N * SIZE)
        assert read_gateway_stats(gw.unix_url)["segments"] == 0
    finally:
        libc.munmap(addr, N * SIZE)
        os.close(fd)
        os.close(other)
        os.unlink(path)


def test_a_mapping_at_an_offset_is_found_at_its_file_offset(stored, lookup):
    """One file mapped twice: its first page at one address, and from `at` on at another. Loads into the second
    mapping go in place at their file offsets (`at` + the buffer's place in its mapping), and both mappings are
    the one file: one segment on the connection, not two."""
    gw, c, keys = stored
    at = 3 * PAGE
    path, fd = shm_file(at + N * SIZE, "offset")
    head = map_at(None, PAGE, fd)
    addr = map_at(None, N * SIZE, fd, at)
    try:
        ctypes.memset(head, 0x11, PAGE)
        assert load(gw, c, keys, views(addr, N)) == N
        for i, k in enumerate(keys):
            assert os.pread(fd, SIZE, at + i * SIZE) == payload(k, SIZE)
        assert os.pread(fd, PAGE, 0) == b"\x11" * PAGE
        head_buf = memoryview((ctypes.c_char * PAGE).from_address(head)).cast("B")
        probe = f"lookup@head@{lookup}"
        assert c.set([probe], [memoryview(payload(probe, PAGE))])[0]
        ok, _, per_key = c.get([probe], [head_buf])
        assert ok and per_key == [True]
        assert os.pread(fd, PAGE, 0) == payload(probe, PAGE)
        st = read_gateway_stats(gw.unix_url)
        assert st["segments"] == 1, st  # the first page's mapping found the file already open
    finally:
        libc.munmap(head, PAGE)
        libc.munmap(addr, N * SIZE)
        os.close(fd)
        os.unlink(path)


def held_open(path: str) -> bool:
    """Whether this process holds an fd of the unlinked file that was `path`."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == f"{path} (deleted)":
                return True
        except OSError:
            pass
    return False


def test_a_file_no_longer_mapped_nor_registered_is_not_held_open(gateway, lookup):
    """Review 32b F2: a /dev/shm file found by find_segment but never registered (its batch mixed it with anonymous
    memory: the ring, process memory off), then unmapped and unlinked, must not stay open in the connector (its
    tmpfs pages would stay allocated). The read of the whole maps file drops it at its next read (an address no
    cached mapping holds); the PROCMAP_QUERY path keeps it until a lookup overlaps its old range. Red there on
    5847c9f: the connector still holds an fd of the deleted file."""
    keys = ["held@0", "held@1"]
    c = RawConnector(ADPConnector(gateway=gateway.unix_url, num_workers=1, timeout_ms=10000, process_memory=False))
    path, fd = shm_file(SIZE, "held")
    faddr = map_at(None, SIZE, fd)
    aaddr = map_at(None, SIZE)
    baddr = 0
    try:
        assert c.set(keys, [memoryview(payload(k, SIZE)) for k in keys])[0]
        assert load(gateway, c, keys, [views(faddr, 1)[0], views(aaddr, 1)[0]]) == 0  # mixed: the ring
        # Mapped after that lookup (no cached mapping holds it) and before the file's unmap (not at its address).
        baddr = map_at(None, SIZE)
        libc.munmap(faddr, SIZE)
        os.close(fd)
        os.unlink(path)
        assert load(gateway, c, keys[:1], [views(baddr, 1)[0]]) == 0  # an address no cached mapping holds
        assert not held_open(path), "the connector holds the unmapped, unlinked, unregistered /dev/shm file open"
    finally:
        c.conn.close()
        libc.munmap(aaddr, SIZE)
        if baddr:
            libc.munmap(baddr, SIZE)
