# SPDX-License-Identifier: Apache-2.0
"""A new card image's blocks: sparse (ftruncate, the default) or, when asked, allocated at creation (fallocate).

A sparse image takes its blocks from the filesystem as the first stores write them: another process can fill the
filesystem meanwhile and the card's stores then fail with ENOSPC though the card has room. An operator who wants
the space reserved asks for it (adapter_params card_preallocate, `gateway --card-preallocate`, `format
--preallocate`): the image is fallocate'd at creation, and one its filesystem cannot hold fails then, with nothing
left behind. Not the default: measured, first-fill stores ran 1.05-1.39x of a sparse image's but loads right after
that fill 0.88-0.90x (benchmarks/results/2026-12-04-1930-prealloc.md). It stays sparse on tmpfs even when asked
(its blocks are memory: allocating them takes the whole size at once) and on a filesystem without fallocate. An
existing image is never allocated at open.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from lmcache_adp import ADPConnector, CardStore
from tests.support.gateway import temp_gateway

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE = 64 << 20


def allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture
def disk_dir():
    """A directory on the disk (/var/tmp: ext4 here), not on tmpfs."""
    d = tempfile.mkdtemp(prefix="adp-prealloc-", dir="/var/tmp")
    fstype = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip()
    assert fstype not in ("tmpfs", "ramfs"), f"/var/tmp is on {fstype}: this test needs a disk filesystem"
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_new_image_on_disk_is_sparse_by_default(disk_dir, capfd):
    """CardStore, `format`, the embedded connector and (below) the gateway, asked for nothing: sparse, as before
    the option existed (only the superblock written)."""
    path = os.path.join(disk_dir, "card.img")
    CardStore(path, SIZE, durable=False).close()
    assert os.path.getsize(path) == SIZE and allocated(path) < SIZE // 8, allocated(path)
    assert f"created card image {path} (64.00 MiB, sparse)" in capfd.readouterr().err
    path = os.path.join(disk_dir, "format.img")
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "format", "--card", path, "--size-gb", "0.0625", "--yes"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(path) == SIZE and allocated(path) < SIZE // 8, allocated(path)
    path = os.path.join(disk_dir, "embedded.img")
    ADPConnector(card=path, card_size_gb=0.0625, num_workers=1).close()
    assert os.path.getsize(path) == SIZE and allocated(path) < SIZE // 8, allocated(path)


def test_preallocation_asked_reserves_the_blocks(disk_dir, capfd):
    """CardStore(preallocate=True), `format --preallocate` and adapter_params card_preallocate: true allocate a new
    image's blocks at creation (st_blocks x 512 >= its size)."""
    path = os.path.join(disk_dir, "store.img")
    CardStore(path, SIZE, durable=False, preallocate=True).close()
    assert os.path.getsize(path) == SIZE and allocated(path) >= SIZE, allocated(path)
    assert f"created card image {path} (64.00 MiB, its blocks allocated in " in capfd.readouterr().err

    path = os.path.join(disk_dir, "format.img")
    r = subprocess.run(
        [sys.executable, "-m", "lmcache_adp.cli", "format", "--card", path, "--size-gb", "0.0625", "--preallocate",
         "--yes"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(path) == SIZE and allocated(path) >= SIZE, allocated(path)

    path = os.path.join(disk_dir, "embedded.img")
    ADPConnector(card=path, card_size_gb=0.0625, card_preallocate=True, num_workers=1).close()
    assert os.path.getsize(path) == SIZE and allocated(path) >= SIZE, allocated(path)


def test_the_gateway_preallocates_only_with_card_preallocate():
    with temp_gateway(memory=False, card_size_gb=0.0625, extra=("--card-preallocate",)) as gw:
        assert os.path.getsize(gw.card) == SIZE and allocated(gw.card) >= SIZE, allocated(gw.card)
        assert "its blocks allocated in " in gw.log()
    with temp_gateway(memory=False, card_size_gb=0.0625) as gw:
        assert allocated(gw.card) < SIZE // 8, allocated(gw.card)
        assert "(64.00 MiB, sparse)" in gw.log()


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_card_preallocate_that_is_not_true_or_false_is_refused(disk_dir, value):
    path = os.path.join(disk_dir, "card.img")
    with pytest.raises(ValueError, match=r"adapter_params\['card_preallocate'\] must be true or false, got "):
        ADPConnector(card=path, card_size_gb=0.0625, card_preallocate=value, num_workers=1)
    assert not os.path.exists(path)


def test_an_existing_image_is_not_allocated_at_open(disk_dir):
    path = os.path.join(disk_dir, "card.img")
    CardStore(path, SIZE, durable=False).close()
    before = allocated(path)
    s = CardStore(path, SIZE, durable=False, preallocate=True)  # applies to a new image only
    s.put("k", b"x" * 4096)
    s.close()
    assert before < allocated(path) < SIZE // 8, (before, allocated(path))


def test_a_new_image_on_tmpfs_stays_sparse_even_when_preallocation_is_asked(capfd):
    """On tmpfs the blocks are memory: allocating them would take the card's whole size of RAM at once
    (2.3-2.5 s for 8 GiB here); they are taken as stores fill the card, as before."""
    d = tempfile.mkdtemp(prefix="adp-prealloc-", dir="/dev/shm")
    try:
        path = os.path.join(d, "card.img")
        CardStore(path, SIZE, durable=False, preallocate=True).close()
        assert os.path.getsize(path) == SIZE and allocated(path) < SIZE // 8, allocated(path)
        assert f"created card image {path} (64.00 MiB, sparse: on tmpfs, " in capfd.readouterr().err
    finally:
        shutil.rmtree(d)


NO_ROOM_CHILD = r"""
import json, os, sys
from lmcache_adp import CardStore
mnt = sys.argv[1]
st = os.statvfs(mnt)
free = st.f_bavail * st.f_frsize
path = mnt + "/cards/card.img"
out = {"free": free, "path": path}
try:
    # All that the filesystem reports free: it passes the check before creation (size <= free), but ext4's
    # records of the image's extents need a block more than that.
    CardStore(path, free & ~4095, durable=False, preallocate=True)
    out["created"] = os.stat(path).st_blocks * 512
except RuntimeError as e:
    out["error"] = str(e)
out["left"] = sorted(os.listdir(mnt))
st = os.statvfs(mnt)
out["free_after"] = st.f_bavail * st.f_frsize
print(json.dumps(out))
"""


def in_private_ext4(size_mib: int, child: str) -> dict:
    """Runs the Python `child` with a new ext4 of size_mib (no blocks reserved for root: -m 0) on a loop device
    mounted at its argv[1], in a mount namespace of its own (the mount goes with it; the loop device, set up by
    mount with autoclear, goes with the mount): the JSON of the child's last line."""
    assert os.geteuid() == 0, "this test needs root: it mounts a private ext4 in a mount namespace of its own"
    tools = [shutil.which(t) for t in ("unshare", "mkfs.ext4")]
    assert all(tools), "util-linux unshare and e2fsprogs mkfs.ext4 are needed for this test"
    d = tempfile.mkdtemp(prefix="adp-prealloc-ext4-", dir="/var/tmp")
    try:
        img, mnt = os.path.join(d, "fs.img"), os.path.join(d, "mnt")
        os.mkdir(mnt)
        with open(img, "wb") as f:
            f.truncate(size_mib << 20)
        script = 'mkfs.ext4 -q -F -m 0 -b 4096 -E nodiscard "$1" && mount -o loop "$1" "$2" && exec "$3" -c "$4" "$2"'
        r = subprocess.run(
            [tools[0], "--mount", "--propagation", "private", "sh", "-c", script, "sh", img, mnt, sys.executable,
             child],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(d)


def test_an_image_its_filesystem_cannot_allocate_is_not_created():
    """A 1 GiB ext4 of its own: an image of all it reports free, preallocation asked, passes the check before
    creation but cannot be allocated. The creation fails with NoSpace and leaves nothing: no file, no directory,
    no blocks (a sparse one would start and fail its stores with ENOSPC near the end)."""
    out = in_private_ext4(1024, NO_ROOM_CHILD)
    assert "created" not in out, out
    e = out["error"]
    assert f"cannot create card image {out['path']} of " in e and "its filesystem cannot allocate it (" in e, e
    assert "No space left on device" in e and "give a size that fits or make room" in e, e
    assert out["left"] == ["lost+found"], out  # neither the image nor the directory made for it
    assert out["free_after"] == out["free"], out
