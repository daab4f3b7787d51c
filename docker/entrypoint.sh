#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Entrypoint of the lmcache-adp image: one role per container.
#
#   gateway          lmcache-adp gateway on $ADP_CARD, serving $ADP_SOCKET
#   lmcache-server   the LMCache MP server with the card as L2: embedded on
#                    $ADP_CARD, or through a gateway when $ADP_GATEWAY is set
#                    (unix:///path/to/gateway.sock, a volume shared with it)
#   vllm MODEL ...   vllm serve with LMCacheMPConnector to $ADP_MP_HOST:$ADP_MP_PORT
#   healthcheck      what HEALTHCHECK runs: checks the role this container started
#                    (lmcache-server: LMCache's /healthcheck, and the plugin's /health
#                    when $ADP_METRICS_PORT is set)
#
# Extra arguments go to the role's program. Settings are the ADP_* variables of
# the launch scripts in /opt/lmcache-adp (examples/ in the repository).
set -euo pipefail

scripts=${ADP_SCRIPTS:-/opt/lmcache-adp}
role_file=${ADP_ROLE_FILE:-/tmp/lmcache-adp.role}
role=${1:-lmcache-server}
shift || true

case $role in
  gateway)
    echo gateway >"$role_file"
    # Named as the launch scripts name it (review33c: argparse's refusal named --card-size-gb, not the setting).
    size=${ADP_CARD_SIZE_GB:-64}
    [[ $size =~ ^(0|[1-9][0-9]*)(\.[0-9]+)?$ ]] ||
      { echo "ADP_CARD_SIZE_GB=$size: a number of GiB, as 64 or 0.5 (the card image's size when it is created)" >&2; exit 2; }
    exec lmcache-adp gateway --card "$ADP_CARD" --card-size-gb "$size" --socket "$ADP_SOCKET" "$@"
    ;;
  lmcache-server)
    echo lmcache-server >"$role_file"
    if [[ -n ${ADP_GATEWAY:-} ]]; then
      # run_server_gateway.sh takes a socket path: a tcp:// value became "unix://tcp://...", refused by the
      # plugin as an unsupported gateway with no word about ADP_GATEWAY (audit 15).
      if [[ $ADP_GATEWAY != unix:///* ]]; then
        echo "ADP_GATEWAY=$ADP_GATEWAY: this role takes a gateway's Unix socket, unix:///path/to/gateway.sock" \
          "(a volume shared with the gateway's container); a tcp:// gateway is not supported here" >&2
        exit 2
      fi
      ADP_START_GATEWAY=0 ADP_SOCKET=${ADP_GATEWAY#unix://} exec "$scripts/run_server_gateway.sh" "$@"
    fi
    exec "$scripts/run_server_embedded.sh" "$@"
    ;;
  vllm)
    echo vllm >"$role_file"
    exec "$scripts/vllm_serve.sh" "$@"
    ;;
  healthcheck)
    started=$(cat "$role_file" 2>/dev/null || echo none)
    case $started in
      # One line on failure (the container's health log keeps it), not a Python traceback.
      gateway) exec python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5)
try:
    s.connect(sys.argv[1])
except OSError as e:
    sys.exit(f"unhealthy: gateway socket {sys.argv[1]}: {e.strerror or e}")' "$ADP_SOCKET" ;;
      # LMCache's /healthcheck answers while its L1 serves, whatever the card or the gateway do; with
      # ADP_METRICS_PORT set the plugin's /health is asked too, so that an unreachable gateway or a card
      # failing I/O reads unhealthy (a choice: such a server still serves from L1; README, "The container image").
      lmcache-server)
        urls=("http://127.0.0.1:${ADP_HTTP_PORT:-8080}/healthcheck")
        [[ ${ADP_METRICS_PORT:-0} == 0 ]] || urls+=("http://127.0.0.1:$ADP_METRICS_PORT/health") ;;
      vllm) urls=("http://127.0.0.1:${ADP_VLLM_PORT:-8000}/health") ;;
      *) echo "no role started in this container" >&2; exit 1 ;;
    esac
    # Not only OSError: a port answered by something that is not HTTP raises http.client's
    # BadStatusLine (an HTTPException), a bad port number InvalidURL (a ValueError). An error status
    # (HTTPError) names the reasons of the plugin's /health body, where it has them.
    exec python3 -c 'import http.client, json, sys, urllib.error, urllib.request
for url in sys.argv[1:]:
    try:
        status = urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as e:
        try:
            why = "; ".join(json.loads(e.read()).get("reasons", []))
        except (OSError, ValueError, AttributeError, TypeError):
            why = ""
        sys.exit(f"unhealthy: {url} answered {e.code}" + (f": {why}" if why else ""))
    except (OSError, http.client.HTTPException, ValueError) as e:
        why = str(getattr(e, "reason", None) or e).strip()  # a status line keeps its CRLF
        sys.exit(f"unhealthy: {url}: {why}")
    if status != 200:
        sys.exit(f"unhealthy: {url} answered {status}")' "${urls[@]}"
    ;;
  *)
    echo "usage: entrypoint.sh gateway|lmcache-server|vllm|healthcheck [args]" >&2
    exit 2
    ;;
esac
