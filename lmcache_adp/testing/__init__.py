# SPDX-License-Identifier: Apache-2.0
"""Drive a real LMCache MP server with this plugin the way vLLM does, with no
vLLM and no GPU: what examples/quickstart.py runs, and what an operator's smoke
test of a deployment needs. Requires lmcache (and torch) installed.

- MPServer: `lmcache server` with the plugin as its L2 tier, a child process on
  free ports, stopped by its PID; RunningServer: one already running, by its ports.
- VLLMClient: vLLM's scheduler and worker clients (LMCacheMPSchedulerAdapter,
  LMCacheMPWorkerAdapter) over CPU KV tensors of a KVShape.
- store_prompt / drop_l1 / restore_prompt: store a prompt's KV, drop it from
  LMCache's CPU tier, look it up and retrieve it; the Restore says whether every
  token came back with the stored bytes, and from_l2 whether the server's
  counter says they were loaded from L2 (the card).

    from lmcache_adp.testing import KVShape, MPServer, VLLMClient, adp_adapter, drop_l1, restore_prompt, store_prompt

    adapter = adp_adapter(card="/tmp/card.img", card_size_gb=4)   # or gateway="unix:///run/lmcache-adp/gateway.sock"
    with MPServer([adapter], "/tmp/adp-smoke") as server, VLLMClient(server.url, KVShape()) as client:
        stored = store_prompt(server, client, 512)
        assert drop_l1(server) == 0
        r = restore_prompt(server, client, stored)
        assert r.ok and r.from_l2, r

Against a server that is already running, `RunningServer(port, http_port)`
takes the place of MPServer. docs/testing_helper.md has the whole interface.
"""

from lmcache_adp.testing.client import (
    KVShape,
    Restore,
    StoredPrompt,
    VLLMClient,
    drop_l1,
    prefilled_prompt,
    prompt,
    restore_prompt,
    store_prompt,
)
from lmcache_adp.testing.server import (
    L2_LOADED_CHUNKS,
    L2_STORED_CHUNKS,
    MPServer,
    RunningServer,
    ServerError,
    adp_adapter,
    child_env,
    free_port,
    read_metrics,
)

__all__ = [
    "L2_LOADED_CHUNKS",
    "L2_STORED_CHUNKS",
    "KVShape",
    "MPServer",
    "Restore",
    "RunningServer",
    "ServerError",
    "StoredPrompt",
    "VLLMClient",
    "adp_adapter",
    "child_env",
    "drop_l1",
    "free_port",
    "prefilled_prompt",
    "prompt",
    "read_metrics",
    "restore_prompt",
    "store_prompt",
]
