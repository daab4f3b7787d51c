# SPDX-License-Identifier: Apache-2.0
"""The quickstart's checks against an LMCache MP server in a container, run
inside a container of the image (podman exec): vLLM's part played with the
plugin's public test helper (lmcache_adp.testing, as installed in the image),
on CPU tensors.

    kv_client.py store   MP_PORT HTTP_PORT SEED   # store a prompt, wait until it is on L2
    kv_client.py restore MP_PORT HTTP_PORT SEED   # clear L1, look it up and retrieve it

The prompt and its KV follow from SEED, so `restore` in another container (or
after a server restart) knows what `store` wrote. Prints one JSON line.

Inside, not on the host: the server maps the client's KV through POSIX shared
memory (mode 0600), so the client must run as the image's user.

The client ends its last request and unregisters at once (vLLM's worker lives
on): VLLMClient.end_request waits for the server's answer to END_SESSION first
(see there; the image test's flaky "Error in blocking handler" was that race).
"""

import json
import os
import sys

os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")

from lmcache_adp import testing as d  # noqa: E402

TOKENS = 512  # two LMCache chunks


def main() -> int:
    op, port, http_port, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    server = d.RunningServer(port, http_port)  # started by its container, not here
    shape = d.KVShape(num_layers=4, num_heads=2, head_dim=64, num_blocks=2 * (TOKENS // 16) + 1)
    out: dict = {"op": op}
    with d.VLLMClient(server.url, shape) as client:
        if op == "store":
            stored = d.store_prompt(server, client, TOKENS, seed=seed)
            out["chunks"] = TOKENS // client.chunk_size
            out["l2_stored_chunks"] = server.metric(d.L2_STORED_CHUNKS)
            out["stored_bytes"] = len(stored.expected)
        else:
            stored = d.prefilled_prompt(client, TOKENS, seed)  # the prompt and KV `store` stored
            out["l1_after_clear"] = d.drop_l1(server)
            r = d.restore_prompt(server, client, stored)
            out.update(
                tokens=r.tokens,
                hit_tokens=r.hit_tokens,
                retrieved=r.retrieved,
                identical=r.identical,
                l2_loaded_chunks=r.l2_loaded_chunks,
                chunks=TOKENS // client.chunk_size,
            )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
