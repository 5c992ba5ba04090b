# Shared helpers of the broker scripts. Sourced, not run.
# shellcheck shell=bash

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BROKERS_DIR=${BROKERS_DIR:-$REPO_ROOT/target/brokers}
JAVA=${JAVA:-$(command -v java)}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# retry N CMD...: runs CMD up to N times, 5 s apart.
retry() {
  local n=$1 i; shift
  for ((i = 1; i <= n; i++)); do
    "$@" && return 0
    ((i < n)) && { log "attempt $i of $n failed: $*; retrying"; sleep 5; }
  done
  return 1
}

# wait_tcp PORT TIMEOUT_S
wait_tcp() {
  local end=$((SECONDS + $2))
  until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do
    ((SECONDS < end)) || return 1
    sleep 0.5
  done
}

# wait_log FILE PATTERN TIMEOUT_S
wait_log() {
  local end=$((SECONDS + $3))
  until grep -q -- "$2" "$1" 2>/dev/null; do
    ((SECONDS < end)) || return 1
    sleep 0.5
  done
}

# Extra curl options of wait_http (a CA and a token for a broker with TLS and authentication).
CURL_OPTS=()

# wait_http URL SUBSTRING TIMEOUT_S
wait_http() {
  local end=$((SECONDS + $3))
  until curl -fsS --max-time 5 "${CURL_OPTS[@]}" "$1" 2>/dev/null | grep -q -- "$2"; do
    ((SECONDS < end)) || return 1
    sleep 1
  done
}

# stop_pid PIDFILE: TERM, wait up to 30 s, then KILL. Only PIDs this script started.
stop_pid() {
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 60); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$file"; return 0; }
    sleep 0.5
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$file"
}

# is_running PIDFILE
is_running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# tail_logs FILE...: the last lines of each, for a failed start.
tail_logs() {
  local f
  for f in "$@"; do
    [ -f "$f" ] && { echo "----- $f (last 40 lines)" >&2; tail -n 40 "$f" >&2; }
  done
}
