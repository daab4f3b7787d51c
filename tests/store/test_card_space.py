# SPDX-License-Identifier: Apache-2.0
"""A card image and its filesystem's free space (audit 12, finding 5).

A sparse image allocates its blocks as they are first written, so one larger than its filesystem's free
space starts and then fails its stores with ENOSPC once the filesystem fills; the card does not read that as
being full (by its own count it has room) and does not evict for it. So:
  - creating an image larger than the free space is refused, with the figures, before anything is made;
  - an existing image that cannot fit is warned about at open (tests/connector, tests/gateway: the WARNING);
  - several images that each fit alone, not together, are warned about (those beside each other in a directory);
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
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from lmcache_adp import CardStore
from lmcache_adp._native import card_space_warning

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


def in_private_tmpfs(size_mib: int, child: str) -> tuple[str, dict]:
    """Runs the Python `child` with a tmpfs of size_mib mounted at its argv[1], in a mount namespace of its own
    (the mount goes with it): (that mount point, the JSON of the child's last line)."""
    assert os.geteuid() == 0, "this test needs root: it mounts a private tmpfs in a mount namespace of its own"
    unshare = shutil.which("unshare")
    assert unshare, "util-linux unshare is needed for this test (scripts/run_tests.sh installs it)"
    mnt = tempfile.mkdtemp(prefix="adp-space-tmpfs-")
    try:
        script = f'mount -t tmpfs -o size={size_mib}m tmpfs "$1" && exec "$2" -c "$3" "$1"'
        r = subprocess.run(
            [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", mnt, sys.executable, child],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        return mnt, json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        os.rmdir(mnt)  # the mount went with its namespace


CHILD = r"""
import json, os, sys
from lmcache_adp import CardStore
from lmcache_adp.metrics import health
path = sys.argv[1] + "/card.img"
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
print(json.dumps({"path": path, "stored": stored, "errors": errors, "healthy": st["healthy"],
                  "health": health({**st, "card": path})}))
s.close()
"""


def test_a_store_on_a_full_image_filesystem_says_so():
    """A 64 MiB image on a 16 MiB tmpfs: the stores that fit are stored, every later one fails with a message
    that says the image's filesystem is full, and /health gives that as the reason."""
    _, out = in_private_tmpfs(16, CHILD)
    assert 8 <= out["stored"] < 16 and len(out["errors"]) == 32 - out["stored"], out
    for e in out["errors"]:
        assert "No space left on device (the card image's filesystem is full" in e, e
    assert out["healthy"] is False
    reasons = out["health"]["reasons"]
    # In MiB below 1 GiB, as the WARNING at start: this read "is 0.06 GiB, 0.02 GiB of it written, 0.00 GiB free"
    # (audit 14).
    assert any(
        r.startswith(f"the card image's filesystem is full: {out['path']} is 64.00 MiB, ")
        and re.search(r" MiB of it written, \d+\.\d\d MiB free on its filesystem", r)
        for r in reasons
    ), reasons


SMALL_CHILD = r"""
import json, sys
from lmcache_adp import CardStore
from lmcache_adp._native import card_space_warning
d = sys.argv[1]
out = {}
try:
    CardStore(d + "/new.img", 64 << 20)  # 4x the tmpfs: refused
except RuntimeError as e:
    out["refused"] = str(e)
with open(d + "/old.img", "wb") as f:
    f.truncate(64 << 20)  # an existing sparse image as large: warned about
out["warning"] = card_space_warning(d + "/old.img")
print(json.dumps(out))
"""


def test_space_messages_of_a_small_card_give_mib():
    """The refusal to create an image larger than its filesystem and the WARNING about an existing one gave
    "0.06 GiB" and "0.02 GiB" for a 64 MiB image on a 16 MiB tmpfs (review r14: the other card lines give MiB
    below 1 GiB, util/amount.h's log_amount)."""
    mnt, out = in_private_tmpfs(16, SMALL_CHILD)
    refused, warning = out["refused"], out["warning"]
    assert f"cannot create card image {mnt}/new.img of 64.00 MiB (67108864 bytes): its filesystem has " in refused
    assert re.search(r"its filesystem has 1?\d\.\d\d MiB \(\d+ bytes\) free", refused), refused
    assert f"card image {mnt}/old.img is 64.00 MiB (sparse: 0.00 MiB written) but its filesystem has " in warning
    assert re.search(r"its filesystem has 1?\d\.\d\d MiB free", warning), warning
    assert "GiB" not in refused and "GiB" not in warning, (refused, warning)


READ_ONLY_CHILD = r"""
import json, os, subprocess, sys
from lmcache_adp import CardStore
d = sys.argv[1]
with open(d + "/filler", "wb") as f:  # the tmpfs full: it reports 0 free, as a squashfs or ISO image does
    try:
        while True:
            f.write(b"x" * (1 << 20))
            f.flush()
    except OSError:
        pass
subprocess.run(["mount", "-o", "remount,ro", d], check=True)
st = os.statvfs(d)
out = {"free": st.f_bavail, "read_only": bool(st.f_flag & os.ST_RDONLY)}
try:
    CardStore(d + "/cards/new.img", 1 << 20)
except RuntimeError as e:
    out["refused"] = str(e)
print(json.dumps(out))
"""


def test_an_image_on_a_read_only_filesystem_is_refused_as_that():
    """Audit 15 item 11: an image to be made on a read-only filesystem that reports no free space (a squashfs or ISO
    image; here a full private tmpfs remounted read-only) was refused as "its filesystem has 0.00 MiB (0 bytes)
    free"; the reason is that nothing can be made there."""
    mnt, out = in_private_tmpfs(4, READ_ONLY_CHILD)
    assert out["free"] == 0 and out["read_only"], out
    assert out["refused"] == f"cannot create card image {mnt}/cards/new.img: {mnt} is on a read-only filesystem", out


UNLIMITED_CHILD = r"""
import json, sys
from lmcache_adp import CardStore
from lmcache_adp._native import card_space_warning
s = CardStore(sys.argv[1] + "/new.img", 64 << 20)
s.put("k", b"v" * 4096)
print(json.dumps({"got": bytes(s.get("k")).decode()[:1], "warning": card_space_warning(sys.argv[1] + "/new.img")}))
s.close()
"""


def test_a_filesystem_that_reports_no_size_is_not_read_as_full(tmp_path):
    """Audit 15 item 11: a filesystem that reports no blocks at all (f_blocks 0: sysfs, procfs, a tmpfs of size=0,
    which has no limit) reports 0 free too, and a card to be made there was refused as "0.00 GiB (0 bytes) free".
    Now no rule on space applies there: on sysfs making the directory gives the real reason, and on a tmpfs of no
    limit the image is made and used, with no WARNING about its space."""
    assert os.statvfs("/sys").f_blocks == 0, "sysfs reports blocks here"
    with pytest.raises(RuntimeError) as e:
        CardStore("/sys/adp-test-nope/card.img", 1 << 20)
    # The card named too (review33c C5: "cannot create directory /proc/nope: ..." named neither it nor the key).
    assert str(e.value).startswith(
        "cannot create directory /sys/adp-test-nope for card image /sys/adp-test-nope/card.img: "
    ), e.value
    _, out = in_private_tmpfs(0, UNLIMITED_CHILD)
    assert out == {"got": "v", "warning": None}, out


LOG_CHILD = r"""
import sys
from lmcache_adp import CardStore
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
    """Audit 12, findings 6 and 7 (and audit 13: the open's line): the region size was logged rounded down to whole MiB, and the oversize
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
    # The open's line gave the same regions rounded down ("128 regions of 7 MiB") after 13edeb8 (audit 13).
    opened = [line for line in r.stderr.splitlines() if f"opened card {card}: " in line]
    assert len(opened) == 1 and f", {formatted}) in " in opened[0], r.stderr
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


TOGETHER_CHILD = r"""
import json, logging, os, shutil, sys
from lmcache_adp import ADPConnector
from lmcache_adp._native import card_space_warning
d = sys.argv[1]
records = []
handler = logging.Handler()
handler.emit = records.append  # the package's logger does not propagate: listen on it
logging.getLogger("lmcache_adp").addHandler(handler)
a, b = f"{d}/a.img", f"{d}/b.img"
size_gb = round(shutil.disk_usage(d).free * 0.55 / (1 << 30), 2)
first = ADPConnector(card=a, card_size_gb=size_gb, num_workers=1)
second = ADPConnector(card=b, card_size_gb=size_gb, num_workers=1)  # fits alone: created, not refused
out = {"size_gb": size_gb, "warned": [r.getMessage() for r in records if r.levelno >= logging.WARNING]}
out["a_with_b"] = card_space_warning(a)
second.close()
os.unlink(b)
out["a_alone"] = card_space_warning(a)
with open(b, "wb") as f:
    f.truncate(int(size_gb * (1 << 30)))  # as large and sparse, but not a card image: not counted
out["a_beside_a_file"] = card_space_warning(a)
first.close()
print(json.dumps(out))
"""


def test_images_that_fit_alone_but_not_together_are_warned_about():
    """Two sparse images created back to back on one tmpfs, each 55% of its free space: each passed the creation
    check (the first had written only its superblock) and nothing was said; once both filled, the tmpfs would be
    full and every store of both fail. Now the second's start logs a WARNING naming the first and the figures,
    and the first, looked at again, names the second. A file beside them that is not a card image, or a card
    image alone, is not counted. Nothing is written: the images stay sparse. On a private 4 GiB tmpfs (its free
    space is this test's alone: on /dev/shm, another run's images written between the free-space read and the
    second creation could refuse it, review r14b N4; the sizes stay in GiB, as the messages give them)."""
    mnt, out = in_private_tmpfs(4096, TOGETHER_CHILD)
    a, b, size_gb, warned = f"{mnt}/a.img", f"{mnt}/b.img", out["size_gb"], out["warned"]
    assert size_gb == 2.2, out
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"card image {b} can still grow by {size_gb:.2f} GiB (its size less"), warned
    assert (
        f" and 1 other card image beside it by {size_gb:.2f} GiB ({a} {size_gb:.2f} GiB): together more " in warned[0]
    ), warned
    assert "its filesystem has free; each fits alone, not all together" in warned[0], warned
    assert "stores of every card there fail with 'No space left on device'" in warned[0], warned
    assert f"({b} {size_gb:.2f} GiB)" in (out["a_with_b"] or ""), out
    assert out["a_alone"] is None, out  # alone, it fits
    assert out["a_beside_a_file"] is None, out


# A 48 MiB image a that wrote about 24 MiB, and b's path beside it (the children below).
A_GROWN_BY_24_MIB = r"""
import json, os, sys
from lmcache_adp import CardStore
from lmcache_adp._native import card_image_space, card_space_warning
d = sys.argv[1]
a, b = f"{d}/a.img", f"{d}/b.img"
first = CardStore(a, 48 << 20, durable=False)
for i in range(24):
    first.put(f"k{i}", os.urandom(1 << 20))  # about 24 MiB written: a can still grow by about 24 MiB
"""

GROWN_CHILD = (
    A_GROWN_BY_24_MIB
    + r"""
out = {"a": card_image_space(a)}
CardStore(b, 16 << 20).close()  # 24 + 16 fit the ~56 MiB free (a's size, 48 + 16, would not)
out["small"], out["free_small"] = card_space_warning(b), card_image_space(b)[2]
os.unlink(b)
CardStore(b, 40 << 20).close()  # alone, 40 fit; with a's 24, not
out["big"], out["free_big"] = card_space_warning(b), card_image_space(b)[2]
first.close()
print(json.dumps(out))
"""
)


def test_the_images_beside_count_what_they_can_still_grow_by():
    """On a private 80 MiB tmpfs, a 48 MiB image that has written about 24 MiB: a second image counts against
    the free space with what the first can still grow by (about 24 MiB), not its size. A 16 MiB second image is
    not warned about (24 + 16 fit the ~56 MiB free; 48 + 16 would not), a 40 MiB one is (24 + 40 do not), though
    each is created: alone each fits."""
    mnt, out = in_private_tmpfs(80, GROWN_CHILD)
    size, allocated, free = out["a"]
    assert size == 48 << 20 and 24 << 20 <= allocated < 26 << 20 and 54 << 20 < free < 57 << 20, out
    assert out["small"] is None, out
    big = out["big"]
    # 40 MiB less its format's two blocks (block 0 and, since session 39, the backup superblock): 39.99 MiB.
    assert big is not None and big.startswith(f"card image {mnt}/b.img can still grow by 39.99 MiB (its size"), big
    grows = (size - allocated) / (1 << 20)
    assert f" and 1 other card image beside it by {grows:.2f} MiB ({mnt}/a.img {grows:.2f} MiB): together more " in (
        big
    ), big
    assert f"than the {out['free_big'] / (1 << 20):.2f} MiB its filesystem has free" in big, big


THROUGH_BACKUP_CHILD = (
    A_GROWN_BY_24_MIB
    + r"""
first.close()
out = {}
CardStore(b, 40 << 20).close()  # alone, 40 fit; with a's 24, not
for name, block0 in (
    ("whole", None),
    ("blank", bytes(4096)),  # block 0 zeroed: the card opens with its backup
    ("torn", b"ADPCARD" + bytes(4089)),  # a write of block 0 torn inside the magic, over zeros
    ("foreign", b"\x55\xaa" * 2048),  # another program's bytes: every open refuses it (fd39)
):
    if block0 is not None:
        with open(a, "r+b") as f:
            f.write(block0)
    out[name] = card_space_warning(b)
print(json.dumps(out))
"""
)


def test_a_card_that_opens_through_its_backup_counts_as_a_card_image_beside():
    """sbfix40 (review39b): the free-space look counted an image as a card only where block 0 began with the
    superblock's magic; one whose block 0 is blank or torn beside a valid backup superblock (at 1 MiB - 4 KiB), which
    every open opens through the backup, was not counted, and what it can still grow by went unwarned. Now it is
    counted as the open would open it; block 0 of another program's bytes (refused by every open) is not. On a
    private 80 MiB tmpfs: a 48 MiB image that wrote about 24 MiB, a 40 MiB one beside it (24 + 40 do not fit)."""
    mnt, out = in_private_tmpfs(80, THROUGH_BACKUP_CHILD)
    beside = " and 1 other card image beside it by "
    for name in ("whole", "blank", "torn"):
        assert out[name] is not None and beside in out[name] and f"({mnt}/a.img " in out[name], (name, out)
    assert out["foreign"] is None, out  # b alone fits
