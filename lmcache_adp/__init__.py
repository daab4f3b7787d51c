# SPDX-License-Identifier: Apache-2.0
"""lmcache-adp: the ADP storage card as the L2 tier of the LMCache MP server."""

from lmcache_adp._version import __version__

try:
    from lmcache_adp._native import CardStore, crc32c, format_card
    from lmcache_adp.config import ConfigError, ConnectorConfig, default_card_path
    from lmcache_adp.connector import ADPConnector
except (ImportError, AttributeError):
    # A module built from other sources may lack a name these read at import: the rebuild command in one line
    # (lmcache_adp/native_check.py), judged from the module's bytes, not Python's AttributeError.
    from pathlib import Path

    from lmcache_adp.native_check import stale_native_file

    if why := stale_native_file(Path(__file__).parent):
        raise ImportError(why) from None
    raise

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
