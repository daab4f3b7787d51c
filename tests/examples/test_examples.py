# SPDX-License-Identifier: Apache-2.0
"""Every example in examples/ that can run on a CPU machine is run here; the
others (vLLM on a GPU host, the systemd unit) are checked against the code
that will read them."""

from __future__ import annotations

import argparse
import configparser
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lmcache")

from lmcache_adp.config import ConnectorConfig  # noqa: E402
from lmcache_adp.testing import (  # noqa: E402
    KVShape,
    MPServer,
    VLLMClient,
    child_env,
    drop_l1,
    restore_prompt,
    store_prompt,
)
from lmcache_adp.testing.server import lmcache_executable  # noqa: E402
from tests.support.mp_server import assert_restored_from_card  # noqa: E402

pytestmark = [pytest.mark.lmcache, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SHAPE = KVShape(num_layers=4, num_heads=2, head_dim=64, block_size=16, num_blocks=160)
SCRIPTS = sorted(EXAMPLES.glob("*.sh"))


def dry_run(script: str, *args: str, **env: str) -> list[list[str]]:
    """The commands a launch script would run (ADP_DRY_RUN=1), one argv per line."""
    r = subprocess.run(
        ["bash", str(EXAMPLES / script), *args], env={**child_env(), **env, "ADP_DRY_RUN": "1"},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [shlex.split(line) for line in r.stdout.splitlines() if line.strip()]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def l2_adapter_spec(text: str) -> dict:
    """Parses an --l2-adapter value the way `lmcache server` does; returns the plugin's params."""
    from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config

    cfg = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[text]))
    assert len(cfg.adapters) == 1
    spec = json.loads(text)
    assert (spec["type"], spec["module_path"], spec["class_name"]) == ("native_plugin", "lmcache_adp", "ADPConnector")
    return spec["adapter_params"]


# --- quickstart -----------------------------------------------------------------


def run_quickstart(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), *args],
        env=child_env(), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_quickstart_refuses_bad_arguments_before_starting_a_server():
    """--tokens 100 started the server, then died in a ValueError traceback (audit 12): now argparse's one line."""
    for args, says in (
        (("--tokens", "100"), "--tokens must be a positive multiple of 256 (LMCache's chunk), got 100"),
        (("--tokens", "0"), "--tokens must be a positive multiple of 256"),
        (("--layers", "0"), "--layers must be positive, got 0"),
        (("--card-size-gb", "0.001"), "--card-size-gb must be a number of GiB in [0.015625, 1048576], got 0.001"),
    ):
        r = run_quickstart(*args, timeout=60)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert "lmcache server pid" not in r.stdout, r.stdout


def test_quickstart_passes():
    """What the README's main command runs, with its defaults."""
    r = run_quickstart()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS: 4/4 checks" in r.stdout, r.stdout
    assert "came from L2" in r.stdout and "(the server loaded 4 of 4 chunks from L2)" in r.stdout, r.stdout


def test_quickstart_fails_when_the_card_cannot_hold_a_chunk(tmp_path):
    """Exit code 0 means something: the smallest card (16 MiB) is smaller than one
    32 MiB Llama-8B chunk, so the store to L2 fails and the quickstart says so.
    (A 256 MiB card served here until format 3 let an object continue into the
    next region: it now holds the prompt.)"""
    r = run_quickstart("--card-size-gb", "0.015625", "--workdir", str(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stderr and "0 of the prompt's 4 chunks" in r.stderr, r.stderr


def test_the_server_is_run_by_this_interpreter_where_no_lmcache_is_beside_it(tmp_path, monkeypatch):
    """Audit 13: in a venv made with --system-site-packages on a host whose LMCache is installed outside
    it, `pip install .` put the plugin in the venv but no `lmcache` beside the venv's python, so the
    quickstart ran the `lmcache` on PATH: the host's interpreter, which cannot import the plugin
    ("Could not import module 'lmcache_adp'", the quickstart FAILed). Now LMCache's own command is run
    by this interpreter."""
    venv_python = tmp_path / "bin" / "python"  # an interpreter with no `lmcache` beside it
    venv_python.parent.mkdir()
    venv_python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(venv_python))
    argv = lmcache_executable()
    assert argv[0] == str(venv_python), argv
    r = subprocess.run([*argv, "server", "--help"], capture_output=True, text=True, timeout=300)  # 34 s at load 14
    assert r.returncode == 0 and r.stdout.startswith("usage: lmcache server"), r.stdout + r.stderr


# --- launch scripts ---------------------------------------------------------------


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_syntax(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def script_server(tmp_path: Path, script: str, **env: str) -> MPServer:
    """An MPServer whose process is the launch script, on the test's free ports."""
    server = MPServer([], tmp_path, name=script)
    server.args = ["bash", str(EXAMPLES / script)]
    server.env.update(
        ADP_MP_PORT=str(server.port), ADP_HTTP_PORT=str(server.http_port), ADP_L1_SIZE_GB="1",
        ADP_CARD=str(tmp_path / "card.img"), ADP_CARD_SIZE_GB="0.25", **env,
    )  # fmt: skip
    return server


def store_and_restore_from_card(server: MPServer) -> None:
    with VLLMClient(server.url, SHAPE) as client:
        stored = store_prompt(server, client, 512)
        assert drop_l1(server) == 0
        assert_restored_from_card(server, restore_prompt(server, client, stored))


def test_run_server_embedded(tmp_path):
    server = script_server(tmp_path, "run_server_embedded.sh")
    with server:
        store_and_restore_from_card(server)
    assert server.proc.returncode is not None
    assert (tmp_path / "card.img").exists(), "the script's card is the one the server used"


def test_run_server_embedded_command_line(tmp_path):
    (argv,) = dry_run("run_server_embedded.sh", "--chunk-size", "512", ADP_CARD=str(tmp_path / "c.img"))
    assert argv[:2] == ["lmcache", "server"] and argv[-2:] == ["--chunk-size", "512"]
    assert (flag(argv, "--port"), flag(argv, "--http-port"), flag(argv, "--eviction-policy")) == ("5555", "8080", "LRU")
    params = l2_adapter_spec(flag(argv, "--l2-adapter"))
    cfg = ConnectorConfig.from_params(params)
    assert (cfg.gateway, cfg.card, cfg.card_size_gb) == ("embedded", str(tmp_path / "c.img"), 64)


def test_run_server_gateway(tmp_path):
    sock = tmp_path / "gw" / "gateway.sock"
    server = script_server(tmp_path, "run_server_gateway.sh", ADP_SOCKET=str(sock))
    with server:
        store_and_restore_from_card(server)
    assert server.proc.returncode == 143, "the script stops on SIGTERM after stopping what it started"


def test_run_server_gateway_command_lines(tmp_path):
    sock = tmp_path / "g.sock"
    gateway, server = dry_run("run_server_gateway.sh", ADP_SOCKET=str(sock), ADP_CARD=str(tmp_path / "c.img"))
    assert gateway[:2] == ["lmcache-adp", "gateway"]
    assert (flag(gateway, "--card"), flag(gateway, "--socket")) == (str(tmp_path / "c.img"), str(sock))
    params = l2_adapter_spec(flag(server, "--l2-adapter"))
    assert params == {"gateway": f"unix://{sock}"}
    from lmcache_adp.cli import build_parser

    build_parser().parse_args(gateway[1:])
    ConnectorConfig.from_params(params)
    (server_only,) = dry_run("run_server_gateway.sh", ADP_START_GATEWAY="0")
    assert server_only[:2] == ["lmcache", "server"]


@pytest.mark.parametrize("script", ["run_server_embedded.sh", "run_server_gateway.sh"])
def test_metrics_port_setting(script):
    """ADP_METRICS_PORT becomes adapter_params metrics_port (what the image's healthcheck asks, audit 15 item 16);
    unset or 0: none; a value that is no port is refused before anything runs (it made the JSON malformed)."""
    env = {"ADP_START_GATEWAY": "0"}
    (server,) = dry_run(script, **env, ADP_METRICS_PORT="9400")
    params = l2_adapter_spec(flag(server, "--l2-adapter"))
    assert params["metrics_port"] == 9400 and ConnectorConfig.from_params(params).metrics_port == 9400, params
    for unset in ({}, {"ADP_METRICS_PORT": "0"}):
        (server,) = dry_run(script, **env, **unset)
        assert "metrics_port" not in l2_adapter_spec(flag(server, "--l2-adapter"))
    for bad in ("x", "65536", "08", "-1", "9400 "):
        r = subprocess.run(
            ["bash", str(EXAMPLES / script)], env={**child_env(), **env, "ADP_DRY_RUN": "1", "ADP_METRICS_PORT": bad},
            capture_output=True, text=True,
        )  # fmt: skip
        assert r.returncode == 2 and not r.stdout, (bad, r.stdout)
        assert r.stderr == f"ADP_METRICS_PORT={bad}: a port number, 1-65535 (0 or unset: no metrics port)\n", r.stderr


@pytest.mark.parametrize(
    "setting, value",
    [("ADP_CARD_SIZE_GB", "64G"), ("ADP_CARD_SIZE_GB", "sixty-four"), ("ADP_CARD", '/var/lib/lmcache-adp/"card".img')],
)
def test_a_setting_never_makes_the_l2_adapter_json_malformed(setting, value):
    """review33c: ADP_METRICS_PORT is checked because a value that is no port made the JSON malformed (audit 15),
    but ADP_CARD_SIZE_GB=64G (or a card path with a '"') still went into --l2-adapter as is: `lmcache server` then
    ended with LMCache's traceback "Invalid JSON for --l2-adapter #1: Expecting ',' delimiter: line 1 column 171",
    naming no setting. Either the script refuses it (exit 2, the setting named) or the JSON it passes parses."""
    r = subprocess.run(
        ["bash", str(EXAMPLES / "run_server_embedded.sh")],
        env={**child_env(), "ADP_DRY_RUN": "1", setting: value},
        capture_output=True,
        text=True,
    )
    if r.returncode == 2:
        assert not r.stdout and r.stderr.startswith(f"{setting}="), r.stderr
        return
    assert r.returncode == 0, r.stderr
    json.loads(flag(shlex.split(r.stdout), "--l2-adapter"))


def test_the_gateway_script_escapes_its_socket_and_checks_the_size():
    """review33c M4, run_server_gateway.sh: ADP_SOCKET went into --l2-adapter as is (a '"' in it: malformed JSON,
    LMCache's traceback), and ADP_CARD_SIZE_GB=64G reached the gateway as `--card-size-gb 64G`, whose refusal names
    the flag, not the setting. The socket is JSON-escaped, the size refused naming ADP_CARD_SIZE_GB (exit 2) where
    the script starts the gateway; with ADP_START_GATEWAY=0 no size is used, so none is checked."""
    sock = '/run/lmcache-adp/"gw" \\ x.sock'
    gateway, server = dry_run("run_server_gateway.sh", ADP_SOCKET=sock)
    assert flag(gateway, "--socket") == sock
    assert json.loads(flag(server, "--l2-adapter"))["adapter_params"] == {"gateway": f"unix://{sock}"}
    for start, says in (("1", "ADP_CARD_SIZE_GB=64G: a number of GiB"), ("0", "")):
        r = subprocess.run(
            ["bash", str(EXAMPLES / "run_server_gateway.sh")],
            env={**child_env(), "ADP_DRY_RUN": "1", "ADP_CARD_SIZE_GB": "64G", "ADP_START_GATEWAY": start},
            capture_output=True, text=True,
        )  # fmt: skip
        if says:
            assert r.returncode == 2 and not r.stdout and r.stderr.startswith(says), r.stderr
            assert len(r.stderr.splitlines()) == 1, r.stderr
        else:
            assert r.returncode == 0 and r.stdout.startswith("lmcache server "), r.stderr


# --- configs ------------------------------------------------------------------------


def test_l2_adapter_json_embedded():
    params = l2_adapter_spec((EXAMPLES / "lmcache-adp-l2.json").read_text())
    cfg = ConnectorConfig.from_params(params)
    assert cfg.gateway == "embedded" and cfg.card_size_gb == 64


def test_l2_adapter_json_gateway():
    params = l2_adapter_spec((EXAMPLES / "lmcache-adp-l2-gateway.json").read_text())
    assert params["gateway"] == "unix:///run/lmcache-adp/gateway.sock", "the systemd unit's socket"
    ConnectorConfig.from_params(params)


def test_vllm_serve_kv_transfer_config():
    """The JSON vLLM gets names a connector class the installed LMCache has, with the
    extra-config keys that class reads, pointing at the server scripts' default port."""
    (argv,) = dry_run("vllm_serve.sh", "meta-llama/Llama-3.1-8B-Instruct", "--max-model-len", "32768")
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"] and argv[-1] == "32768"
    cfg = json.loads(flag(argv, "--kv-transfer-config"))
    assert (cfg["kv_connector"], cfg["kv_role"]) == ("LMCacheMPConnector", "kv_both")
    import importlib.util

    spec = importlib.util.find_spec(cfg["kv_connector_module_path"])  # imports lmcache only, not vLLM
    assert spec is not None and spec.origin
    source = Path(spec.origin).read_text()
    assert f"class {cfg['kv_connector']}(" in source
    for key in cfg["kv_connector_extra_config"]:
        assert f'"{key}"' in source, f"{key} is not read by {cfg['kv_connector_module_path']}"
    extra = cfg["kv_connector_extra_config"]
    (server,) = dry_run("run_server_embedded.sh")
    assert (
        f"{extra['lmcache.mp.host']}:{extra['lmcache.mp.port']}"
        == f"tcp://{flag(server, '--host')}:{flag(server, '--port')}"
    )


def test_systemd_unit():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(EXAMPLES / "lmcache-adp-gateway.service")
    svc = unit["Service"]
    argv = shlex.split(svc["ExecStart"])
    assert Path(argv[0]).name == "lmcache-adp" and argv[1] == "gateway"
    sock = flag(argv, "--socket")
    assert Path(sock).parent == Path("/run") / svc["RuntimeDirectory"], "socket outside the RuntimeDirectory"
    json_sock = json.loads((EXAMPLES / "lmcache-adp-l2-gateway.json").read_text())["adapter_params"]["gateway"]
    assert json_sock == f"unix://{sock}"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    from lmcache_adp.cli import build_parser

    build_parser().parse_args(argv[1:])
    # ProtectSystem=strict: a path made writable must exist at start, or systemd fails the unit with 226/NAMESPACE
    # (ReadWritePaths=/var/lib/lmcache-adp on a fresh host, audit 15). What the unit writes is its own directories,
    # which systemd makes; a ReadWritePaths entry is only taken if it may be missing ("-").
    assert svc["ProtectSystem"] == "strict" and svc["StateDirectory"] == "lmcache-adp", dict(svc)
    for path in svc.get("ReadWritePaths", "").split():
        assert path.startswith("-"), f"ReadWritePaths {path} fails the start where it does not exist"
    card = flag(argv, "--card")
    assert card.startswith("/dev/") or Path(card).parent == Path("/var/lib") / svc["StateDirectory"], card
