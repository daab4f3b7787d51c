# SPDX-License-Identifier: Apache-2.0
"""A store of a key forged to share another key's 64-bit hash_key leaves that key's object alone: both load their
own bytes, survive a reopen, a delete of one leaves the other (after a reopen too: a tombstone names its key), a
re-store supersedes only the same key's copy, and evicting one's region removes only it
(tests/cpp/collision_store_test.cc). Until session 21 the forged store took the victim's index entry."""

from __future__ import annotations

from tests.support import cpp


def test_a_colliding_keys_store_spares_the_other_object(tmp_path):
    binary = cpp.build("collision_store_test", tmp_path, ("store", "util", "testing"))
    cpp.run(binary, timeout=120)
