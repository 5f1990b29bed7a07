#!/usr/bin/env bash
# Instructions per background Spawn, server side, under valgrind's
# callgrind (issue 36: a cost that does not drift with the machine's load):
#   scripts/spawn-instructions.sh [N]
# Runs subagentd (memory store, the simulated runner) under callgrind, sends
# N and then 3N background Spawns from 16 concurrent callers over 4
# connections, and reports (total(3N) - total(N)) / 2N: instructions per
# Spawn without start-up and shutdown. The same for the no-op server
# (`subagentd-bench noop-server`, a prebuilt SpawnResponse), and the ratio.
# Default N: 1000.
#
# BIN: the subagentd binary (default target/release/subagentd).
# STORE: subagentd's `[store] backend` (default memory; embedded puts its
#     data directory in a temporary folder).
# KEEP: a folder to copy the callgrind profiles into (default: none), for
#     callgrind_annotate.
# BENCH: the subagentd-bench binary (default target/release/subagentd-bench).
# PY: a Python with grpcio and the `subagentd` wheel installed (its
#     `subagents.v1` stubs), e.g. the venv `.ci/python-client.sh` leaves at
#     $SUBAGENTD_CLIENT_VENV: PY=$SUBAGENTD_CLIENT_VENV/bin/python.
set -euo pipefail
shopt -s inherit_errexit
N="${1:-1000}"
BIN="${BIN:-target/release/subagentd}"
BENCH="${BENCH:-target/release/subagentd-bench}"
PY="${PY:-python3}"
DIR="$(mktemp -d)"
VPID=0
# (`kill 0` would signal this whole process group: only a started server.)
trap '[ "$VPID" -gt 0 ] && kill -9 "$VPID" 2>/dev/null; rm -rf "$DIR"' EXIT

cat >"$DIR/config.toml" <<'EOF'
[limits]
max_background_agents = 4000000000
default_concurrency = 0
max_concurrent_per_parent = 0

[runs]
finished_retention = "1h"
EOF

cat >"$DIR/drive.py" <<'EOF'
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from subagents.v1 import subagents_pb2 as pb, subagents_pb2_grpc as rpc

addr, n = sys.argv[1], int(sys.argv[2])
stubs = [rpc.AgentServiceStub(grpc.insecure_channel(addr)) for _ in range(4)]
request = pb.SpawnRequest(agent="simulated", model="bench/m", prompt="hi", background=True)


def spawn(i: int) -> None:
    stubs[i % 4].Spawn(request, timeout=120)


# The port opens before the server serves (RECOVERING): one Spawn first,
# retried until it is taken. Both runs make it, so it cancels out.
while True:
    try:
        spawn(0)
        break
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        time.sleep(0.1)

with ThreadPoolExecutor(16) as pool:
    list(pool.map(spawn, range(n)))
EOF

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# total_instructions SERVER-ARGS... : runs the server under callgrind,
# drives $SPAWNS Spawns, stops it, prints callgrind's total.
total_instructions() {
  local port out
  port="$(free_port)"
  out="$DIR/callgrind.$port"
  SUBAGENTD_STORE__BACKEND="${STORE:-memory}" SUBAGENTD_STORE__PATH="$DIR/data.$port" \
    SUBAGENTD_TELEMETRY__METRICS_LISTEN=127.0.0.1:0 \
    SUBAGENTD_HTTP__LISTEN= SUBAGENTD_SERVER__SHUTDOWN_GRACE=0s RUST_LOG=warn \
    valgrind --tool=callgrind --callgrind-out-file="$out" "$@" --listen "127.0.0.1:$port" \
    >"$out.log" 2>&1 &
  VPID=$!
  for _ in $(seq 1 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  (cd "$DIR" && "$PY" drive.py "127.0.0.1:$port" "$SPAWNS")
  kill -TERM "$VPID"
  wait "$VPID" || true
  VPID=0
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$out" "$KEEP/"; fi
  sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out.log"
}

per_call() {
  local low high
  SPAWNS="$N" low="$(total_instructions "$@")"
  SPAWNS="$((3 * N))" high="$(total_instructions "$@")"
  echo $(( (high - low) / (2 * N) ))
}

spawn="$(per_call "$BIN" serve --config "$DIR/config.toml")"
noop="$(per_call "$BENCH" noop-server)"
echo "instructions per call: background Spawn $spawn, no-op server $noop, ratio $(
  "$PY" -c "print(f'{$spawn / $noop:.2f}')")"
