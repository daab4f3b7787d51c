# SPDX-License-Identifier: Apache-2.0
"""The card-image fuzzer (tests/cpp/card_fuzz_test.cc): a small card filled by a workload (objects of 3 KB to
1.5 MiB, some spanning regions, keys stored again and deleted, evictions), then, seed by seed, a copy of its image
damaged (flipped bytes, zeroed or garbage blocks, a cut tail, blocks that cannot be read or written, a tombstone's
write lost) and opened read-only and read-write, verified, every key loaded, stores made, and the card reopened.
No crash, hang or exception; an open refused only for both copies of the superblock damaged (block 0 and its
backup, session 39) or the size; a load a miss or exactly the bytes the format can promise (docs/testing.md, "The card-image fuzzer").

The suite runs a fixed range of seeds (a few seconds); ADP_CARD_FUZZ_SEEDS=FIRST:COUNT runs another range by
hand (about 20 ms of CPU a seed on this VM), e.g. `ADP_CARD_FUZZ_SEEDS=0:20000 pytest tests/store/test_card_fuzz.py`."""

from __future__ import annotations

import os
import re

from tests.support import cpp

SUITE_SEEDS = "0:300"


def seeds() -> str:
    """The seed range to run: ADP_CARD_FUZZ_SEEDS if set (FIRST:COUNT), else the suite's."""
    wanted = os.environ.get("ADP_CARD_FUZZ_SEEDS", SUITE_SEEDS)
    assert re.fullmatch(r"\d+:\d+", wanted), f"ADP_CARD_FUZZ_SEEDS is FIRST:COUNT, not {wanted!r}"
    return wanted


def test_damaged_cards_never_crash_the_store_nor_serve_wrong_bytes(tmp_path):
    first, count = map(int, seeds().split(":"))
    out = cpp.run(cpp.build("card_fuzz_test", tmp_path), f"seeds={first}:{count}", timeout=max(300, count))
    summary = re.search(r"card_fuzz_test: seeds (\d+) to (\d+): (\d+) opens refused, (\d+) loads served", out)
    assert summary, out[-3000:]
    assert (int(summary[1]), int(summary[2])) == (first, first + count - 1), summary[0]
    # The damage reached what it aimed at: over a hundred seeds, some opens refused (both superblock copies or the
    # size damaged), and loads served.
    assert int(summary[3]) < count and int(summary[4]) > 0, summary[0]
    assert count < 100 or int(summary[3]) > 0, summary[0]
