# SPDX-License-Identifier: Apache-2.0
"""A disk card's load of several keys reads the next key's object while this one's is copied (CardStore::get_each).

Builds tests/cpp/load_ahead_test.cc with the store and the fault device, and runs it: of four 256 KiB objects
loaded by one get_each, each but the last has the next one's object read inside its `pieces` (the disk gets its
next request while the copy runs on the CrcWorker), every buffer holds its object's bytes when its `pieces`
returns, and an absent, a declined and a damaged key among them are answered as get() answers them (a
damaged key twice in a row: counted once, the second not read ahead).

tests/cpp/large_load_ahead_test.cc: objects of more than a piece (read straight into aligned buffers, as LMCache's
32 MiB chunks): each key's CRC runs while the next key's object is read, so that read comes before this key's load
ends (its tail); a damaged, an absent, a declined key among them as get() answers them, the damaged one's tombstone
after the next read; in one piece and in 4 MiB pieces.
"""

from tests.support import cpp


def test_load_reads_the_next_object_during_the_copy(tmp_path):
    binary = cpp.build("load_ahead_test", tmp_path, ("store", "util", "testing"))
    cpp.run(binary, timeout=300)


def test_large_load_reads_the_next_object_during_the_crc(tmp_path):
    binary = cpp.build("large_load_ahead_test", tmp_path, ("store", "util", "testing"))
    cpp.run(binary, timeout=300)
