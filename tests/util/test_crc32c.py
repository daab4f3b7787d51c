# SPDX-License-Identifier: Apache-2.0
import os
import platform
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from lmcache_adp import _native

google_crc32c = pytest.importorskip("google_crc32c")


def test_known_vector():
    assert _native.crc32c(b"123456789") == 0xE3069283
    assert _native.crc32c(b"") == 0


@pytest.mark.parametrize("size", [1, 7, 8, 9, 4095, 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 1, 5 * 12288 + 77, 1 << 20])
@pytest.mark.parametrize("misalign", [0, 1, 5])
def test_matches_reference_library(size, misalign):
    data = os.urandom(size + misalign)[misalign:]
    assert _native.crc32c(data) == google_crc32c.value(data)


@pytest.mark.parametrize("size", [511, 512, 513, 527, 528, 575, 576, 577, 639, 640, 655, 4096 + 63, (2 << 20) + 4095])
def test_folding_edges_match_reference_library(size):
    """Around the folding paths' steps (none under 512 bytes, then 64 bytes a step, 16-byte lanes, the last
    bytes by the CRC32 instruction), from an odd address, with and without an initial CRC."""
    data = os.urandom(size + 3)[3:]
    assert _native.crc32c(data) == google_crc32c.value(data)
    head = os.urandom(37)
    assert _native.crc32c(data, _native.crc32c(head)) == google_crc32c.value(head + data)


def test_extend_equals_whole():
    data = os.urandom(100_000)
    part = _native.crc32c(data[:33_333])
    assert _native.crc32c(data[33_333:], part) == _native.crc32c(data)


def test_uses_hardware_here():
    assert _native.crc32c_implementation() in ("vpclmulqdq", "vpclmulqdq-avx2", "pclmul", "sse4.2", "armv8")


def cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(platform.machine() != "x86_64" or not Path("/proc/cpuinfo").exists(), reason="x86-64 Linux")
def test_picks_the_widest_folding_this_cpu_has():
    """AVX-512 with VPCLMULQDQ: the 512-bit folding (fold_raw); AVX2 with VPCLMULQDQ and no AVX-512 (the 2-core
    VM's AMD EPYC): the 256-bit one (fold256_raw); PCLMULQDQ alone: the 128-bit one (pclmul_raw)."""
    flags = cpu_flags()
    if {"avx512f", "avx512vl", "avx512bw", "vpclmulqdq", "pclmulqdq", "sse4_2"} <= flags:
        expected = "vpclmulqdq"
    elif {"avx2", "vpclmulqdq", "pclmulqdq", "sse4_2"} <= flags:
        expected = "vpclmulqdq-avx2"
    elif {"pclmulqdq", "sse4_2"} <= flags:
        expected = "pclmul"
    else:
        expected = "sse4.2" if "sse4_2" in flags else "bitwise"
    assert _native.crc32c_implementation() == expected


def test_every_implementation_matches_bitwise(tmp_path):
    """Each implementation this CPU runs, forced by name (tests/cpp/crc32c_paths_test.cc), not only the one the CPU
    picks: every length 0..5000 at every misalignment 0..63 with initial CRCs, as crc32c_extend and as
    crc32c_copy_extend (the destination's bytes and the bytes around it), large sizes, pieces by two
    implementations joined by crc32c_combine. Under ASan too (tests/sanitizers/test_sanitizers.py)."""
    from tests.support import cpp

    cpp.run(cpp.build("crc32c_paths_test", tmp_path, dirs=(), extra=("util/crc32c.cc",)), timeout=600)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64: CPUID, XGETBV")
def test_cpu_gate_on_other_cpus(tmp_path):
    """The dispatch's CPU gate on CPUs this machine is not (tests/cpp/crc32c_gate_test.cc: crc32c.cc built with a
    fake __builtin_cpu_supports): an AVX-512 CPU keeps fold_raw, AVX2 with VPCLMULQDQ takes fold256_raw, VPCLMULQDQ
    with AVX2 masked (a hypervisor) or AVX2 without VPCLMULQDQ keeps pclmul_raw; forcing a name the CPU lacks is
    refused; and libgcc reports AVX2/VPCLMULQDQ/AVX-512F here only with their XCR0 state enabled."""
    from tests.support import cpp

    cpp.run(cpp.build("crc32c_gate_test", tmp_path, dirs=()), timeout=300)


def crc_loop_heads(module: str) -> list[tuple[int, str]]:
    """(address, function) of the head of every CRC loop in the disassembly of `module`: a loop being a backward
    conditional branch and what lies between its target and it, a CRC loop one whose body has a carry-less
    multiply (the folding loops: pclmul_raw, fold_raw, fold_tail) or three CRC32 instructions (hw_raw's three
    streams) and no call. Found by instructions, not by name: a compiler that inlines pclmul_raw into its caller
    moves the loop, not its instructions. The short loops (a buffer's first bytes up to 8-byte alignment, its last
    ones) are none of these: the compiler leaves a loop of a few iterations unaligned, and so does this check."""
    text = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", module], capture_output=True, text=True, check=True
    ).stdout
    heads = []
    for block in re.split(r"\n(?=[0-9a-f]+ <[^\n]*>:\n)", text):
        name = re.search(r"^[0-9a-f]+ <(.*)>:$", block, re.M)
        name = name.group(1) if name else "?"
        code = [
            (int(m.group(1), 16), m.group(2), m.group(3))
            for m in re.finditer(r"^\s+([0-9a-f]+):\s+(\S+)[ \t]*(.*)$", block, re.M)
        ]
        for at, op, args in code:
            target = re.match(r"([0-9a-f]+) <", args)
            if not (op.startswith("j") and op != "jmp" and target and int(target.group(1), 16) <= at):
                continue
            head = int(target.group(1), 16)
            body = [o for a, o, _ in code if head <= a <= at]
            if any(o.startswith("call") for o in body):
                continue
            if any("clmul" in o for o in body) or sum(o.startswith("crc32") for o in body) >= 3:
                heads.append((head, name))
    return heads


def build_compiler_takes(flag: str) -> bool:
    """Whether this machine's build compiler (distutils' C++ command, as setup.py takes it) accepts `flag`: setup.py
    builds crc32c.cc with its SOURCE_FLAGS only where scripts/object_stamps.py's accepted_flags probe says so
    (clang before 13 does not know -falign-loops=64: built without it, review37a)."""
    import importlib.util

    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    command = getattr(compiler, "compiler_so_cxx", None) or compiler.compiler_so
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("adp_object_stamps_crc", root / "scripts" / "object_stamps.py")
    stamps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stamps)
    return stamps.accepted_flags(command, [flag], log=lambda line: None) == [flag]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the folding loops are x86-64's")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump to read the module's code with")
def test_crc_loops_are_64_byte_aligned():
    """The CRC loops of the built module start at a 64-byte boundary (setup.py SOURCE_FLAGS: -falign-loops=64 for
    crc32c.cc), wherever unrelated code moves them: load36 measured tmpfs loads 0.79-0.88x between two builds
    that differed elsewhere, the copy+CRC loop 64-byte aligned in one and 32 off in the other."""
    if not build_compiler_takes("-falign-loops=64"):
        pytest.skip("the build compiler rejects -falign-loops=64 (clang < 13): crc32c.cc was built without it")
    heads = crc_loop_heads(_native.__file__)
    assert len({name for _, name in heads}) >= 4, f"expected the CRC loops of crc32c.cc, found {heads}"
    off = [f"{at:#x} (+{at % 64}) in {name}" for at, name in heads if at % 64]
    assert not off, "CRC loop heads off a 64-byte boundary: " + "; ".join(off)


def object_header(image: bytes, key: str) -> tuple[int, int]:
    """(payload offset, payload_crc field) of key's object on a card image (docs/card_format.md)."""
    pos = image.find(key.encode())
    assert pos > 0, f"{key} not on the card"
    header = pos - 64  # ObjectHeader (64 bytes) then the key
    assert image[header : header + 8] == b"ADPOBJT1"
    (payload_crc,) = struct.unpack_from("<I", image, header + 56)
    return header + 4096, payload_crc


@pytest.mark.parametrize("size", [1, 5, 4096, 3 * 4096 + 9, 1000_000])
def test_store_reads_check_while_copying(card, size):
    """put() stages through crc32c_copy and get() checks through it: the CRC on
    the card is the reference library's, and a flipped byte anywhere (first,
    middle, last, in the last partial block) is a checksum failure, not a hit."""
    from lmcache_adp import CardStore

    s = CardStore(card, 64 << 20)
    data = os.urandom(size)
    offsets = sorted({0, size // 2, size - 1})
    for off in offsets:
        s.put(f"crc-{off}-end", data)
    s.put("clean", data)
    image = open(card, "rb").read()
    for key in [f"crc-{off}-end" for off in offsets] + ["clean"]:
        assert object_header(image, key)[1] == google_crc32c.value(data), key
    with open(card, "r+b") as f:
        for off in offsets:
            start, _ = object_header(image, f"crc-{off}-end")
            f.seek(start + off)
            f.write(bytes([image[start + off] ^ 0x01]))
        f.flush()
        os.fsync(f.fileno())
    for i, off in enumerate(offsets):
        assert s.get(f"crc-{off}-end") is None, f"a flipped byte at {off} of {size} was served"
        assert s.stats()["checksum_failures"] == i + 1
    assert s.get("clean") == data
