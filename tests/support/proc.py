# SPDX-License-Identifier: Apache-2.0
"""What /proc tells of another process, for tests that measure the gateway from outside."""

from __future__ import annotations

import os


def status_bytes(pid: int, field: str) -> int:
    """A /proc/PID/status field in kB (VmRSS, VmSize), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    raise AssertionError(f"no {field}")


def thread_cpu_seconds(pid: int, name: str) -> float:
    """CPU time (user + system) of the threads of pid whose name starts with `name`."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except FileNotFoundError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        if comm.startswith(name):
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")
