#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The LMCache MP server with the ADP card as its L2 tier, embedded: the card
# store runs inside the server process, on a card image file (or a block device).
#
#   examples/run_server_embedded.sh [extra `lmcache server` flags]
#
# Settings (environment, with defaults):
#   ADP_CARD=~/.cache/lmcache-adp/card.img  card image (created sparse) or block device
#   ADP_CARD_SIZE_GB=64     size of the image when it is created; one object (an LMCache
#                           chunk, 256 tokens of Llama-8B = 32 MiB) must fit in half of it
#   ADP_L1_SIZE_GB=16       LMCache's CPU tier (L1)
#   ADP_MP_HOST=127.0.0.1 ADP_MP_PORT=5555          vLLM connects here (lmcache.mp.host/port)
#   ADP_HTTP_HOST=127.0.0.1 ADP_HTTP_PORT=8080      LMCache's HTTP API (/healthcheck, /metrics)
#   ADP_METRICS_PORT=N      the plugin's /metrics, /health and /stats on 127.0.0.1:N
#                           (adapter_params metrics_port; unset or 0: none). The image's
#                           healthcheck then asks its /health too (README, "The container image")
#   ADP_DRY_RUN=1           print the command instead of running it
#
# The script execs the server, so its PID is the server's: stop it with kill PID.
set -euo pipefail

card=${ADP_CARD:-${XDG_CACHE_HOME:-$HOME/.cache}/lmcache-adp/card.img}
# ADP_METRICS_PORT: adapter_params metrics_port, checked first (a value that is no port made the JSON malformed).
port=${ADP_METRICS_PORT:-0} metrics=
[[ $port =~ ^(0|[1-9][0-9]{0,4})$ ]] && ((port <= 65535)) ||
  { echo "ADP_METRICS_PORT=$port: a port number, 1-65535 (0 or unset: no metrics port)" >&2; exit 2; }
((port == 0)) || metrics=",\"metrics_port\":$port"
# ADP_CARD_SIZE_GB: checked as ADP_METRICS_PORT is (review33c: 64G went into the JSON as is, malformed).
size=${ADP_CARD_SIZE_GB:-64}
[[ $size =~ ^(0|[1-9][0-9]*)(\.[0-9]+)?$ ]] ||
  { echo "ADP_CARD_SIZE_GB=$size: a number of GiB, as 64 or 0.5 (the card image's size when it is created)" >&2; exit 2; }
# A path as a JSON string, escaped by a JSON encoder (a '"' or '\' in it made the JSON malformed; review33c).
json_str() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }
card_json=$(json_str "$card")
l2_adapter=$(printf '{"type":"native_plugin","module_path":"lmcache_adp","class_name":"ADPConnector","adapter_params":{"gateway":"embedded","card":%s,"card_size_gb":%s%s}}' \
  "$card_json" "$size" "$metrics")

cmd=(lmcache server
  --host "${ADP_MP_HOST:-127.0.0.1}" --port "${ADP_MP_PORT:-5555}"
  --http-host "${ADP_HTTP_HOST:-127.0.0.1}" --http-port "${ADP_HTTP_PORT:-8080}"
  --l1-size-gb "${ADP_L1_SIZE_GB:-16}" --eviction-policy LRU
  --l2-adapter "$l2_adapter"
  "$@")

if [[ ${ADP_DRY_RUN:-0} == 1 ]]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
mkdir -p "$(dirname "$card")"
exec "${cmd[@]}"
