#!/usr/bin/env bash
# The steady transactional shapes on the real Pulsar broker, our consumers against the official
# Java client 4.0.8, interleaved in one run on one broker.
#
# - Default: issue 11's shape, one Shared consumer: 140 msg/s in batches of 7 for SECONDS, every
#   message acknowledged in a transaction (every 5 received messages acked in one, all at once,
#   then the transaction ended), every third aborted, maxUnackedMessagesOnConsumer=50.
# - CONSUMERS="2 3": issue 27's shape for each consumer count: N Shared consumers on one
#   subscription, each with its own loop, 300 msg/s in batches of 13, 6 acks per transaction,
#   every fourth aborted, maxUnackedMessagesOnConsumer=37.
#
# Each run prints one `result` line (committed once and more than once, acks refused by the
# broker, of which TransactionConflict, and by the client, commits refused, drain time, blocked
# periods of the subscription and the longest of one consumer from the admin stats every 250 ms,
# final unacked and backlog) prefixed with the run and the load average; the end prints the
# medians per client and consumer count. Every line of every run (the double_commit line of each
# payload committed twice, the blocked line of each consumer) goes to LOG.
#
#   scripts/bench-txn-steady.sh                    # issue 11: 3 runs of each client, 60 s each
#   CONSUMERS="2 3" scripts/bench-txn-steady.sh    # issue 27: 3 runs of each client and count
#   RUNS=1 SECONDS_PER_RUN=20 scripts/bench-txn-steady.sh
#
# WARM_UP (seconds, default 15): every run first runs the same shape for that long on another
# topic in the same process, so the Java peer's JVM has compiled its code before the measured
# run (ours runs it too, so both find the broker as warm); 0 skips it.
#
# Uses the broker named by PULSAR_SERVICE_URL and PULSAR_ADMIN_URL when both are set; otherwise
# starts it through scripts/brokers/pulsar and stops it at the end. BENCHMARKS-archive.md
# ("## txn-ack and pulsar-wire: transactional acks in a steady stream with aborts") holds
# reviewed runs.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-60}
CONSUMERS=${CONSUMERS:-}
WARM_UP=${WARM_UP:-15}
LOG=${LOG:-target/bench-txn-steady-$(date -u +%Y%m%d-%H%M%S).log}

cargo build -q --release -p bench-tools --bin pulsar_txn_steady
scripts/java-peers/run

results=$(mktemp)
if [[ -z "${PULSAR_SERVICE_URL:-}" || -z "${PULSAR_ADMIN_URL:-}" ]]; then
  trap 'rm -f "$results"; scripts/brokers/pulsar stop || true' EXIT
  pulsar_env=$(scripts/brokers/pulsar start)
  export "$(grep -o 'PULSAR_SERVICE_URL=[^[:space:]]*' <<<"$pulsar_env" | tail -n 1)"
  export "$(grep -o 'PULSAR_ADMIN_URL=[^[:space:]]*' <<<"$pulsar_env" | tail -n 1)"
fi

[[ -n $(trap -p EXIT) ]] || trap 'rm -f "$results"' EXIT
mkdir -p "$(dirname "$LOG")"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores; every line in $LOG"
for run in $(seq 1 "$RUNS"); do
  # "-": issue 11's shape (no --consumers).
  for consumers in ${CONSUMERS:--}; do
    shape=()
    [[ $consumers != - ]] && shape=(--consumers "$consumers")
    for peer in "" "--peer java"; do
      # shellcheck disable=SC2086 # $peer is two words or none
      result=$(target/release/pulsar_txn_steady --service-url "$PULSAR_SERVICE_URL" \
        --admin-url "$PULSAR_ADMIN_URL" --seconds "$SECONDS_PER_RUN" --warm-up "$WARM_UP" \
        "${shape[@]}" $peer 2>&1 | tee -a "$LOG" | grep '^result' || true)
      # The load average of the minute that ends with the run.
      if [[ -n $result ]]; then
        echo "run=$run load=$(cut -d' ' -f1 /proc/loadavg) $result" | tee -a "$results"
      fi
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# Medians per client and consumer count (drained: how many runs drained).
awk '
  {
    for (i = 1; i <= NF; i++) if (split($i, kv, "=") == 2) f[kv[1]] = kv[2]
    g = f["client"] " " f["consumers"]
    if (!(g in runs)) order[++groups] = g
    runs[g]++
    drained[g] += (f["drained"] == "true")
    for (k = 1; k <= nfields; k++) v[g, k, runs[g]] = f[field[k]]
  }
  BEGIN {
    nfields = split("load produced committed committed_again duplicates_across_consumers " \
      "duplicate_apart_max_ms acks_refused ack_conflicts acks_refused_by_client commits_refused " \
      "drain_ms blocked_periods blocked_total_ms blocked_longest_ms consumer_blocked_longest_ms " \
      "final_unacked final_backlog", field, " ")
  }
  function median(g, k, n,   a, i, j, t) {
    for (i = 1; i <= n; i++) a[i] = v[g, k, i] + 0
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    printf "medians:\n| client | consumers | runs | drained |"
    for (k = 1; k <= nfields; k++) printf " %s |", field[k]
    printf "\n"
    for (o = 1; o <= groups; o++) {
      g = order[o]
      split(g, gc, " ")
      printf "| %s | %s | %d | %d |", gc[1], gc[2], runs[g], drained[g]
      for (k = 1; k <= nfields; k++) printf " %s |", median(g, k, runs[g])
      printf "\n"
    }
  }
' "$results"
