#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The gateway daemon on the card, and the LMCache MP server using it as its L2
# tier over the gateway's Unix socket (payload through its shared-memory ring).
# On a production host run the gateway as a service (lmcache-adp-gateway.service)
# and set ADP_START_GATEWAY=0: this script then only starts the server.
#
#   examples/run_server_gateway.sh [extra `lmcache server` flags]
#   examples/run_server_gateway.sh --shm-name lmcache-l1   # L1 in /dev/shm: the gateway loads into it
#                                                           # in place (README, "Through the gateway")
#
# Settings (environment, with defaults):
#   ADP_CARD=~/.cache/lmcache-adp/card.img  card image or block device (the gateway's)
#   ADP_CARD_SIZE_GB=64     size of the image when it is created
#   ADP_SOCKET=${XDG_RUNTIME_DIR:-/tmp}/lmcache-adp/gateway.sock
#   ADP_START_GATEWAY=1     start `lmcache-adp gateway` here (0: use a running one)
#   ADP_L1_SIZE_GB=16  ADP_MP_HOST=127.0.0.1  ADP_MP_PORT=5555
#   ADP_HTTP_HOST=127.0.0.1  ADP_HTTP_PORT=8080
#   ADP_METRICS_PORT=N      the plugin's /metrics, /health and /stats on 127.0.0.1:N
#                           (adapter_params metrics_port; unset or 0: none). The image's
#                           healthcheck then asks its /health too (README, "The container image")
#   ADP_DRY_RUN=1           print the commands instead of running them
#
# SIGTERM/SIGINT to this script stops the server, then the gateway it started.
set -euo pipefail

card=${ADP_CARD:-${XDG_CACHE_HOME:-$HOME/.cache}/lmcache-adp/card.img}
socket=${ADP_SOCKET:-${XDG_RUNTIME_DIR:-/tmp}/lmcache-adp/gateway.sock}
# ADP_METRICS_PORT: adapter_params metrics_port, checked first (a value that is no port made the JSON malformed).
port=${ADP_METRICS_PORT:-0} metrics=
[[ $port =~ ^(0|[1-9][0-9]{0,4})$ ]] && ((port <= 65535)) ||
  { echo "ADP_METRICS_PORT=$port: a port number, 1-65535 (0 or unset: no metrics port)" >&2; exit 2; }
((port == 0)) || metrics=",\"metrics_port\":$port"
if [[ ${ADP_START_GATEWAY:-1} == 1 ]]; then  # the size is the started gateway's only
  # ADP_CARD_SIZE_GB: checked as ADP_METRICS_PORT is (review33c: the gateway refused 64G naming its flag, not this).
  size=${ADP_CARD_SIZE_GB:-64}
  [[ $size =~ ^(0|[1-9][0-9]*)(\.[0-9]+)?$ ]] ||
    { echo "ADP_CARD_SIZE_GB=$size: a number of GiB, as 64 or 0.5 (the card image's size when it is created)" >&2; exit 2; }
fi
# A path as a JSON string, escaped by a JSON encoder (a '"' or '\' in it made the JSON malformed; review33c).
json_str() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }
gateway_json=$(json_str "unix://$socket")
l2_adapter=$(printf '{"type":"native_plugin","module_path":"lmcache_adp","class_name":"ADPConnector","adapter_params":{"gateway":%s%s}}' "$gateway_json" "$metrics")

gateway_cmd=(lmcache-adp gateway --card "$card" --card-size-gb "${size:-64}" --socket "$socket")
server_cmd=(lmcache server
  --host "${ADP_MP_HOST:-127.0.0.1}" --port "${ADP_MP_PORT:-5555}"
  --http-host "${ADP_HTTP_HOST:-127.0.0.1}" --http-port "${ADP_HTTP_PORT:-8080}"
  --l1-size-gb "${ADP_L1_SIZE_GB:-16}" --eviction-policy LRU
  --l2-adapter "$l2_adapter"
  "$@")

if [[ ${ADP_DRY_RUN:-0} == 1 ]]; then
  [[ ${ADP_START_GATEWAY:-1} == 1 ]] && { printf '%q ' "${gateway_cmd[@]}"; echo; }
  printf '%q ' "${server_cmd[@]}"; echo
  exit 0
fi

gateway_pid=
server_pid=
stop() {
  [[ -n $server_pid ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" || true
  [[ -n $gateway_pid ]] && kill -TERM "$gateway_pid" 2>/dev/null && wait "$gateway_pid" || true
}
trap 'stop; exit 143' TERM INT
trap stop EXIT

if [[ ${ADP_START_GATEWAY:-1} == 1 ]]; then
  mkdir -p "$(dirname "$card")" "$(dirname "$socket")"
  "${gateway_cmd[@]}" &
  gateway_pid=$!
  for _ in $(seq 600); do  # up to 60 s: a large card recovers its index first
    [[ -S $socket ]] && break
    kill -0 "$gateway_pid" 2>/dev/null || { echo "lmcache-adp gateway exited" >&2; exit 1; }
    sleep 0.1
  done
  [[ -S $socket ]] || { echo "no gateway socket at $socket after 60 s" >&2; exit 1; }
fi

"${server_cmd[@]}" &
server_pid=$!
wait "$server_pid"
