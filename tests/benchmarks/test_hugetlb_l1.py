# SPDX-License-Identifier: Apache-2.0
"""benchmarks/hugetlb_l1.py: an LMCache command whose L1 is really on 2 MiB hugetlb pages on a host without CUDA
(LMCache 0.5.6's `--l1-use-hugepages` falls back to ordinary memory there), and the /proc/PID/smaps check the
benchmarks refuse a run by."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
pytest.importorskip("lmcache")
import hugetlb_l1  # noqa: E402

MiB = 1 << 20


def smaps_entry(start: int, size: int, name: str, page_kb: int, hugetlb_kb: int) -> str:
    return textwrap.dedent(f"""\
        {start:x}-{start + size:x} rw-p 00000000 00:00 0 {name}
        Size:           {size >> 10} kB
        KernelPageSize: {page_kb} kB
        MMUPageSize:    {page_kb} kB
        Rss:            {0 if hugetlb_kb else size >> 10} kB
        Private_Hugetlb: {hugetlb_kb} kB
        Shared_Hugetlb:  0 kB
        VmFlags: rd wr mr mw me ac
        """)


def test_the_check_takes_only_a_mapping_of_the_l1s_size_on_2_mib_pages_all_of_it_hugetlb():
    """item5v: each "--l1-hugetlb" server's 3 GiB L1 was KernelPageSize 4 kB with Private_Hugetlb 0: refused.
    An L1 on hugetlb pages is taken; one smaller than the L1, or not faulted in, is not."""
    libc = smaps_entry(0x7F0000000000, 2 * MiB, "/usr/lib/libc.so.6", 4, 0)
    ordinary = libc + smaps_entry(0x7F1000000000, 3072 * MiB, "", 4, 0)
    c = hugetlb_l1.l1_check(ordinary, 3072 * MiB)
    assert not c.ok and c.text == (
        "no mapping of >= 3072 MiB on 2 MiB hugetlb pages: its largest mapping 3072 MiB (anonymous), "
        "KernelPageSize 4 kB, Private_Hugetlb + Shared_Hugetlb 0 MiB"
    )
    huge = libc + smaps_entry(0x7F2000000000, 3072 * MiB, "/anon_hugepage (deleted)", 2048, 3072 << 10)
    assert hugetlb_l1.l1_check(huge, 3072 * MiB).ok
    assert "KernelPageSize 2048 kB, Private_Hugetlb + Shared_Hugetlb 3072 MiB" in hugetlb_l1.l1_check(huge, 1).text
    assert not hugetlb_l1.l1_check(huge, 3073 * MiB).ok
    unfaulted = smaps_entry(0x7F2000000000, 3072 * MiB, "/anon_hugepage (deleted)", 2048, 1024 << 10)
    assert not hugetlb_l1.l1_check(unfaulted, 3072 * MiB).ok
    assert not hugetlb_l1.l1_check("", 1).ok


def test_a_process_on_ordinary_memory_is_seen_as_such_in_its_smaps():
    """A real process with 64 MiB of ordinary memory touched: its smaps show no hugetlb L1."""
    code = "import sys; b = bytearray(64 << 20); print('ready', flush=True); sys.stdin.read()"
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        c = hugetlb_l1.l1_check_pid(p.pid, 64 * MiB)
    finally:
        p.communicate("")
    assert not c.ok and "KernelPageSize 4 kB" in c.text, c.text
    assert not hugetlb_l1.l1_check_pid(p.pid, 1).ok and "cannot read" in hugetlb_l1.l1_check_pid(p.pid, 1).text


def run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    prelude = f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import hugetlb_l1\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip


def free_hugepages() -> int:
    return int(Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages").read_text())


def test_lmcaches_hugepage_l1_is_mapped_from_the_hugetlb_pool_or_fails_never_ordinary_memory(tmp_path):
    """LMCache's own L1 allocation with use_hugepages (as `lmcache server --l1-use-hugepages` and `lmcache bench
    l2` make it): after install() it is a MAP_HUGETLB mapping, seen in smaps and reported to HUGETLB_L1_REPORT, or,
    with the pool empty (it is not grown here: the pool is the machine's), LMCache's "mmap failed" error; before,
    LMCache 0.5.6 without CUDA warned and gave ordinary 4 KiB pages."""
    import os

    report = tmp_path / "l1.jsonl"
    r = run(
        """
        import os, warnings
        print(hugetlb_l1.install())
        from lmcache.v1.memory_management import _allocate_cpu_memory, _free_cpu_memory
        warnings.simplefilter("error", RuntimeWarning)  # LMCache's fallback warns, then gives ordinary memory
        try:
            t = _allocate_cpu_memory(3 << 20, use_hugepages=True)
        except RuntimeError as e:
            print("refused:", e)
        else:
            print("check:", hugetlb_l1.l1_check_pid(os.getpid(), 4 << 20))
            _free_cpu_memory(t, 3 << 20, use_hugepages=True)
            print("freed:", hugetlb_l1._mapped == {})
        """,
        {**os.environ, hugetlb_l1.REPORT_ENV: str(report)},
    )
    assert r.returncode == 0, r.stderr
    assert "LMCache 0.5.6: CpuDeviceOps's hugepage allocation replaced by mmap(MAP_HUGETLB)" in r.stdout, r.stdout
    if "refused:" in r.stdout:  # no free 2 MiB pages on this machine now
        assert "refused: mmap failed: MAP_HUGETLB of 4194304 bytes (2 MiB pages)" in r.stdout, r.stdout
        assert not report.exists()
    else:
        assert "check: L1Check(ok=True, text='L1 on 2 MiB hugetlb pages" in r.stdout, (r.stdout, free_hugepages())
        assert "freed: True" in r.stdout
        line = json.loads(report.read_text())
        assert line["ok"] and line["bytes"] == 4 << 20


def test_an_lmcache_without_the_hooks_is_refused_not_run_on_ordinary_memory():
    """Another LMCache (0.5.4 or later) laid out otherwise: install() stops with the reason."""
    r = run(
        """
        from lmcache.v1.platform.base.device_ops import DeviceOps
        del DeviceOps.alloc_hugepage_pinned_numa_ptr
        hugetlb_l1.install()
        """
    )
    assert r.returncode == 1 and "allocates its L1 otherwise than 0.5.6" in r.stderr, r.stderr
    assert "alloc_hugepage_pinned_numa_ptr" in r.stderr and "refusing to run it" in r.stderr
