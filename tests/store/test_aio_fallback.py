# SPDX-License-Identifier: Apache-2.0
"""A disk card's Linux AIO writer where the kernel refuses part of it (review37b of aio37): tests/cpp/aio_fallback_test.cc
installs its own seccomp filter, making io_setup, io_submit or io_getevents fail, then stores and loads on a card
image in tmp_path (see the .cc file).

- io_setup fails: the synchronous writer, every store whole, none counted in writes_overlapped.
- io_submit fails: each write made in submit(); none counted overlapped (aio37 counted K-1 of K: the write before
  was done, not in flight). With one I/O slot and each allocation of the first put failing in turn (K from 0 until
  none throws): every later store and load completes (aio37 kept the slot where the io_submit failure's log line
  threw std::bad_alloc, and the next I/O waited for good), and each item is reported Ok only if it loads back.
- io_getevents fails: that store fails (its outcome unknown); the writer's AIO context is destroyed (io_destroy
  waits for the write the kernel may still be making) and its later writes are synchronous, whole (aio37 failed
  every later store too, each write submitted and never reaped).
- fork: a child forked after the parent's stores writes through the parent's writer, whose AIO context is the
  parent's (io_submit there fails EINVAL): no io_submit in the child, none counted overlapped, one WARNING naming the
  fork, every store acknowledged and whole after a reopen (debt38: aio37 tried io_submit on each write of the child).
"""

from __future__ import annotations

import pytest

from tests.support import cpp


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    return cpp.build("aio_fallback_test", tmp_path_factory.mktemp("aio_fallback"))


@pytest.mark.parametrize("mode", ["setup", "submit", "getevents"])
def test_aio_syscall_refused(binary, mode, tmp_path):
    cpp.run(binary, mode, str(tmp_path / "card.img"), timeout=120)


def test_forked_child_writes_synchronously(binary, tmp_path):
    out = cpp.run(binary, "fork", str(tmp_path / "card.img"), timeout=120)
    assert "skipped" in out or "the child's io_submit calls 0," in out, out[-3000:]


def test_failed_submit_under_allocation_failures(binary, tmp_path):
    for k in range(200):
        out = cpp.run(binary, "submit", str(tmp_path / "card.img"), str(k), timeout=120)
        if "no throw" in out:
            break
    else:
        pytest.fail("the first put made 200 allocations or more")
    assert k > 10, f"only {k} allocations in the first put"
