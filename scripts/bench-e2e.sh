#!/usr/bin/env bash
# One reproducible end-to-end benchmark on real brokers (release builds): ours against the
# official clients, 1 KiB messages, one fresh topic per measurement, interleaved runs, medians.
#
#   scripts/bench-e2e.sh --quick                       # smoke run: short windows, 1 run
#   scripts/bench-e2e.sh --runs 3 --clients ours,java  # the run BENCHMARKS.md quotes (~40 min)
#   scripts/bench-e2e.sh --runs 5 --paths pulsar-produce --clients ours,java --settings tuned
#   flags: --runs N --paths LIST --clients ours,java,python,pulsar-rs --settings tuned,defaults
#          --warmup SECS (20) --window SECS (30) --broker-warmup SECS (60) --backlog N
#          --rocketmq-backlog N --size BYTES
#          --out DIR (target/bench-e2e)
#
# Produce paths run in steady state: each client sends without end, its window opens after the
# warm-up (the JVM's JIT included) and lasts the window; a "tuned" table (each client at the
# settings its docs recommend for throughput) and a "defaults" table (each as shipped) from the
# same run. Paths: pulsar-produce (ours, pulsar-perf from the Pulsar distribution; 10,000 and
# 1,000 in flight), pulsar-consume (ours, Java, Python, the pulsar crate; Shared, individual
# acks), rocketmq-produce (ours, Java; 256 in flight), rocketmq-produce-batch (ours in
# batches of 32 by send_batch, 256 messages in flight; Java as rocketmq-produce, its client
# has no batch send), rocketmq-consume (ours, Java push
# consumers), rocketmq-simple (ours, Java simple consumers; warm-up excluded), pulsar-latency
# and rocketmq-latency (publish to receive at a fixed rate, steady state; ours, Java). Tuned,
# our producers run on a current-thread runtime. The backlog consume paths drain a backlog
# (not steady state yet). Before the first run our producer sends to each broker for
# --broker-warmup SECS (60), not recorded: a broker started moments ago otherwise runs its own
# JIT warm-up within the first measurement. Each row has the brokers' CPU within its window
# ("broker cores"). See bench-tools/src/bin/e2e_load/main.rs.
#
# Brokers: uses those named by PULSAR_SERVICE_URL (+ PULSAR_ADMIN_URL, default
# http://127.0.0.1:8080) and ROCKETMQ_ENDPOINT; otherwise starts what the chosen paths need
# through scripts/brokers and stops what it started on exit. A Pulsar already listening on
# 127.0.0.1:6650 is reused and left running. Bounded data: Pulsar topics live in public/bench
# (retention 0, 2 GiB backlog quota, 1 h TTL) and are force-deleted after each measurement;
# RocketMQ topics are created and deleted per measurement, and a RocketMQ started here keeps its
# commit-log files for 1 hour at most; the driver stops before a measurement when the disk of
# target/ has < 10 GiB free (--min-free-gib N). Deleted Pulsar topics' bytes stay in the bookie
# until its garbage collection, every minute here (gcWaitTime, set in place by the broker
# script, which prints each override's effective value from the broker's log): a steady-state
# measurement writes up to 20 GB at 400k msg/s, reclaimed within about two minutes.
# Prints the size of a Pulsar's data started here at the end.
# Writes target/bench-e2e/runs.csv (every run) and results.csv (medians), prints the table.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

args=("$@")
paths=pulsar-produce,pulsar-consume,rocketmq-produce,rocketmq-produce-batch,rocketmq-consume,rocketmq-simple,pulsar-latency,rocketmq-latency
clients=ours,java,python,pulsar-rs
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in
    --paths) paths=${args[i + 1]:-} ;;
    --clients) clients=${args[i + 1]:-} ;;
  esac
done
want_pulsar=false; want_rocketmq=false
[[ $paths == *pulsar-* ]] && want_pulsar=true
[[ $paths == *rocketmq-* ]] && want_rocketmq=true

log() { printf '[bench-e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

log "building e2e_load (release)"
cargo build -q --release -p bench-tools --bin e2e_load
target_dir=${CARGO_TARGET_DIR:-$root/target}
if [[ $clients == *java* ]]; then
  log "building the Java peers"
  scripts/java-peers/run
fi
if [[ $clients == *python* && $want_pulsar == true ]]; then
  log "setting up the Python peer's venv"
  scripts/python-peers/run
fi
pulsar_rs_args=()
if [[ $clients == *pulsar-rs* && $want_pulsar == true ]]; then
  # The pulsar crate's build script needs protoc: the system's, or the grpcio-tools wheel's
  # (scripts/protoc).
  log "building the pulsar crate's peer (scripts/pulsar-rs-peer, release)"
  PROTOC=$PWD/scripts/protoc cargo build -q --release \
    --manifest-path scripts/pulsar-rs-peer/Cargo.toml --target-dir "$target_dir/pulsar-rs-peer"
  pulsar_rs_args=(--pulsar-rs "$target_dir/pulsar-rs-peer/release/pulsar-rs-peer")
fi

started=()
stop_started() {
  local broker
  for broker in "${started[@]}"; do
    log "stopping $broker (started here)"
    scripts/brokers/"$broker" stop || true
  done
}
trap stop_started EXIT

if $want_pulsar && [[ -z ${PULSAR_SERVICE_URL:-} ]]; then
  if (exec 3<>/dev/tcp/127.0.0.1/6650) 2>/dev/null; then
    log "a Pulsar already listens on 127.0.0.1:6650: using it (not stopped at the end)"
    PULSAR_SERVICE_URL=pulsar://127.0.0.1:6650
  else
    log "starting Pulsar (small bookie journal and entry-log files, garbage collection every minute)"
    # A deleted topic's data stays in the bookie until its garbage collection reclaims the
    # entry logs (1 GB each by default, shared by every ledger): smaller files, a journal of
    # 256 MB with one backup, and shorter GC/compaction intervals. Measured (a 0.8 GB run):
    # the journal is trimmed, but the deleted topics' entry logs were still there 5 min later,
    # so the free-disk guard (e2e_load --min-free-gib, 10) is what bounds a long run.
    bookie_gc=$'gcWaitTime=60000\nminorCompactionInterval=300\nminorCompactionThreshold=0.5'
    bookie_gc+=$'\nmajorCompactionInterval=900\nmajorCompactionThreshold=0.8\nlogSizeLimit=134217728'
    bookie_gc+=$'\njournalMaxSizeMB=256\njournalMaxBackups=1\nisForceGCAllowWhenNoSpace=true'
    env_lines=$(PULSAR_CONF_EXTRA=$bookie_gc scripts/brokers/pulsar start)
    started+=(pulsar)
    PULSAR_SERVICE_URL=$(grep -o 'PULSAR_SERVICE_URL=[^[:space:]]*' <<<"$env_lines" | tail -n 1 | cut -d= -f2-)
    PULSAR_ADMIN_URL=$(grep -o 'PULSAR_ADMIN_URL=[^[:space:]]*' <<<"$env_lines" | tail -n 1 | cut -d= -f2-)
  fi
fi
if $want_rocketmq && [[ -z ${ROCKETMQ_ENDPOINT:-} ]]; then
  if scripts/brokers/rocketmq status >/dev/null 2>&1; then
    log "RocketMQ already runs here: using it (not stopped at the end)"
    ROCKETMQ_ENDPOINT=127.0.0.1:8081
  else
    log "starting RocketMQ (its store on target/ disk, commit-log files kept 1 h at most)"
    # scripts/brokers/rocketmq puts the store on /dev/shm, which is memory: the batch path
    # writes 6.5 GB a measurement, and one run filled it to 20 GB of the machine's 24 GiB before
    # the broker refused every message ("disk is full"), with the other measurements short of
    # memory. Here the store goes on the disk of target/ (--min-free-gib guards it) unless
    # ROCKETMQ_STORE_DIR names another place. The broker's forced cleaning (above 85 % of the
    # disk, oldest files first, expired or not) is left as it is: lowered, it would delete a
    # consume path's backlog on a disk shared with other data.
    hours=$(seq -s ';' -f '%02g' 0 23)
    env_lines=$(ROCKETMQ_STORE_DIR=${ROCKETMQ_STORE_DIR:-$root/target/bench-rocketmq-store} \
      ROCKETMQ_BROKER_CONF_EXTRA=$'fileReservedTime=1\ndeleteWhen='"$hours" scripts/brokers/rocketmq start)
    started+=(rocketmq)
    ROCKETMQ_ENDPOINT=$(grep -o 'ROCKETMQ_ENDPOINT=[^[:space:]]*' <<<"$env_lines" | tail -n 1 | cut -d= -f2-)
  fi
fi

pulsar_perf=$root/target/brokers/pulsar/apache-pulsar-4.0.8/bin/pulsar-perf
if $want_pulsar && [[ $clients == *java* && ! -x $pulsar_perf ]]; then
  log "fetching the Pulsar distribution for pulsar-perf"
  bash -c ". scripts/brokers/common.sh; . scripts/brokers/pulsar-common.sh; fetch"
fi

broker_args=()
if $want_pulsar; then
  broker_args+=(--pulsar "$PULSAR_SERVICE_URL" --admin "${PULSAR_ADMIN_URL:-http://127.0.0.1:8080}"
    --pulsar-perf "$pulsar_perf")
fi
$want_rocketmq && broker_args+=(--rocketmq "$ROCKETMQ_ENDPOINT")
# The brokers' CPU within each window goes beside the client's (the "broker cores" column):
# the processes of the pid files scripts/brokers keeps (a broker started another way has none).
brokers_dir=${BROKERS_DIR:-$root/target/brokers}
if $want_pulsar && [[ -f $brokers_dir/pulsar/pulsar.pid ]]; then
  broker_args+=(--pulsar-pid-file "$brokers_dir/pulsar/pulsar.pid")
fi
if $want_rocketmq; then
  for pid_file in "$brokers_dir"/rocketmq/{namesrv,proxy,broker}.pid; do
    if [[ -f $pid_file ]]; then broker_args+=(--rocketmq-pid-file "$pid_file"); fi
  done
fi

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
"$target_dir/release/e2e_load" --out "$root/target/bench-e2e" \
  --java-peers "$root/scripts/java-peers/run" --python-peers "$root/scripts/python-peers/run" \
  --rocketmq-admin "$root/scripts/brokers/rocketmq" "${broker_args[@]}" ${pulsar_rs_args[@]+"${pulsar_rs_args[@]}"} "$@"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ " ${started[*]} " == *" pulsar "* ]]; then
  echo "Pulsar data now: $(du -sh target/brokers/pulsar/data 2>/dev/null | cut -f1)"
fi
