#!/usr/bin/env bash
# Failover time of two servers on one PostgreSQL database (issue 14):
#   scripts/failover-bench.sh postgres://user@host:port/db [kills]
# Starts two servers (default [ha] settings unless SUBAGENTD_HA__* says
# otherwise), then, `kills` times (default 10): SIGKILLs the leader and
# measures the time from the kill until a background Spawn through the
# other server succeeds (retried every 50 ms); restarts the killed one,
# which comes back as a standby. Prints one line per kill and the summary.
# BIN picks the binary (default target/release/subagentd).
set -euo pipefail
URL="${1:?usage: $0 POSTGRES_URL [kills]}"
KILLS="${2:-10}"
BIN="${BIN:-target/release/subagentd}"
DIR="$(mktemp -d)"
PORTS=(50161 50162)
PIDS=(0 0)
trap 'kill -9 "${PIDS[@]}" 2>/dev/null || true; rm -rf "$DIR"' EXIT

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

start() { # start <index>: a server on PORTS[index], its log in DIR/<index>.log
  local i="$1"
  : >"$DIR/$i.log"
  SUBAGENTD_STORE__BACKEND=postgres SUBAGENTD_STORE__URL="$URL" \
    SUBAGENTD_TELEMETRY__METRICS_LISTEN="" SUBAGENTD_TELEMETRY__LOG_FORMAT=json \
    "$BIN" serve --listen "127.0.0.1:${PORTS[$i]}" 2>>"$DIR/$i.log" >/dev/null &
  PIDS[$i]=$!
}

spawn_via() { # spawn_via <index>: one background Spawn through that server
  SUBAGENTD_ADDR="http://127.0.0.1:${PORTS[$1]}" "$BIN" spawn --background \
    --agent simulated --model acme/m --prompt "failover" >/dev/null 2>&1
}

until_spawns() { # until_spawns <index>: retries until a Spawn succeeds
  until spawn_via "$1"; do sleep 0.05; done
}

start 0
until_spawns 0
start 1
until_spawns 1
times=()
for k in $(seq 1 "$KILLS"); do
  leader=""
  for i in 0 1; do
    if grep -q '"leading: serving"' "$DIR/$i.log"; then leader="$i"; fi
  done
  [ -n "$leader" ] || { echo "no leader found" >&2; exit 1; }
  other=$((1 - leader))
  kill -9 "${PIDS[$leader]}"
  killed=$(now_ms)
  wait "${PIDS[$leader]}" 2>/dev/null || true
  until_spawns "$other"
  took=$(( $(now_ms) - killed ))
  times+=("$took")
  echo "kill $k: Spawn through the new leader after ${took} ms"
  start "$leader"
  until_spawns "$leader"
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
echo "failover over $KILLS kills (ms): min $(head -1 <<<"$sorted"), median $(sed -n "$(( (KILLS + 1) / 2 ))p" <<<"$sorted"), max $(tail -1 <<<"$sorted")"
