# SPDX-License-Identifier: Apache-2.0
"""ProcessMemory (src_cpp/protocol/process_memory.h) on three threads at once while the client's
threads exit under it, its main thread first, then each thread named instead (review r7 B2): every
transfer reads the client's bytes while a thread of it lives, no descriptor leaks or is closed twice.

Builds tests/cpp/process_memory_test.cc and runs it (under TSan too: tests/sanitizers/test_sanitizers.py)."""

from __future__ import annotations

import os

import pytest

from tests.support import cpp


def pidfd_thread_supported() -> None:
    try:  # the gateway holds the thread it names instead by a PIDFD_THREAD pidfd
        os.close(os.pidfd_open(os.getpid(), os.O_EXCL))
    except OSError as e:
        pytest.fail(f"this test needs Linux 6.9+ (pidfd_open with PIDFD_THREAD): {e}")


def test_process_memory_on_three_threads_while_the_client_threads_exit(tmp_path):
    pidfd_thread_supported()
    binary = cpp.build("process_memory_test", tmp_path, ("util",), ("protocol/process_memory.cc",))
    cpp.run(binary, timeout=120)
