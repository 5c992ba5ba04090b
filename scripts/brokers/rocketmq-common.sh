# Shared helpers of the RocketMQ scripts (scripts/brokers/rocketmq, the standalone, and
# scripts/brokers/rocketmq-cluster). Sourced after common.sh, not run.
#
# The jars are fetched once into $BROKERS_DIR/rocketmq/lib-$RMQ_VERSION (where the standalone
# always kept them; its stop removes only its data, so the cluster shares them).
# shellcheck shell=bash

RMQ_VERSION=${RMQ_VERSION:-5.3.3}
RMQ_LIB_HOME=$BROKERS_DIR/rocketmq
LIB=$RMQ_LIB_HOME/lib-$RMQ_VERSION

# rmq_jvm_common HOME TMP: sets JVM_COMMON, the flags of every RocketMQ JVM (logs go under
# HOME/logs/rocketmqlogs, namesrv and broker defaults under HOME).
rmq_jvm_common() {
  JVM_COMMON=(
    -Duser.home="$1" -Djava.io.tmpdir="$2" -XX:+UseG1GC -XX:-OmitStackTraceInFastThrow
    --add-opens java.base/jdk.internal.ref=ALL-UNNAMED --add-opens java.base/java.nio=ALL-UNNAMED
    --add-opens java.base/java.util=ALL-UNNAMED --add-opens java.base/java.lang=ALL-UNNAMED
    --add-exports java.base/sun.nio.ch=ALL-UNNAMED
  )
}

# rmq_pick_store WORK FALLBACK [OVERRIDE]: where a store goes. RocketMQ 5.3 refuses every message
# ("the broker's disk is full") once the disk holding its store is over 90 % used, and that limit
# cannot be raised: the broker caps diskSpaceWarningLevelRatio at 0.90. A CI disk can be that
# full. The store holds only what a test run writes, so it goes on /dev/shm when that has 2 GiB
# free (named after WORK, so two scripts or checkouts never share one); otherwise, or when
# /dev/shm is missing or read-only, FALLBACK. OVERRIDE, when not empty, wins.
rmq_pick_store() {
  if [ -n "${3:-}" ]; then echo "$3"; return; fi
  local free_kib
  free_kib=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 }')
  if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "${free_kib:-0}" -ge $((2 * 1024 * 1024)) ]; then
    echo "/dev/shm/rocketmq-store-$(id -u)-$(printf %s "$1" | cksum | cut -d' ' -f1)"
  else
    echo "$2"
  fi
}

# rmq_fetch: the runtime jars (proxy, broker, name server, tools) from Maven Central, through a
# pom that imports rocketmq-all as a BOM; cached in ~/.m2 and in $LIB.
rmq_fetch() {
  if [ -f "$LIB/.complete" ]; then return 0; fi
  mkdir -p "$RMQ_LIB_HOME"
  cat > "$RMQ_LIB_HOME/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.brokers</groupId><artifactId>rocketmq-runtime</artifactId><version>0</version>
  <packaging>pom</packaging>
  <dependencyManagement><dependencies>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-all</artifactId>
      <version>$RMQ_VERSION</version><type>pom</type><scope>import</scope></dependency>
  </dependencies></dependencyManagement>
  <dependencies>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-proxy</artifactId><version>$RMQ_VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-namesrv</artifactId><version>$RMQ_VERSION</version></dependency>
    <dependency><groupId>org.apache.rocketmq</groupId><artifactId>rocketmq-tools</artifactId><version>$RMQ_VERSION</version></dependency>
  </dependencies>
</project>
POM
  log "fetching RocketMQ $RMQ_VERSION from Maven Central (cached in ~/.m2)"
  rm -rf "$LIB"
  # Maven's output goes to stderr: stdout carries only the address lines.
  retry 3 mvn -B -q -f "$RMQ_LIB_HOME/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$LIB" >&2 || die "could not fetch RocketMQ $RMQ_VERSION"
  touch "$LIB/.complete"
}

# mqadmin ARGS...: the admin CLI (JVM_COMMON must be set), stdout and stderr together.
mqadmin() {
  "$JAVA" -Xmx256m "${JVM_COMMON[@]}" -Drmq.logback.configurationFile=rmq.tools.logback.xml \
    -cp "$LIB/*" org.apache.rocketmq.tools.command.MQAdminStartup "$@" 2>&1
}

# mqadmin_until TIMEOUT_S CHECK ARGS...: runs mqadmin ARGS, again and again (1 s apart) until
# CHECK FILE (a command; FILE holds the output so far) succeeds or TIMEOUT_S pass. An mqadmin
# JVM prints its answer in 1-2 s and then spends 3-5 s in its own shutdown (its remoting
# clients' event threads poll every 3 s): once CHECK succeeds the JVM is killed (by its PID; it
# has nothing to keep). On a timeout the last output goes to stderr.
mqadmin_until() {
  local timeout=$1 check=$2 end out pid; shift 2
  end=$((SECONDS + timeout))
  out=$(mktemp "${TMPDIR:-/tmp}/mqadmin.XXXXXX")
  while :; do
    "$JAVA" -Xmx256m "${JVM_COMMON[@]}" -Drmq.logback.configurationFile=rmq.tools.logback.xml \
      -cp "$LIB/*" org.apache.rocketmq.tools.command.MQAdminStartup "$@" > "$out" 2>&1 < /dev/null &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
      if "$check" "$out"; then
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        rm -f "$out"
        return 0
      fi
      sleep 0.1
    done
    wait "$pid" 2>/dev/null || true
    if "$check" "$out"; then rm -f "$out"; return 0; fi
    if ((SECONDS >= end)); then cat "$out" >&2; rm -f "$out"; return 1; fi
    sleep 1
  done
}

# says_success FILE: mqadmin's updateTopic / updateSubGroup line "... success".
says_success() { grep -q success "$1"; }

# admin_until_success WHAT ARGS...: mqadmin exits 0 even on failure; look for "success", for
# up to 60 s.
admin_until_success() {
  local what=$1; shift
  mqadmin_until 60 says_success "$@" || die "mqadmin could not $what"
}

# rmq_launch PIDFILE OUTFILE JVM_FLAGS_AND_CLASS_AND_ARGS...: one JVM in its own session, its
# output appended to OUTFILE (the caller marks where this start begins, see out_mark).
rmq_launch() {
  local pidfile=$1 out=$2; shift 2
  setsid "$JAVA" "$@" >> "$out" 2>&1 < /dev/null &
  echo $! > "$pidfile"
}

# out_mark FILE: its current line count (0 when missing), for wait_started.
out_mark() { if [ -f "$1" ]; then wc -l < "$1"; else echo 0; fi; }

# wait_started PIDFILE OUTFILE MARK PATTERN TIMEOUT_S: PATTERN appears in OUTFILE after line
# MARK; fails at once when the process exits first.
wait_started() {
  local pidfile=$1 out=$2 mark=$3 pattern=$4 end=$((SECONDS + $5))
  until tail -n +"$((mark + 1))" "$out" 2>/dev/null | grep -q -- "$pattern"; do
    is_running "$pidfile" || { log "$(basename "$pidfile" .pid) exited during its start"; return 1; }
    ((SECONDS < end)) || return 1
    sleep 0.2
  done
}

# wait_port_closed PORT TIMEOUT_S: until nothing accepts on it.
wait_port_closed() { wait_ports_free "$2" "$1"; }

# clock_ms MS: the wall-clock time of now_ms's MS, HH:MM:SS.mmm.
clock_ms() { printf '%s.%03d' "$(date -d "@$(($1 / 1000))" +%H:%M:%S)" $(($1 % 1000)); }

# ms_between FROM TO: TO - FROM in seconds with one decimal.
ms_between() { local d=$(($2 - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

# registered_brokers NAMESRV: the broker names clusterList shows, one a line.
registered_brokers() {
  mqadmin clusterList -n "$1" | awk 'NR > 1 && $1 != "" && $1 !~ /^#/ { print $2 }' | sort -u
}

# The brokers lists_wanted and routes_wanted look for.
WANTED=()

# lists_wanted FILE: clusterList output that names every broker in WANTED.
lists_wanted() {
  local b
  for b in "${WANTED[@]}"; do
    awk -v b="$b" 'NR > 1 && $2 == b { found = 1 } END { exit !found }' "$1" || return 1
  done
}

# routes_wanted FILE: topicRoute output whose JSON is complete and names every broker in WANTED
# in its queue data.
routes_wanted() {
  local b
  grep -q '"queueDatas"' "$1" || return 1
  for b in "${WANTED[@]}"; do
    grep -q "\"brokerName\" *: *\"$b\"" "$1" || return 1
  done
}

# wait_registered NAMESRV BROKER... TIMEOUT_S: clusterList shows every BROKER (registered with
# the name server, with its topics).
wait_registered() {
  local ns=$1 args=("${@:2}")
  local timeout=${args[-1]}
  unset 'args[-1]'
  WANTED=("${args[@]}")
  mqadmin_until "$timeout" lists_wanted clusterList -n "$ns" > /dev/null 2>&1
}

# wait_route NAMESRV TOPIC TIMEOUT_S BROKER...: topicRoute of TOPIC names every BROKER (so it was
# registered with its queues: what a proxy's route lookup sees).
wait_route() {
  local ns=$1 topic=$2 timeout=$3; shift 3
  WANTED=("$@")
  mqadmin_until "$timeout" routes_wanted topicRoute -n "$ns" -t "$topic"
}
