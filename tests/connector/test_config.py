# SPDX-License-Identifier: Apache-2.0
"""adapter_params validation: clear errors, before anything is created."""

import os

import pytest

from lmcache_adp import ADPConnector, ConfigError, ConnectorConfig, default_card_path


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
