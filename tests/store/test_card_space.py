# SPDX-License-Identifier: Apache-2.0
"""A card image and its filesystem's free space (audit 12, finding 5).

A sparse image allocates its blocks as they are first written, so one larger than its filesystem's free
space starts and then fails its stores with ENOSPC once the filesystem fills; the card does not read that as
being full (by its own count it has room) and does not evict for it. So:
  - creating an image larger than the free space is refused, with the figures, before anything is made;
  - an existing image that cannot fit is warned about at open (tests/connector, tests/gateway: the WARNING);
  - a store that hits ENOSPC fails with a message that says the image's filesystem is full, and /health
    (metrics.health) names it as the reason: measured on a private 16 MiB tmpfs (a mount namespace of its
    own, `unshare --mount`), not by filling /dev/shm.
ENOSPC stays a failed store (store_failures, io_errors, healthy false while it lasts), not an eviction: the
card cannot tell which of its regions the filesystem would give back (a region evicted keeps its blocks
allocated), so evicting for it would empty the card and free nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from lmcache_adp import CardStore
from lmcache_adp.config import card_space_warning

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_an_image_larger_than_its_filesystem_is_not_created(tmp_path):
    """It was created sparse and failed its stores once the filesystem filled; now refused with the figures,
    and no file (nor directory) is left."""
    free = shutil.disk_usage(tmp_path).free
    path = tmp_path / "cards" / "big.img"
    with pytest.raises(RuntimeError) as e:
        CardStore(str(path), free + (1 << 30))
    msg = str(e.value)
    assert f"cannot create card image {path} of " in msg and "its filesystem has " in msg, msg
    assert "bytes) free; give a size that fits or make room" in msg, msg
    assert not path.exists() and not path.parent.exists()


CHILD = r"""
import json, os, sys
from lmcache_adp import CardStore
from lmcache_adp.config import card_space_warning
from lmcache_adp.metrics import health
path = sys.argv[1]
with open(path, "wb") as f:
    f.truncate(64 << 20)  # sparse, 4x the 16 MiB tmpfs (made here: creating it is refused)
s = CardStore(path, 0, durable=False)
errors, stored = [], 0
for i in range(32):
    try:
        s.put(f"k{i}", os.urandom(1 << 20))
        stored += 1
    except RuntimeError as e:
        errors.append(str(e))
st = s.stats()
print(json.dumps({"stored": stored, "errors": errors, "healthy": st["healthy"],
                  "health": health({**st, "card": path})}))
s.close()
"""


def test_a_store_on_a_full_image_filesystem_says_so():
    """A 64 MiB image on a 16 MiB tmpfs: the stores that fit are stored, every later one fails with a message
    that says the image's filesystem is full, and /health gives that as the reason."""
    assert os.geteuid() == 0, "this test needs root: it mounts a private tmpfs in a mount namespace of its own"
    unshare = shutil.which("unshare")
    assert unshare, "util-linux unshare is needed for this test (scripts/run_tests.sh installs it)"
    mnt = tempfile.mkdtemp(prefix="adp-enospc-")
    try:
        script = 'mount -t tmpfs -o size=16m tmpfs "$1" && exec "$2" -c "$3" "$1/card.img"'
        r = subprocess.run(
            [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", mnt, sys.executable, CHILD],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        os.rmdir(mnt)  # the mount went with its namespace
    assert 8 <= out["stored"] < 16 and len(out["errors"]) == 32 - out["stored"], out
    for e in out["errors"]:
        assert "No space left on device (the card image's filesystem is full" in e, e
    assert out["healthy"] is False
    reasons = out["health"]["reasons"]
    assert any(r.startswith("the card image's filesystem is full: ") and "0.06 GiB" in r for r in reasons), reasons


LOG_CHILD = r"""
import sys
from lmcache_adp import CardStore
from lmcache_adp.config import card_space_warning
s = CardStore(sys.argv[1], int(sys.argv[2]))
try:
    s.put("big", bytearray(int(sys.argv[3])))
except RuntimeError as e:
    print(e)
s.close()
"""


@pytest.mark.parametrize(
    "card_mib, object_bytes, formatted, largest, bound",
    [
        # 1 GiB: 128 regions of 7.99 MiB (was logged "7 MiB": rounded down); the bound is the format's 256 MiB
        # (was logged as "half its regions").
        (1024, (256 << 20) + 1, "128 regions of 7.99 MiB", 256 << 20, "the format's largest object, 256 MiB"),
        # 64 MiB: 63 regions of 1 MiB, the bound is half of them.
        (64, 32 << 20, "63 regions of 1.00 MiB", 32374784, "half its 63 regions of 1048576 bytes, less their headers"),
    ],
)
def test_format_and_oversize_logs_give_the_exact_figures(tmp_path, card_mib, object_bytes, formatted, largest, bound):
    """Audit 12, findings 6 and 7: the region size was logged rounded down to whole MiB, and the oversize
    line said "half its regions" also where the bound is the format's 256 MiB."""
    card = tmp_path / "card.img"
    r = subprocess.run(
        [sys.executable, "-c", LOG_CHILD, str(card), str(card_mib << 20), str(object_bytes)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ADP_LOG_LEVEL": "INFO"},
    )
    assert r.returncode == 0, r.stderr
    assert f"formatted card {card}: {formatted}" in r.stderr, r.stderr
    refused = [line for line in r.stderr.splitlines() if "refuses objects larger than" in line]
    assert len(refused) == 1, r.stderr
    assert f"larger than {largest} bytes ({bound}); got one of {object_bytes} bytes" in refused[0], refused
    assert f"holds ({largest} bytes: {bound})" in r.stdout, r.stdout


def test_the_warning_asks_the_filesystem_the_image_is_on(tmp_path):
    """A card path that is a symlink to an image elsewhere: the free space is the image's filesystem's, not
    the link's directory's (review r12 N3: a link on a roomy disk to a too-big tmpfs image was not warned
    about)."""
    shm = tempfile.mkdtemp(prefix="adp-space-", dir="/dev/shm")
    try:
        image = os.path.join(shm, "big.img")
        with open(image, "wb") as f:
            f.truncate(shutil.disk_usage(shm).total + (1 << 30))  # sparse: more than the whole tmpfs
        link = tmp_path / "card.img"
        link.symlink_to(image)
        assert shutil.disk_usage(tmp_path).free > os.path.getsize(image), "the link's filesystem must hold it"
        warning = card_space_warning(str(link))
        assert warning is not None and "but its filesystem has" in warning
    finally:
        shutil.rmtree(shm, ignore_errors=True)
