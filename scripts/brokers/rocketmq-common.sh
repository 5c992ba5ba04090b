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

# admin_until_success WHAT ARGS...: mqadmin exits 0 even on failure; look for "success".
admin_until_success() {
  local what=$1 end=$((SECONDS + 60)) out; shift
  until out=$(mqadmin "$@") && grep -q success <<<"$out"; do
    ((SECONDS < end)) || { echo "$out" >&2; die "mqadmin could not $what"; }
    sleep 1
  done
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

# wait_registered NAMESRV BROKER TIMEOUT_S: clusterList shows BROKER (its registration with the
# name server, with its topics).
wait_registered() {
  local end=$((SECONDS + $3))
  until registered_brokers "$1" | grep -qx -- "$2"; do
    ((SECONDS < end)) || return 1
    sleep 1
  done
}

# wait_route NAMESRV TOPIC TIMEOUT_S BROKER...: topicRoute of TOPIC names every BROKER (so it was
# registered with its queues: what a proxy's route lookup sees).
wait_route() {
  local ns=$1 topic=$2 end=$((SECONDS + $3)) out b missing; shift 3
  while :; do
    out=$(mqadmin topicRoute -n "$ns" -t "$topic")
    missing=0
    for b in "$@"; do grep -q "\"brokerName\" *: *\"$b\"" <<<"$out" || missing=1; done
    ((missing == 0)) && return 0
    ((SECONDS < end)) || { echo "$out" >&2; return 1; }
    sleep 1
  done
}
