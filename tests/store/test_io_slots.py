# SPDX-License-Identifier: Apache-2.0
"""The card's I/O slots (CardDevice::set_io_depth, src_cpp/util/io_slots.h): a read gives its slot back without a
futex wake when no thread waits for one, and the depth still bounds the reads in flight.

Builds tests/cpp/io_slots_test.cc, which interposes libc's syscall() and preadv: 200 reads of one thread at depth 1
make no FUTEX_WAKE (std::counting_semaphore, before load36, made one a read: 200), and four threads' reads at depth
2 are never more than 2 in flight, all four done.
"""

from tests.support import cpp


def test_a_read_gives_its_slot_back_without_a_wake_up(tmp_path):
    binary = cpp.build("io_slots_test", tmp_path, ("store", "util", "testing"))
    cpp.run(binary, str(tmp_path), timeout=120)
