# SPDX-License-Identifier: Apache-2.0
"""lmcache-adp: the ADP storage card as the L2 tier of the LMCache MP server."""

from lmcache_adp._native import CardStore, crc32c, format_card
from lmcache_adp._version import __version__
from lmcache_adp.config import ConfigError, ConnectorConfig, default_card_path
from lmcache_adp.connector import ADPConnector

__all__ = [
    "ADPConnector",
    "CardStore",
    "ConfigError",
    "ConnectorConfig",
    "__version__",
    "crc32c",
    "default_card_path",
    "format_card",
]
