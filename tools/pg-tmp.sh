#!/usr/bin/env bash
# A throwaway PostgreSQL server for the tests of the PostgreSQL store (issue 16).
#
#   eval "$(tools/pg-tmp.sh start)"  exports PGTMP_DIR PGHOST PGPORT PGUSER PGDATABASE DATABASE_URL
#   tools/pg-tmp.sh stop DIR         stop the server (immediate) and remove DIR
#   tools/pg-tmp.sh restart DIR      pg_ctl restart -m fast, same port: clients see their connections drop
#   tools/pg-tmp.sh kill DIR         stop -m immediate, like a crash; `start-again DIR` brings it back
#   tools/pg-tmp.sh start-again DIR  start a stopped/killed server of DIR on its old port
#
# Needs Debian's `postgresql` package (binaries in /usr/lib/postgresql/<v>/bin). The server refuses
# to run as root, so when we are root it runs as the `postgres` user (PGTMP_USER) via runuser.
# Env knobs: PGBIN, PGTMP_USER, PGTMP_PARENT (where the temp dir goes), PGTMP_PORT, PGTMP_OPTS.
set -euo pipefail
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
[ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ] || { echo "pg-tmp.sh: no initdb in PGBIN='$PGBIN' (/usr/lib/postgresql/*/bin; apt-get install -y postgresql)" >&2; exit 1; }
RUNAS=${PGTMP_USER:-postgres}
as_user() { if [ "$(id -u)" = 0 ]; then runuser -u "$RUNAS" -- "$@"; else "$@"; fi; }
need_dir() { [ -n "${1:-}" ] && [ -d "$1/data" ] || { echo "pg-tmp.sh: $2: '${1:-}' is not a pg-tmp.sh directory" >&2; exit 1; }; }

server_start() {  # DIR PORT
  # -k DIR: the socket lives in our own directory, not /var/run/postgresql (may not exist in a container)
  as_user "$PGBIN/pg_ctl" -D "$1/data" -l "$1/server.log" -w -t 60 \
    -o "-p $2 -k $1 -c listen_addresses=127.0.0.1 -c max_connections=300 ${PGTMP_OPTS:-}" start >/dev/null \
    || { tail -n 30 "$1/server.log" >&2; exit 1; }
}

case "${1:-}" in
start)
  DIR=$(if [ -n "${PGTMP_PARENT:-}" ]; then mktemp -d "$PGTMP_PARENT/pgtmp.XXXXXX"; else mktemp -d -t pgtmp.XXXXXX; fi)
  chmod 755 "$DIR"   # the postgres user must reach it; the socket lives here
  if [ "$(id -u)" = 0 ]; then chown "$RUNAS": "$DIR"; fi
  PORT=${PGTMP_PORT:-$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')}
  echo "$PORT" >"$DIR/port"
  # -N: skip initdb's own fsyncs (throwaway cluster); the running server still fsyncs
  as_user "$PGBIN/initdb" -D "$DIR/data" -U postgres -A trust -E UTF8 --locale=C.UTF-8 -N >"$DIR/initdb.log" 2>&1 \
    || { cat "$DIR/initdb.log" >&2; rm -rf "$DIR"; exit 1; }
  server_start "$DIR" "$PORT"
  echo "export PGTMP_DIR=$DIR PGHOST=$DIR PGPORT=$PORT PGUSER=postgres PGDATABASE=postgres"
  echo "export DATABASE_URL=postgresql://postgres@127.0.0.1:$PORT/postgres"
  ;;
stop)
  need_dir "${2:-}" stop
  as_user "$PGBIN/pg_ctl" -D "$2/data" -m immediate -w stop >/dev/null 2>&1 || true
  rm -rf "$2"
  ;;
restart)
  need_dir "${2:-}" restart
  # -m fast: the server terminates every session and rolls back open transactions, like an operator's restart
  as_user "$PGBIN/pg_ctl" -D "$2/data" -l "$2/server.log" -m fast -w -t 60 restart >/dev/null \
    || { tail -n 30 "$2/server.log" >&2; exit 1; }
  ;;
kill)
  need_dir "${2:-}" kill
  # -m immediate: no shutdown checkpoint, crash recovery on the next start, like a power cut of the server
  as_user "$PGBIN/pg_ctl" -D "$2/data" -m immediate -w stop >/dev/null
  ;;
start-again)
  need_dir "${2:-}" start-again
  server_start "$2" "$(cat "$2/port")"
  ;;
*) echo "usage: $0 start | stop DIR | restart DIR | kill DIR | start-again DIR" >&2; exit 1;;
esac
