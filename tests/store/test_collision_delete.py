# SPDX-License-Identifier: Apache-2.0
"""A delete is exact: a key forged to share another key's 64-bit hash_key does not delete that key's object. Another
index hash (the forged key as a client can craft it) is NotFound from memory (no read of the card); the same index hash
(the residual case, the hash narrowed to 16 bits to make one) reads the object's header block, finds another key and is
NotFound with nothing written; the victim stays loadable, the counters unchanged, and it survives a restart; the
victim's own delete still works (tests/cpp/collision_delete_test.cc, directly and through the Connector)."""

from __future__ import annotations

from tests.support import cpp


def test_a_colliding_keys_delete_spares_the_other_object(tmp_path):
    binary = cpp.build("collision_delete_test", tmp_path, ("store", "util", "connector", "testing"),
                       ("transport/embedded_backend.cc",))  # fmt: skip
    cpp.run(binary, timeout=120)
