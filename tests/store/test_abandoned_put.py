# SPDX-License-Identifier: Apache-2.0
"""An abandoned store does not delete the older copy of its key on restart.

Builds tests/cpp/abandoned_put_test.cc with the store and runs it on a card
image in tmp_path: store k, store k again with the caller gone (still_wanted()
false, as after a deadline), close, reopen twice; k must keep its first copy.
"""

from __future__ import annotations

from tests.support import cpp


def test_abandoned_store_keeps_older_copy_across_restart(tmp_path):
    binary = cpp.build("abandoned_put_test", tmp_path, dirs=("store", "util"))
    cpp.run(binary, str(tmp_path / "card.img"), timeout=120)
