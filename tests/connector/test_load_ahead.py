# SPDX-License-Identifier: Apache-2.0
"""A disk card's load of several keys reads the next key's object while this one's is copied (CardStore::get_each).

Builds tests/cpp/load_ahead_test.cc with the store and the fault device, and runs it: of four 256 KiB objects
loaded by one get_each, each but the last has the next one's object read inside its `pieces` (the disk gets its
next request while the copy runs on the CrcWorker), every buffer holds its object's bytes when its `pieces`
returns, and an absent, a declined and a damaged key among them are answered as get() answers them (a
damaged key twice in a row: counted once, the second not read ahead).
"""

from tests.support import cpp


def test_load_reads_the_next_object_during_the_copy(tmp_path):
    binary = cpp.build("load_ahead_test", tmp_path, ("store", "util", "testing"))
    cpp.run(binary, timeout=300)
