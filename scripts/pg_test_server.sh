#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server on localhost for the test suite and prints its URL.
# Installs Debian's postgresql package first if no server binaries are present.
# Usage: export SPECSWEEP_TEST_PG_URL=$(bash scripts/pg_test_server.sh)
set -euo pipefail
PORT=${SPECSWEEP_PG_PORT:-55432}
DATA=${SPECSWEEP_PG_DATA:-/tmp/specsweep-pg}
bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/pg_ctl" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi
run_as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if ! run_as_pg "$bindir/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
  rm -rf "$DATA"
  mkdir -p "$DATA"
  [ "$(id -u)" = 0 ] && chown postgres "$DATA"
  run_as_pg "$bindir/initdb" -D "$DATA" -A trust -U specsweep >/dev/null
  run_as_pg "$bindir/pg_ctl" -D "$DATA" -l "$DATA/server.log" \
    -o "-p $PORT -k /tmp -c listen_addresses=127.0.0.1 -c max_connections=200" -w start >/dev/null
fi
echo "postgresql+psycopg://specsweep@127.0.0.1:${PORT}/postgres"
