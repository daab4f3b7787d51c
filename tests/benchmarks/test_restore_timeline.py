# SPDX-License-Identifier: Apache-2.0
"""benchmarks/restore_timeline.py: the milestones of one prefetch read from a made-up strace and perf log of the
same batch (two reading threads, one CRC, the completion's eventfd chain), each figure worked out by hand."""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import restore_timeline  # noqa: E402

THREADS = "500 lmcache\n101 adp-worker-0\n102 adp-twin-0\n201 adp-crc\n301 lmcache\n302 lmcache\n"
ONE = '"\\1\\0\\0\\0\\0\\0\\0\\0", 8'
OBJ = 33558528  # 32 MiB + a 4 KiB header block

# Thread 101 wakes at 2.000, reads 2.0001-2.1001 and 2.1011-2.2011; 102 wakes at 2.001 and reads 2.002-2.152 (its
# read unfinished, then resumed); the CRC thread runs 2.1005-2.1045; 101 completes the future at 2.203, the demux
# (301) reads it, writes the load eventfd, 302 reads that at 2.2034.
STRACE = f"""\
101 00:00:01.000000 futex(0x10, FUTEX_WAIT_PRIVATE, 0, NULL <unfinished ...>
102 00:00:01.000000 futex(0x10, FUTEX_WAIT_PRIVATE, 0, NULL <unfinished ...>
201 00:00:01.000000 futex(0x20, FUTEX_WAIT_PRIVATE, 0, NULL <unfinished ...>
101 00:00:02.000000 <... futex resumed>) = 0 <1.000000>
102 00:00:02.001000 <... futex resumed>) = 0 <1.001000>
101 00:00:02.000100 preadv(6, [{{iov_base="ADP", iov_len=4096}}], 2, 4096) = {OBJ} <0.100000>
102 00:00:02.002000 preadv(6,  <unfinished ...>
201 00:00:02.100500 <... futex resumed>) = 0 <1.100500>
101 00:00:02.101100 preadv(6, [{{iov_base="ADP", iov_len=4096}}], 2, 0) = {OBJ} <0.100000>
201 00:00:02.104500 futex(0x20, FUTEX_WAIT_PRIVATE, 0, NULL <unfinished ...>
102 00:00:02.152000 <... preadv resumed>[{{iov_base="ADP", iov_len=4096}}], 2, 8192) = {OBJ} <0.150000>
101 00:00:02.203000 write(7, {ONE}) = 8 <0.000010>
301 00:00:02.203100 read(7, {ONE}) = 8 <0.000010>
301 00:00:02.203200 write(10, {ONE}) = 8 <0.000010>
302 00:00:02.203400 read(10, {ONE}) = 8 <0.000010>
201 00:00:02.300000 <... futex resumed>) = 0 <0.195500>
"""


def perf_line(comm: str, tid: int, t: float, event: str, trace: str) -> str:
    return f"{comm:>16} {500 if tid else 0}/{tid} {t:.6f}: {event}: {trace}\n"


def switch(t: float, prev: tuple[str, int, str], nxt: tuple[str, int]) -> str:
    return perf_line(
        prev[0], prev[1], t, "sched:sched_switch",
        f"prev_comm={prev[0]} prev_pid={prev[1]} prev_prio=120 prev_state={prev[2]} ==> "
        f"next_comm={nxt[0]} next_pid={nxt[1]} next_prio=120",
    )  # fmt: skip


def syscall(comm: str, tid: int, t0: float, t1: float, name: str, fd: int, ret: int) -> str:
    return perf_line(comm, tid, t0, f"syscalls:sys_enter_{name}", f"fd: 0x{fd:08x}, vec: 0x7f, vlen: 0x2") + perf_line(
        comm, tid, t1, f" syscalls:sys_exit_{name}", hex(ret)
    )


# The same batch as perf writes it: the readers switched in at 2.000 and 2.001; the CRC thread woken at 2.1000,
# on a CPU at 2.1005 (0.5 ms later), preempted at 2.1020 (runnable), back at 2.1030, asleep at 2.1050 (3.5 ms of
# CPU). Another process's line (pid 900) is left out.
PERF = "".join(
    sorted(
        [
            switch(2.000, ("swapper/0", 0, "R"), ("adp-worker-0", 101)),
            switch(2.001, ("swapper/1", 0, "R"), ("adp-twin-0", 102)),
            syscall("adp-worker-0", 101, 2.0001, 2.1001, "preadv", 6, OBJ),
            syscall("adp-twin-0", 102, 2.002, 2.152, "preadv", 6, OBJ),
            perf_line(
                "adp-worker-0", 101, 2.1000, "sched:sched_wakeup", "comm=adp-crc pid=201 prio=120 target_cpu=000"
            ),
            switch(2.1005, ("swapper/0", 0, "R"), ("adp-crc", 201)),
            switch(2.1020, ("adp-crc", 201, "R+"), ("other", 77)),
            switch(2.1030, ("other", 77, "S"), ("adp-crc", 201)),
            switch(2.1050, ("adp-crc", 201, "S"), ("swapper/0", 0)),
            syscall("adp-worker-0", 101, 2.1011, 2.2011, "preadv", 6, OBJ),
            syscall("adp-worker-0", 101, 2.203, 2.20301, "write", 7, 8),
            syscall("lmcache", 301, 2.2031, 2.20311, "read", 7, 8),
            syscall("lmcache", 301, 2.2032, 2.20321, "write", 10, 8),
            syscall("lmcache", 302, 2.2034, 2.20341, "read", 10, 8),
            "           fio  900/901 2.050000: syscalls:sys_enter_read: fd: 0x00000003\n",
            "           fio  900/901 2.090000:  syscalls:sys_exit_read: 0x2000000\n",
        ],
        key=lambda line: float(line.split()[2].rstrip(":")),
    )
)


@pytest.mark.parametrize("gz", [False, True], ids=["text", "gzipped"])
@pytest.mark.parametrize("kind", ["strace", "perf"])
def test_the_milestones_of_one_batch(tmp_path, kind, gz):
    log = tmp_path / f"{kind}-adp-r1-l2-1.txt"
    (tmp_path / f"{log.name}.threads").write_text(THREADS)
    text = STRACE if kind == "strace" else PERF
    if gz:  # as kept under benchmarks/results/raw, the names' file beside it not gzipped
        log = log.with_name(log.name + ".gz")
        log.write_bytes(gzip.compress(text.encode()))
    else:
        log.write_text(text)
    r = restore_timeline.timeline(log, 1 << 20, objects=True)
    assert r["reads"] == 3 and r["threads"] == 2
    assert [round(x["start_ms"], 3) for x in r["rows"]] == [0.1, 2.0, 101.1]
    assert [round(x["end_ms"], 3) for x in r["rows"]] == [100.1, 152.0, 201.1]
    assert [x["thread"] for x in r["rows"]] == ["adp-worker-0", "adp-twin-0", "adp-worker-0"]
    # Idle before each read: 101 0.1 ms after its wake-up and 1.0 ms between its reads; 102 1.0 ms after its own.
    assert [round(x["idle_before_ms"], 3) for x in r["rows"]] == [0.1, 1.0, 1.0]
    assert r["thread_last_read_ends_ms"] == pytest.approx([152.0, 201.1])
    # In flight: 1 for 1.9 ms, 2 for 98.1, 1 for 1.0, 2 for 50.9, 1 for 49.1; over 201.0 ms.
    assert r["mean_in_flight"] == pytest.approx((1.9 + 2 * 98.1 + 1.0 + 2 * 50.9 + 49.1) / 201.0)
    assert r["disk_idle_ms"] == pytest.approx(0.0)
    assert [(w, round(a, 3)) for w, a, _ in r["chain"]] == [
        ("plugin's eventfd write (future completed)", 203.0),
        ("LMCache's demux reads it", 203.1),
        ("demux writes the load eventfd", 203.2),
        ("LMCache reads the load eventfd (future seen)", 203.4),
    ]
    assert r["crc_n"] == 1
    if kind == "strace":
        assert r["crc_ms_sum"] == pytest.approx(4.0)
        assert r["cpu_wait"] == {}
    else:
        assert r["crc_ms_sum"] == pytest.approx(4.5)  # switch-in to asleep, the preemption inside
        assert r["cpu_wait"]["crc"]["n"] == 1 and r["cpu_wait"]["crc"]["sum_ms"] == pytest.approx(0.5)
    cells = [c.strip() for c in restore_timeline.table([r]).splitlines()[-1].strip("|").split("|")]
    # 3 x (32 MiB + 4 KiB) in 201.0 ms: 0.47 GiB/s; the tail 201.1 - 152.0 = 49.1 ms, the last end 24.55 ms past the
    # mean of the threads' ends (176.55); threads idle 2.1 ms.
    assert cells[0] == log.name
    assert [float(c) for c in cells[1:10]] == pytest.approx([0.1, 201.1, 203.0, 203.4, 1.74, 0.47, 49.1, 24.55, 2.1],
                                                            abs=0.051)  # fmt: skip
    assert cells[10] == ("-" if kind == "strace" else "0.5 (0.5)")


def test_bench_restore_keeps_the_servers_perf_lines_and_the_scheduler_events_naming_its_threads(tmp_path):
    pytest.importorskip("lmcache")
    import bench_restore

    others = (  # another process's threads only
        "             fio 900/901 2.050000: sched:sched_switch: prev_comm=fio prev_pid=901 prev_prio=120 "
        "prev_state=S ==> next_comm=kworker/0:1 next_pid=33 next_prio=120\n"
    )
    kept = bench_restore.server_lines(PERF + others, 500)
    assert "fio" not in kept and "kworker" not in kept
    assert kept.count("sched:sched_switch") == PERF.count("sched:sched_switch")  # each names a server thread
    assert kept.count("sched:sched_wakeup") == 1 and kept.count("syscalls:") == PERF.count("syscalls:") - 2
    full, cut = tmp_path / "perf-a.txt", tmp_path / "perf-b.txt"
    full.write_text(PERF + others)
    cut.write_text(kept)
    for log in (full, cut):
        Path(str(log) + ".threads").write_text(THREADS)
    a, b = (restore_timeline.timeline(log, 1 << 20, objects=True) for log in (full, cut))
    assert {**a, "log": ""} == {**b, "log": ""}
