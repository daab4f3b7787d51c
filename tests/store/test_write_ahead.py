# SPDX-License-Identifier: Apache-2.0
"""A disk store's copy and CRC off the write's path: put_each prepares item i+1 (fill or copy, and CRC) while
item i's write is in flight, then waits for it and settles it as before (session 37, brief aio37).

Builds tests/cpp/write_ahead_test.cc with the store and the fault device (a DeferredWriteDevice: each submitted
write held until its wait) and runs it: the order of fills and waits, staged copies made before the write ahead of
them was waited for, and every outcome when the write in flight fails, the next item's fill throws (its own
exception, std::bad_alloc), or the next item is refused or its source fails; then on a card image in tmp_path
(Linux AIO where tmp_path is a disk) (see the .cc file).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from tests.support import cpp, process_group

# Fails io_setup as a kernel without AIO, or a seccomp profile without it, does (ENOSYS); every other syscall()
# goes to libc's. The store makes its AIO context through syscall(SYS_io_setup, ...).
IO_SETUP_REFUSED = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_io_setup) {
    errno = ENOSYS;
    return -1;
  }
  long (*real)(long, ...) = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
"""


def test_next_store_prepared_while_a_write_is_in_flight(tmp_path, monkeypatch):
    binary = cpp.build("write_ahead_test", tmp_path)
    out = cpp.run(binary, str(tmp_path / "card.img"), timeout=300)
    assert "writes_overlapped" in out, out[-2000:]
    # The card's synchronous writer (what a failed io_setup falls back to): the same stores, none overlapped.
    monkeypatch.setenv("ADP_CARD_AIO", "0")
    cpp.run(binary, str(tmp_path / "card.img"), timeout=300)


def test_refused_io_setup_falls_back_to_synchronous_writes(tmp_path):
    """Where io_setup is refused (a seccomp profile or a kernel without AIO: ENOSYS here, through a preloaded
    syscall() that refuses it), the card's stores are written synchronously: all acknowledged, whole and on the card
    after a reopen, none overlapped, and the fallback named in one WARNING."""
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    assert cc, "this test needs a C compiler (set CC)"
    shim = tmp_path / "io_setup_refused.so"
    (tmp_path / "io_setup_refused.c").write_text(IO_SETUP_REFUSED)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(shim), str(tmp_path / "io_setup_refused.c"), "-ldl"], check=True
    )
    binary = cpp.build("write_ahead_test", tmp_path)
    env = {**os.environ, "LD_PRELOAD": str(shim), "WRITE_AHEAD_TEST_SYNC": "1", "ADP_LOG_LEVEL": "WARNING"}
    env.pop("ADP_CARD_AIO", None)
    proc = process_group.run([str(binary), str(tmp_path / "card.img")], timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "write_ahead_test: PASS" in proc.stdout, out[-3000:]
    warnings = [line for line in out.splitlines() if "io_setup failed" in line]
    assert len(warnings) == 1, out[-3000:]
    assert "Function not implemented" in warnings[0] and "stores write synchronously" in warnings[0], warnings
