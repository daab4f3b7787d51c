# SPDX-License-Identifier: Apache-2.0
"""ADPConnector: the class LMCache's native_plugin L2 adapter loads.

    {"type": "native_plugin", "module_path": "lmcache_adp",
     "class_name": "ADPConnector", "adapter_params": {...}}

LMCache calls ``ADPConnector(**adapter_params)``, then event_fd,
submit_batch_{get,set,exists,delete}, drain_completions and close: all of them
are the C++ methods of the base class, so no Python runs per request.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from lmcache_adp._native import NativeConnector, card_space_warning
from lmcache_adp.config import ConfigError, ConnectorConfig, card_size_ignored, remove_new_image
from lmcache_adp.log import get_logger
from lmcache_adp.metrics import MetricsServer
from lmcache_adp.native_check import check_native
from lmcache_adp.stats_catalog import CLIENT, EMBEDDED


def _not_started(why: str) -> str:
    """Logs "ADPConnector not started: <why>" as one ERROR line of the plugin's own and returns it. Inside
    `lmcache server` a refused start reached the operator only as the last line of LMCache's 40-line traceback,
    under "Application startup failed", with nothing of the plugin's in its log (review33c M5): the line is what
    `journalctl -u ... | grep lmcache-adp` finds. The exception is raised all the same (LMCache must not start)."""
    said = f"ADPConnector not started: {why}"
    get_logger().error("%s", said)
    return said


class ADPConnector(NativeConnector):
    def __init__(self, **adapter_params: Any) -> None:
        # The native part first, empty (this cannot raise), then started: where a parameter or the start raises,
        # the object (alive in the traceback's frames) answers each method with RuntimeError "this connector
        # failed to start: ..." instead of reading memory never set up (audit 12 note 3).
        # A module built from other sources than the tree beside it is named in one line (audit 15 item 23), not
        # by pybind's TypeError where its constructors do not match; the object is built empty first all the same
        # (a method of one that is not built crashes the process), where that much of the module still works.
        why = check_native()
        try:
            super().__init__()
            self._metrics = None
            if why:
                self._start_failed(why)
        except Exception:
            if not why:
                raise
        if why:
            raise RuntimeError(_not_started(why))
        try:
            self.config = ConnectorConfig.from_params(adapter_params)
        except ConfigError as e:
            self._start_failed(str(e))
            _not_started(str(e))
            raise
        embedded = self.config.gateway == "embedded"
        existed = embedded and os.path.lexists(self.config.card)  # before this start: never this start's to remove
        try:
            self._start(self.config.to_native())
        except Exception as e:
            # An image this start created goes with it (as the gateway's does), so the next start creates it at
            # the size it is then given; one that was there stays.
            if embedded and not existed:
                remove_new_image(self.config.card, get_logger(), str(e))
            if embedded and str(e).startswith("cannot create directory "):
                # The store names the directory and the card; which parameter gave that card is this layer's to
                # say (review33c C5).
                why = f"adapter_params['card']: {e}"
                _not_started(why)
                raise RuntimeError(why) from None
            _not_started(str(e))
            raise
        self._native_started = True
        size_gb, what = self.config.card_size_gb, "adapter_params['card_size_gb'] ="
        if (
            existed
            and "card_size_gb" in adapter_params
            and (note := card_size_ignored(self.config.card, size_gb, what))
        ):
            get_logger().warning("%s", note)
        if embedded and (warning := card_space_warning(self.config.card)):
            get_logger().warning("%s", warning)
        if self.config.metrics_port:
            source = EMBEDDED if self.config.gateway == "embedded" else CLIENT
            host, port = self.config.metrics_host, self.config.metrics_port
            try:
                self._metrics = MetricsServer(self.stats, port, source=source, host=host)
            except OSError as e:
                # A port in use or a host that is not this machine's: one line naming the parameter (it was a
                # bare "[Errno 98] Address already in use"), and the card or connections given back now, not
                # whenever the half-built object is collected.
                super().close()
                if embedded and not existed:
                    remove_new_image(self.config.card, get_logger())
                raise RuntimeError(
                    _not_started(
                        f"adapter_params['metrics_port'] {port} on metrics_host {host!r}: cannot serve metrics "
                        f"there: {e.strerror or e}"
                        + (
                            # Who may hold it, as the gateway's refusal says (review33c C4).
                            " (another process holds the port: another connector's metrics_port or a gateway's "
                            "--metrics-port; give each its own)"
                            if e.errno == errno.EADDRINUSE
                            else ""
                        )
                    )
                ) from None

    def stats(self) -> dict[str, Any]:
        st = super().stats()
        st["card"] = self.config.card if self.config.gateway == "embedded" else self.config.gateway
        return st

    def close(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        super().close()

    def __repr__(self) -> str:
        # One whose start raised (a bad parameter, a card already open) has no card or gateway: describe() would
        # raise (it crashed the process before the native part was built empty; audit 12).
        if not self.__dict__.get("_native_started"):
            return "ADPConnector(not started)"
        return f"ADPConnector({self.describe()})"
