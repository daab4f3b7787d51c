# SPDX-License-Identifier: Apache-2.0
"""ADPConnector, plus one torch parallel op run on a thread of its own that then stays alive: that thread
keeps a libgomp pool, as a RAM L2's copy_ thread (mock) does."""
import threading

import torch

from lmcache_adp import ADPConnector


def _keep_a_team(ready):
    torch.ones(1 << 24).add_(1)
    ready.set()
    threading.Event().wait()


class SecondTeamConnector(ADPConnector):
    def __init__(self, **params):
        ready = threading.Event()
        threading.Thread(target=_keep_a_team, args=(ready,), name="second-omp-team", daemon=True).start()
        ready.wait()
        super().__init__(**params)
