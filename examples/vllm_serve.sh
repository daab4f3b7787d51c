#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# vLLM with LMCache's MP connector, talking to an LMCache MP server started with
# run_server_embedded.sh or run_server_gateway.sh (GPU hosts; not run in CI).
#
#   examples/vllm_serve.sh MODEL [extra `vllm serve` flags]
#
# Settings (environment, with defaults): ADP_MP_HOST=127.0.0.1 ADP_MP_PORT=5555
# (the server's --host/--port), ADP_MP_TRANSFER_MODE (unset: the connector's
# default; `lmcache_driven` for vLLM's CPU engine, whose server supports no
# other), ADP_DRY_RUN=1 prints the command.
#
# kv_connector_module_path loads LMCacheMPConnector from the installed LMCache,
# so the connector always matches the LMCache the server runs (the copy bundled
# in vLLM can lag behind it). LMCache's MP server needs no YAML config: every
# setting is a `lmcache server` flag, the L2 tier included (--l2-adapter JSON).
set -euo pipefail

model=${1:?usage: vllm_serve.sh MODEL [vllm serve flags]}
shift

mode=${ADP_MP_TRANSFER_MODE:+,\"lmcache.mp.mp_transfer_mode\":\"$ADP_MP_TRANSFER_MODE\"}
kv_transfer_config=$(printf '{"kv_connector":"LMCacheMPConnector","kv_role":"kv_both","kv_connector_module_path":"lmcache.integration.vllm.lmcache_mp_connector","kv_connector_extra_config":{"lmcache.mp.host":"tcp://%s","lmcache.mp.port":%s%s}}' \
  "${ADP_MP_HOST:-127.0.0.1}" "${ADP_MP_PORT:-5555}" "$mode")

cmd=(vllm serve "$model" --kv-transfer-config "$kv_transfer_config" "$@")
if [[ ${ADP_DRY_RUN:-0} == 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
