#!/usr/bin/env bash
# Throwaway PostgreSQL servers on loopback for the PostgreSQL store's tests
# (src/store/postgres/): one server per CI run, one database per test.
#
#   eval "$(.ci/postgres.sh start)"       # starts it; sets SUBAGENTD_TEST_POSTGRES
#   .ci/postgres.sh stop                  # stops it and removes its data
#   eval "$(.ci/postgres.sh start-tls)"   # a second one that speaks only TLS
#   .ci/postgres.sh stop-tls
#
# `start` prints only the export line on stdout (everything else goes to
# stderr), so `eval` sees nothing else. The server trusts every local
# connection (`initdb -A trust`), listens on 127.0.0.1 only, and keeps its
# data and socket in a fresh temporary directory whose path is kept in
# $STATE, so `stop` finds it from another shell. PostgreSQL refuses to run
# as root: as root, the server runs as the `postgres` user.
#
# `start-tls` starts another server (port 55433) with `ssl = on` and a test
# CA made with openssl: its certificate is issued for `localhost` only (so
# 127.0.0.1 is a wrong host name for verify-full), plain-text connections
# are rejected (a client that silently fell back to plain text fails
# loudly), and the role `certuser` logs in by client certificate
# (PostgreSQL's `cert` authentication). It sets SUBAGENTD_TEST_POSTGRES_TLS
# (a verify-full URL) and SUBAGENTD_TEST_POSTGRES_TLS_PKI (a folder with
# ca.crt, other-ca.crt — a CA the server does not use —, client.crt and
# client.key for certuser).
set -euo pipefail

PORT="${SUBAGENTD_CI_POSTGRES_PORT:-55432}"
STATE="${SUBAGENTD_CI_POSTGRES_STATE:-/tmp/subagentd-ci-postgres.dir}"
TLS_PORT="${SUBAGENTD_CI_POSTGRES_TLS_PORT:-55433}"
TLS_STATE="${SUBAGENTD_CI_POSTGRES_TLS_STATE:-/tmp/subagentd-ci-postgres-tls.dir}"

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

stop() { # STATE
  local state="$1"
  if [ ! -f "$state" ]; then
    log "no server to stop ($state does not exist)"
    return 0
  fi
  local dir bin
  dir="$(cat "$state")"
  bin="$(bin_dir)"
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_server "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || log "pg_ctl stop failed"
  fi
  rm -rf "$dir"
  rm -f "$state"
  log "stopped and removed $dir"
}

# A test CA, a server certificate for localhost from it, a client
# certificate for the role certuser, and an unrelated CA, in $1.
make_pki() {
  local pki="$1"
  if ! command -v openssl >/dev/null; then
    log "installing openssl (for the test CA)"
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y openssl >&2
  fi
  mkdir -p "$pki"
  (
    cd "$pki"
    ca() { # NAME CN
      openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$2" \
        -keyout "$1.key" -out "$1.crt" 2>/dev/null
    }
    issue() { # NAME CN EXTENSIONS
      openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    ca ca "subagentd test CA"
    ca other-ca "another CA"
    issue server localhost "subjectAltName=DNS:localhost"
    issue client certuser "extendedKeyUsage=clientAuth"
  )
}

# start PORT STATE [tls]
start() {
  local port="$1" state="$2" tls="${3:-}"
  # A server left by an earlier run that was not stopped holds the port.
  [ -f "$state" ] && stop "$state"
  if ! bin_dir >/dev/null; then
    log "installing PostgreSQL (no /usr/lib/postgresql/*/bin/initdb)"
    apt-get update >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql >&2
  fi
  local bin dir options
  bin="$(bin_dir)"
  dir="$(mktemp -d /tmp/subagentd-ci-postgres.XXXXXX)"
  echo "$dir" >"$state"
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres:postgres "$dir"
  fi
  as_server "$bin/initdb" -D "$dir/data" -A trust -U subagentd >/dev/null
  options="-p $port -k $dir -c listen_addresses=127.0.0.1"
  if [ -n "$tls" ]; then
    make_pki "$dir/pki"
    # The server's own copies: its key readable by it alone.
    cp "$dir/pki/server.crt" "$dir/pki/server.key" "$dir/pki/ca.crt" "$dir/data/"
    chmod 600 "$dir/data/server.key"
    if [ "$(id -u)" -eq 0 ]; then
      chown postgres:postgres "$dir/data/server.crt" "$dir/data/server.key" "$dir/data/ca.crt"
    fi
    chmod -R a+rX "$dir/pki"
    chmod 600 "$dir"/pki/*.key
    cat >"$dir/data/pg_hba.conf" <<'HBA'
local     all  all                    trust
hostssl   all  certuser  127.0.0.1/32 cert
hostssl   all  all       127.0.0.1/32 trust
hostnossl all  all       0.0.0.0/0    reject
HBA
    options="$options -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c ssl_ca_file=ca.crt"
  fi
  if ! as_server "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start -o "$options" >&2; then
    log "the server did not start; its log:"
    cat "$dir/log" >&2 || true
    stop "$state"
    exit 1
  fi
  log "started $("$bin/postgres" --version) on 127.0.0.1:$port${tls:+ (TLS only)}, data in $dir"
  if [ -n "$tls" ]; then
    psql -h "$dir" -p "$port" -U subagentd -d postgres -q -c "CREATE ROLE certuser LOGIN CREATEDB" >&2
    # Quoted: the URL holds '&'.
    echo "export SUBAGENTD_TEST_POSTGRES_TLS='postgres://subagentd@localhost:$port/postgres?hostaddr=127.0.0.1&sslmode=verify-full&sslrootcert=$dir/pki/ca.crt'"
    echo "export SUBAGENTD_TEST_POSTGRES_TLS_PKI='$dir/pki'"
  else
    echo "export SUBAGENTD_TEST_POSTGRES=postgres://subagentd@127.0.0.1:$port/postgres"
  fi
}

case "${1:-}" in
  start) start "$PORT" "$STATE" ;;
  stop) stop "$STATE" ;;
  start-tls) start "$TLS_PORT" "$TLS_STATE" tls ;;
  stop-tls) stop "$TLS_STATE" ;;
  *)
    echo "usage: $0 start|stop|start-tls|stop-tls" >&2
    exit 2
    ;;
esac
