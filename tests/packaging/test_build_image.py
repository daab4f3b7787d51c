# SPDX-License-Identifier: Apache-2.0
"""scripts/build_image.sh removes the untagged images its builds leave: only its
own (by the image title label), and never while a test session runs an image
(the cache's .in-use lock, held shared by tests/packaging/test_image.py).

Tiny images (an empty base, labels only: nothing runs) under titles of this test's
own, and a cache directory of its own: the real images, and other sessions' on
this host, are out of its reach. podman comes from scripts/run_tests.sh; without
it this test fails, it never skips.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def exists(image_id: str) -> bool:
    return podman("image", "exists", image_id, check=False).returncode == 0


def test_prune_removes_only_untagged_images_of_its_titles(tmp_path):
    if shutil.which("podman") is None:
        pytest.fail("podman not installed (scripts/run_tests.sh installs it: apt-get install podman runc)")
    name = f"adp-prune-test-{uuid.uuid4().hex[:8]}"
    ours, theirs = name, f"{name}-other"
    base = f"localhost/{name}-base:latest"
    empty = tmp_path / "empty.tar"
    with tarfile.open(empty, "w"):
        pass
    made: list[str] = []

    def build(title: str, n: int, tag: str) -> str:
        ctx = tmp_path / f"{title}-{n}"
        ctx.mkdir()
        (ctx / "Dockerfile").write_text(f'FROM {base}\nLABEL org.opencontainers.image.title="{title}" n="{n}"\n')
        podman("build", "--format", "docker", "-t", tag, str(ctx))
        image_id = podman("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
        made.append(image_id)
        return image_id

    def prune() -> str:
        env = {**os.environ, "ADP_IMAGE_CACHE": str(tmp_path / "cache"), "ADP_IMAGE_TITLES": ours}
        r = subprocess.run(
            [str(ROOT / "scripts" / "build_image.sh"), "prune"],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stderr

    try:
        made.append(podman("import", str(empty), base).stdout.strip())
        old = build(ours, 1, f"localhost/{ours}:x")
        new = build(ours, 2, f"localhost/{ours}:x")  # takes the tag: `old` is untagged now
        other_old = build(theirs, 1, f"localhost/{theirs}:x")
        other_new = build(theirs, 2, f"localhost/{theirs}:x")
        assert len({old, new, other_old, other_new}) == 4

        # A test session runs an image: nothing is removed.
        (tmp_path / "cache").mkdir()
        with open(tmp_path / "cache" / ".in-use", "a") as in_use:
            fcntl.flock(in_use, fcntl.LOCK_SH)
            log = prune()
        assert "left for the next build" in log, log
        assert exists(old)

        log = prune()
        assert "removing 1 untagged image" in log, log
        assert not exists(old), "the untagged image of its own title is still there"
        assert exists(new), "the tagged image was removed"
        assert exists(other_old), "an untagged image of another title was removed"
        assert exists(other_new)
    finally:
        for tag in (f"localhost/{ours}:x", f"localhost/{theirs}:x", base):
            podman("rmi", "--force", tag, check=False)
        for image_id in made:
            podman("rmi", "--force", image_id, check=False)
