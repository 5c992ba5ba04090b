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

# alive PID: the process exists and is not a zombie. A JVM's main thread can be a zombie while
# its other threads still exit (and hold its sockets): that counts as alive.
alive() {
  local stat threads
  read -r stat threads < <(ps -o stat=,nlwp= -p "$1" 2>/dev/null) || return 1
  [ -n "$stat" ] || return 1
  [ "${stat#Z}" = "$stat" ] || [ "${threads:-1}" -gt 1 ]
}

# descendants PID: the PIDs of its children, their children and so on.
descendants() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$child"
    descendants "$child"
  done
}

# stop_pid PIDFILE [TIMEOUT_S]: TERM, wait up to TIMEOUT_S (30) for the exit, then KILL. Only
# PIDs this script started.
stop_pid() {
  local file=$1 timeout=${2:-30} pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((timeout * 2))); do
    alive "$pid" || { rm -f "$file"; return 0; }
    sleep 0.5
  done
  log "$pid did not exit within $timeout s of TERM; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$file"
}

# kill_pid PIDFILE: KILL the process and its descendants at once (a crash, not a shutdown) and
# wait until they are gone. Only PIDs this script started.
kill_pid() {
  local file=$1 pid pids
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  pids="$pid $(descendants "$pid" | tr '\n' ' ')"
  # shellcheck disable=SC2086 # one word per PID
  kill -KILL $pids 2>/dev/null || true
  for _ in $(seq 60); do
    local left=0 p
    for p in $pids; do alive "$p" && left=1; done
    ((left == 0)) && { rm -f "$file"; return 0; }
    sleep 0.5
  done
  die "$pids still alive 30 s after KILL"
}

# is_running PIDFILE
is_running() { [ -f "$1" ] && alive "$(cat "$1")"; }

# port_busy PORT: something listens on 127.0.0.1:PORT.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_ports_free TIMEOUT_S PORT...: until nothing listens on any of them (a process that just
# exited may hold its sockets a moment longer).
wait_ports_free() {
  local end=$((SECONDS + $1)) port; shift
  for port in "$@"; do
    while port_busy "$port"; do
      ((SECONDS < end)) || return 1
      sleep 0.2
    done
  done
}

# now_ms: wall-clock milliseconds, for the durations the scripts report.
now_ms() { date +%s%3N; }

# secs_since MS: the seconds since now_ms printed MS, with one decimal.
secs_since() { local d=$(($(now_ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

# rss_mib PID...: their resident memory together, in MiB.
rss_mib() {
  local total=0 kb p
  for p in "$@"; do
    kb=$(ps -o rss= -p "$p" 2>/dev/null | tr -d ' ') || continue
    total=$((total + ${kb:-0}))
  done
  echo $((total / 1024))
}

# tail_logs FILE...: the last lines of each, for a failed start.
tail_logs() {
  local f
  for f in "$@"; do
    [ -f "$f" ] && { echo "----- $f (last 40 lines)" >&2; tail -n 40 "$f" >&2; }
  done
}

# conf_set FILE: sets the `key=value` lines read from standard input in the properties file
# FILE, each in place of the key's line where FILE has one (other lines with that key are
# dropped), the rest at the end; the comment lines just above a key go with it. No key is left
# twice: Java's Properties takes a key's last value, but the bookie embedded in a Pulsar
# standalone reads a repeated key as a list and uses the first (`"gcWaitTime" : "[300000,
# 60000]"` in its log), so an appended override could be ignored there.
conf_set() {
  local file=$1 tmp
  tmp=$(mktemp "$file.XXXXXX")
  awk '
    function key_of(line) {
      if (line !~ /^[ \t]*[A-Za-z0-9_.-]+[ \t]*[=:]/) return ""
      sub(/^[ \t]*/, "", line)
      sub(/[ \t]*[=:].*$/, "", line)
      return line
    }
    FNR == NR {
      key = key_of($0)
      if (key == "") {
        if ($0 ~ /^[ \t]*#/) notes = notes $0 "\n"
        else notes = ""
        next
      }
      if (!(key in value)) order[++count] = key
      value[key] = notes $0
      notes = ""
      next
    }
    {
      key = key_of($0)
      if (key != "" && key in value) {
        if (!(key in done)) print value[key]
        done[key] = 1
        next
      }
      print
    }
    END {
      for (i = 1; i <= count; i++) if (!(order[i] in done)) print value[order[i]]
    }
  ' - "$file" > "$tmp" && mv "$tmp" "$file"
}

# conf_effective LOG...: for each `key=value` line read from standard input (an override given
# to conf_set), prints the value the broker logged for that key at start (the Pulsar broker's
# `ServiceConfiguration(... key=value, ...)`, its bookie's `"key" : "value"`, RocketMQ's
# `key=value` lines), the last one logged; returns 1 when one differs from the override or is
# not in the logs, so that an override that does not take effect is seen at start.
conf_effective() {
  local line key want got status=0
  while IFS= read -r line; do
    [[ $line =~ ^[[:space:]]*([A-Za-z0-9_.-]+)[[:space:]]*=(.*)$ ]] || continue
    key=${BASH_REMATCH[1]}
    want=${BASH_REMATCH[2]}
    got=$(grep -ohE "\"$key\" : \"[^\"]*\"|(^|[ (,\[])$key=[^,) ]*" "$@" 2>/dev/null | tail -n 1)
    if [[ -z $got ]]; then
      printf '  override %s=%s: NOT in the broker log\n' "$key" "$want" >&2
      status=1
      continue
    fi
    got=$(sed -E "s/^\"$key\" : \"(.*)\"$/\\1/; s/^.?$key=//" <<<"$got")
    if [[ $got != "$want" ]]; then
      printf '  override %s=%s: the broker uses %s\n' "$key" "$want" "$got" >&2
      status=1
    else
      printf '  override %s=%s: in effect\n' "$key" "$want" >&2
    fi
  done
  return $status
}
