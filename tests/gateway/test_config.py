# SPDX-License-Identifier: Apache-2.0
"""adapter_params of a connector that talks to a gateway: what is accepted, and the errors."""

from __future__ import annotations

import re

import pytest

from lmcache_adp import ADPConnector, ConfigError, ConnectorConfig


def test_unix_gateway_params(tmp_path):
    cfg = ConnectorConfig.from_params({"gateway": "unix:///run/x.sock", "ring_mb": 16, "num_workers": 2})
    native = cfg.to_native()
    assert native["gateway"] == "unix:///run/x.sock" and native["ring_bytes"] == 16 << 20 and native["token"] == ""
    assert native["ptracer_follow"] is False  # one gateway per process unless asked (docs/protocol.md)
    assert ConnectorConfig.from_params({"gateway": "unix:///x.sock", "ptracer_follow": True}).to_native()[
        "ptracer_follow"
    ]


def test_gateway_stall_s(tmp_path):
    """The stalled bound (README, adapter_params): 5 s by default, any number of seconds in [0.5, 3600], to the
    native side in nanoseconds."""
    assert ConnectorConfig.from_params({"gateway": "unix:///x.sock"}).to_native()["gateway_stall_ns"] == 5 * 10**9
    for given, ns in ((0.5, 500_000_000), (0.75, 750_000_000), (30, 30 * 10**9), (3600, 3600 * 10**9)):
        cfg = ConnectorConfig.from_params({"gateway": "unix:///x.sock", "gateway_stall_s": given})
        assert cfg.gateway_stall_s == given and cfg.to_native()["gateway_stall_ns"] == ns
    (tmp_path / "token").write_text("t")
    cfg = ConnectorConfig.from_params(
        {"gateway": "tcp://h:1", "token_file": str(tmp_path / "token"), "gateway_stall_s": 2}
    )
    assert cfg.to_native()["gateway_stall_ns"] == 2 * 10**9


@pytest.mark.parametrize(
    "key, default, accepted",
    [("reply_spin_us", 200, (0, 1, 500, 7, 10000)), ("connect_timeout_ms", 2000, (100, 300, 3000, 5000, 600_000))],
)
def test_whole_number_gateway_params(tmp_path, key, default, accepted):
    """The reply spin: 200 us by default, any whole number of microseconds in [0, 10000] (0: never); a connect's
    bound: 2000 ms by default, any whole number of ms in [100, 600000] (README, adapter_params). For unix:// and
    tcp:// alike, to the native side as they are."""
    assert ConnectorConfig.from_params({"gateway": "unix:///x.sock"}).to_native()[key] == default
    (tmp_path / "token").write_text("t")
    for where in ({"gateway": "unix:///x.sock"}, {"gateway": "tcp://h:1", "token_file": str(tmp_path / "token")}):
        for given in accepted:
            cfg = ConnectorConfig.from_params({**where, key: given})
            assert getattr(cfg, key) == given and cfg.to_native()[key] == given


def test_tcp_gateway_reads_token(tmp_path):
    tok = tmp_path / "token"
    tok.write_text("  s3cret\n")
    cfg = ConnectorConfig.from_params({"gateway": "tcp://10.0.0.1:7070", "token_file": str(tok)})
    assert cfg.to_native()["token"] == "s3cret"
    assert "s3cret" not in repr(cfg)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"gateway": "tcp://h:1"}, r"'token_file'\] is required with a tcp:// gateway"),
        ({"gateway": "tcp://h:1", "token_file": "/nonexistent/token"}, r"cannot read token file '/nonexistent/token'"),
        ({"gateway": "unix:///x.sock", "token_file": "/t"}, r"'token_file'\] applies to a tcp:// gateway only"),
        ({"gateway": "tcp://h:1", "ring_mb": 8, "token_file": "/t"}, r"'ring_mb'\] applies to a unix:// gateway only"),
        ({"gateway": "unix:///x.sock", "ring_mb": 0}, r"'ring_mb'\] must be in \[1, 4096\]"),
        ({"gateway": "embedded", "ptracer_follow": True}, r"'ptracer_follow'\] applies to a unix:// gateway only"),
        ({"gateway": "unix:///x.sock", "ptracer_follow": 1}, r"'ptracer_follow'\] must be true or false, got 1"),
        ({"gateway": "unix:///x.sock", "card": "/c.img"}, r"'card' applies to gateway='embedded' only"),
        ({"gateway": "embedded", "gateway_stall_s": 5}, r"'gateway_stall_s'\] applies to a unix:// or tcp:// gateway"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": 0}, r"'gateway_stall_s'\] must be a number of seconds, at"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": -1.5}, r"at least 0.5 and at most 3600, got -1.5"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": 0.01}, r"at most 3600, got 0.01 \(below 0.5 s a working"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": 0.499}, r"at least 0.5 and at most 3600, got 0.499"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": 3601}, r"at least 0.5 and at most 3600, got 3601"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": "5"}, r"at least 0.5 and at most 3600, got '5'"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": True}, r"at least 0.5 and at most 3600, got True"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": float("nan")}, r"at least 0.5 and at most 3600, got nan"),
        ({"gateway": "unix:///x.sock", "gateway_stall_s": None}, r"at least 0.5 and at most 3600, got None"),
        ({"gateway": "embedded", "reply_spin_us": 100}, r"'reply_spin_us'\] applies to a unix:// or tcp:// gateway"),
        ({"gateway": "unix:///x.sock", "reply_spin_us": -1}, r"'reply_spin_us'\] must be in \[0, 10000\], got -1"),
        ({"gateway": "unix:///x.sock", "reply_spin_us": 10001}, r"'reply_spin_us'\] must be in \[0, 10000\]"),
        ({"gateway": "unix:///x.sock", "reply_spin_us": 1.5}, r"'reply_spin_us'\] must be an integer in \[0, 10000\]"),
        ({"gateway": "unix:///x.sock", "reply_spin_us": True}, r"'reply_spin_us'\] must be an integer"),
        (
            {"gateway": "embedded", "connect_timeout_ms": 300},
            r"'connect_timeout_ms'\] applies to a unix:// or tcp:// gateway only",
        ),
        (
            {"gateway": "unix:///x.sock", "connect_timeout_ms": 0},
            r"'connect_timeout_ms'\] must be a whole number of milliseconds in \[100, 600000\], got 0 \(below 100 ms a "
            r"working gateway on a loaded host misses it; above 10 minutes a gateway that accepts and never answers "
            r"reads reachable that long\)",
        ),
        ({"gateway": "unix:///x.sock", "connect_timeout_ms": -300}, r"in \[100, 600000\], got -300 \(below"),
        ({"gateway": "unix:///x.sock", "connect_timeout_ms": 99}, r"in \[100, 600000\], got 99 \(below"),
        ({"gateway": "unix:///x.sock", "connect_timeout_ms": 600_001}, r"in \[100, 600000\], got 600001 \(below"),
        ({"gateway": "unix:///x.sock", "connect_timeout_ms": 10**12}, r"in \[100, 600000\], got 1000000000000 "),
        ({"gateway": "unix:///x.sock", "connect_timeout_ms": "300"}, r"in \[100, 600000\], got '300' \(below"),
        ({"gateway": "unix:///x.sock", "connect_timeout_ms": 300.0}, r"in \[100, 600000\], got 300.0 \(below"),
        ({"gateway": "unix:///x.sock", "connect_timeout_ms": True}, r"in \[100, 600000\], got True \(below"),
        ({"gateway": "unix:///x.sock", "connect_timeout_ms": None}, r"in \[100, 600000\], got None \(below"),
        ({"gateway": "unix://relative.sock"}, r"valid choices: 'embedded', 'unix:///path/to/gateway.sock'"),
        # 108 bytes: every request failed 'socket path must be 1 to 107 bytes', the start did not (audit 12)
        ({"gateway": "unix:///" + "s" * 107}, r"a Unix socket path is at most 107 bytes, this one is 108"),
    ],
)
def test_bad_gateway_params(params, message):
    with pytest.raises(ConfigError, match=message):
        ConnectorConfig.from_params(params)


def test_empty_token_file_refused(tmp_path):
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="must hold 1 to 256 bytes"):
        ConnectorConfig.from_params({"gateway": "tcp://h:1", "token_file": str(tmp_path / "empty")})


def test_binary_token_file_is_a_config_error(tmp_path):
    """review33c: a token made with `head -c 32 /dev/urandom > token` (bytes that are not UTF-8) raised
    UnicodeDecodeError out of adapter_params, a traceback that names neither the key nor the file; it is a
    ConfigError naming both, as an unreadable or empty token file is."""
    tok = tmp_path / "token"
    tok.write_bytes(b"\xd9\x8f\xbb" + bytes(range(29)))
    with pytest.raises(ConfigError, match=re.escape(f"adapter_params['token_file']: token file {str(tok)!r}")):
        ConnectorConfig.from_params({"gateway": "tcp://h:1", "token_file": str(tok)})


@pytest.mark.parametrize(
    "gateway, why",
    [
        ("tcp://host:99999", r"the port must be a number in \[1, 65535\], got '99999'"),
        # Read as "port must be 0-65535" by the native parser (audit 15): the '/' is named now.
        ("tcp://10.0.0.5:9500/", r"expected tcp://HOST:PORT, with no '/' or space in it \(no path, no trailing '/'\)"),
        # Port 0 was taken, and every connect then failed.
        ("tcp://10.0.0.5:0", r"the port must be a number in \[1, 65535\], got '0'"),
        ("tcp://10.0.0.5", r"expected tcp://HOST:PORT, as tcp://10.0.0.5:9500 \(no port given\)"),
        ("tcp://:9500", r"expected tcp://HOST:PORT, as tcp://10.0.0.5:9500 \(no host given\)"),
        ("tcp://[]:9500", r"expected tcp://HOST:PORT, as tcp://10.0.0.5:9500 \(no host given\)"),
        ("tcp://h:95x0", r"the port must be a number in \[1, 65535\], got '95x0'"),
    ],
)
def test_bad_tcp_endpoint_is_a_clear_error(tmp_path, gateway, why):
    """The key is named, before the token file is read or anything is started (audit 15: a bare ValueError of the
    native parser, and with no token_file the token was what the message named)."""
    (tmp_path / "token").write_text("t")
    with pytest.raises(ConfigError, match=rf"^adapter_params\['gateway'\] = '{re.escape(gateway)}': {why}"):
        ADPConnector(gateway=gateway, token_file=str(tmp_path / "token"))
    with pytest.raises(ConfigError, match=r"^adapter_params\['gateway'\]"):
        ConnectorConfig.from_params({"gateway": gateway})


@pytest.mark.parametrize("gateway", ["tcp://10.0.0.5:9500", "tcp://[::1]:1", "tcp://gw.example:65535"])
def test_good_tcp_endpoints_are_taken(tmp_path, gateway):
    (tmp_path / "token").write_text("t")
    assert ConnectorConfig.from_params({"gateway": gateway, "token_file": str(tmp_path / "token")}).gateway == gateway


def test_longest_socket_path_is_taken():
    path = "/" + "s" * 106  # 107 bytes: sun_path's 108 with its NUL
    assert ConnectorConfig.from_params({"gateway": "unix://" + path}).gateway == "unix://" + path
