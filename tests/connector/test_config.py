# SPDX-License-Identifier: Apache-2.0
"""adapter_params validation: clear errors, before anything is created."""

import os
import subprocess
import sys

import pytest

from lmcache_adp import ADPConnector, ConfigError, ConnectorConfig, default_card_path
from lmcache_adp.testing import child_env


@pytest.mark.parametrize(
    "params, match",
    [
        ({"bogus": 1}, r"unknown adapter_params key\(s\) 'bogus'; valid keys: gateway, card"),
        # A near miss names the key meant (audit 14: 'card_sizegb' was only in a list of 17).
        ({"card_sizegb": 1}, r"key\(s\) 'card_sizegb' \(did you mean 'card_size_gb'\?\); valid keys: gateway, card"),
        (
            {"numworkers": 2, "timeout": 5},
            r"key\(s\) 'numworkers', 'timeout' \(did you mean 'num_workers' for 'numworkers', 'timeout_ms' for "
            r"'timeout'\?\); valid keys",
        ),
        ({"gateway": "nfs://x"}, r"adapter_params\['gateway'\] = 'nfs://x' is not supported; valid choices"),
        ({"num_workers": 0}, r"adapter_params\['num_workers'\] must be in \[1, 64\], got 0"),
        ({"num_workers": "4"}, r"adapter_params\['num_workers'\] must be an integer"),
        ({"num_workers": True}, r"adapter_params\['num_workers'\] must be an integer"),
        ({"timeout_ms": -5}, r"adapter_params\['timeout_ms'\] must be in"),
        ({"card_size_gb": 0}, r"adapter_params\['card_size_gb'\] must be a number of GiB"),
        ({"card_size_gb": "big"}, r"adapter_params\['card_size_gb'\]"),
        ({"card": 7}, r"adapter_params\['card'\] must be a path string"),
        ({"durable": "yes"}, r"adapter_params\['durable'\] must be true or false"),
        ({"io_depth": 0}, r"adapter_params\['io_depth'\] must be in \[1, 256\], got 0"),
    ],
)
def test_bad_params_raise_before_anything_is_created(tmp_path, params, match):
    card = str(tmp_path / "c.img")
    with pytest.raises(ConfigError, match=match):
        ADPConnector(**{"card": card, **params})
    assert not os.path.exists(card)


def test_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = ConnectorConfig.from_params({})
    assert cfg.card == default_card_path() == str(tmp_path / "lmcache-adp" / "card.img")
    assert (cfg.gateway, cfg.num_workers, cfg.io_depth, cfg.timeout_ms, cfg.durable) == ("embedded", 8, 4, 10000, True)
    assert ConnectorConfig.from_params({"gateway": "unix:///x.sock"}).num_workers == 4


@pytest.mark.parametrize("card", ["", "  "])
def test_an_empty_card_path_is_refused_not_read_as_the_default(monkeypatch, tmp_path, card):
    """`"card": ""` (a config template whose variable was unset) made and used the default image under
    ~/.cache without a word (audit 14). Now it is refused, naming the default; leaving the key out (or null)
    still means the default."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=r"adapter_params\['card'\] must be a path string, got '\s*' \(leave the"):
        ADPConnector(card=card, card_size_gb=0.25)
    assert not os.path.exists(default_card_path())
    assert ConnectorConfig.from_params({"card": None}).card == default_card_path()


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


_REFUSED_START = """
import sys
from lmcache_adp import ADPConnector
card = sys.argv[1]
try:
    ADPConnector(card=card, card_size_gb=0.015625, num_worker=4)
except Exception as e:
    print("raised", type(e).__name__, flush=True)
held = ADPConnector(card=card, card_size_gb=0.015625, num_workers=1)
try:
    ADPConnector(card=card)
except Exception as e:
    print("raised", type(e).__name__, flush=True)
held.close()
"""


def test_a_start_refused_is_one_error_line_of_the_plugin(tmp_path):
    """review33c: inside `lmcache server`, a bad adapter_params key (or a card another process holds) reached the
    operator only as the last line of LMCache's 40-line traceback, under "Application startup failed"; the plugin
    logged nothing. Its own log has one ERROR line each now, "ADPConnector not started: <why>" (the prefix the
    metrics port's refusal already has), so `journalctl | grep lmcache-adp` shows why the server did not start."""
    card = str(tmp_path / "card.img")
    r = subprocess.run(
        [sys.executable, "-c", _REFUSED_START, card], capture_output=True, text=True, timeout=60, env=child_env()
    )
    assert r.stdout.split("\n")[:2] == ["raised ConfigError", "raised RuntimeError"], (r.stdout, r.stderr)
    errors = [line for line in r.stderr.splitlines() if "lmcache-adp ERROR" in line]
    assert len(errors) == 2, r.stderr
    assert "ADPConnector not started: unknown adapter_params key(s) 'num_worker'" in errors[0], errors
    assert f"ADPConnector not started: card {card} is already open" in errors[1], errors


def test_a_size_ignored_names_the_image_size_apart_from_the_one_asked(tmp_path):
    """review33c: `--card-size-gb 0.03` on an existing 32 MiB image warned "--card-size-gb 0.03 ignored: card image
    X exists with 0.03 GiB and keeps that size": both sizes read the same, so the operator cannot see what differs.
    Below 1 GiB the image's size is in MiB, as the other card lines write amounts (metrics.amount; audit 14: a
    small image read "0.04 GiB, 0.02 GiB of it written")."""
    from lmcache_adp.config import card_size_ignored

    image = tmp_path / "card.img"
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    said = card_size_ignored(str(image), 0.03, "--card-size-gb")
    assert said is not None and said.startswith(f"--card-size-gb 0.03 ignored: card image {image} exists with "), said
    assert "exists with 32.00 MiB and keeps that size" in said, said


def test_a_card_directory_that_cannot_be_made_names_the_key_and_the_card():
    """review33c C5: adapter_params card "/proc/nope/card.img" failed "cannot create directory /proc/nope: No such
    file or directory", naming neither the parameter nor the card the directory was for."""
    with pytest.raises(RuntimeError) as e:
        ADPConnector(card="/proc/adp-nope/card.img", card_size_gb=0.015625, num_workers=1)
    assert str(e.value).startswith(
        "adapter_params['card']: cannot create directory /proc/adp-nope for card image /proc/adp-nope/card.img: "
    ), e.value
