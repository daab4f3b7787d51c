# SPDX-License-Identifier: Apache-2.0
"""The package's Python logger, formatted like the C++ core's lines
("[time] lmcache-adp LEVEL: message") and levelled by ADP_LOG_LEVEL."""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "[%(asctime)s] lmcache-adp %(levelname)s: %(message)s"


def get_logger() -> logging.Logger:
    logger = logging.getLogger("lmcache_adp")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(os.environ.get("ADP_LOG_LEVEL", "INFO").upper())
        logger.propagate = False
    return logger


def showing_info(env: dict[str, str]) -> dict[str, str]:
    """`env` for a child whose INFO lines its launcher reads (the gateway's "gateway ready" line, which the tests
    and benches wait for): ADP_LOG_LEVEL lowered to INFO where it would hide them, kept where it shows them
    (DEBUG, INFO)."""
    if env.get("ADP_LOG_LEVEL", "INFO").upper() in ("DEBUG", "INFO"):
        return env
    return {**env, "ADP_LOG_LEVEL": "INFO"}
