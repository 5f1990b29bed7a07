#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the PostgreSQL store's tests
# (src/store/postgres.rs): one server per CI run, one database per test.
#
#   eval "$(.ci/postgres.sh start)"   # starts it; sets SUBAGENTD_TEST_POSTGRES
#   .ci/postgres.sh stop              # stops it and removes its data
#
# `start` prints only the export line on stdout (everything else goes to
# stderr), so `eval` sees nothing else. The server trusts every local
# connection (`initdb -A trust`), listens on 127.0.0.1 only, and keeps its
# data and socket in a fresh temporary directory whose path is kept in
# $STATE, so `stop` finds it from another shell. PostgreSQL refuses to run
# as root: as root, the server runs as the `postgres` user.
set -euo pipefail

PORT="${SUBAGENTD_CI_POSTGRES_PORT:-55432}"
STATE="${SUBAGENTD_CI_POSTGRES_STATE:-/tmp/subagentd-ci-postgres.dir}"
URL="postgres://subagentd@127.0.0.1:$PORT/postgres"

log() { echo "postgres.sh: $*" >&2; }

# The newest installed server's bin directory (not a hard-coded version).
bin_dir() {
  local dirs
  dirs="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V || true)"
  [ -n "$dirs" ] && [ -x "$(tail -n1 <<<"$dirs")/initdb" ] && tail -n1 <<<"$dirs"
}

# Runs a command as the server's user: `postgres` when we are root.
as_server() {
  if [ "$(id -u)" -eq 0 ]; then
    su postgres -s /bin/sh -c 'exec "$0" "$@"' -- "$@"
  else
    "$@"
  fi
}

stop() {
  if [ ! -f "$STATE" ]; then
    log "no server to stop ($STATE does not exist)"
    return 0
  fi
  local dir bin
  dir="$(cat "$STATE")"
  bin="$(bin_dir)"
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_server "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || log "pg_ctl stop failed"
  fi
  rm -rf "$dir"
  rm -f "$STATE"
  log "stopped and removed $dir"
}

start() {
  # A server left by an earlier run that was not stopped holds the port.
  [ -f "$STATE" ] && stop
  if ! bin_dir >/dev/null; then
    log "installing PostgreSQL (no /usr/lib/postgresql/*/bin/initdb)"
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql >&2
  fi
  local bin dir
  bin="$(bin_dir)"
  dir="$(mktemp -d /tmp/subagentd-ci-postgres.XXXXXX)"
  echo "$dir" >"$STATE"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres:postgres "$dir"
  fi
  as_server "$bin/initdb" -D "$dir/data" -A trust -U subagentd >/dev/null
  if ! as_server "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start \
    -o "-p $PORT -k $dir -c listen_addresses=127.0.0.1" >&2; then
    log "the server did not start; its log:"
    cat "$dir/log" >&2 || true
    stop
    exit 1
  fi
  log "started $("$bin/postgres" --version) on 127.0.0.1:$PORT, data in $dir"
  echo "export SUBAGENTD_TEST_POSTGRES=$URL"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
