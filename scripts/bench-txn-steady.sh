#!/usr/bin/env bash
# Issue 11's steady transactional shape on the real Pulsar broker, our consumer against the
# official Java client 4.0.8, alternating in one run: 140 msg/s in batches of 7 for SECONDS,
# every message acknowledged in a transaction (every 5 received messages acked in one, all at
# once, then the transaction ended), every third aborted, maxUnackedMessagesOnConsumer=50.
# Each run prints one `result` line (drain time, transactions, acks and commits refused,
# blocked periods from the admin stats every 250 ms).
#
#   scripts/bench-txn-steady.sh            # 3 runs of each, 60 s each
#   RUNS=1 SECONDS_PER_RUN=20 scripts/bench-txn-steady.sh
#
# Uses the broker named by PULSAR_SERVICE_URL and PULSAR_ADMIN_URL when both are set; otherwise
# starts it through scripts/brokers/pulsar and stops it at the end. BENCHMARKS-archive.md
# ("## txn-ack and pulsar-wire: transactional acks in a steady stream with aborts") holds a
# reviewed run.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-60}

cargo build -q --release -p examples --bin pulsar_txn_steady
scripts/java-peers/run

if [[ -z "${PULSAR_SERVICE_URL:-}" || -z "${PULSAR_ADMIN_URL:-}" ]]; then
  trap 'scripts/brokers/pulsar stop || true' EXIT
  pulsar_env=$(scripts/brokers/pulsar start)
  export "$(grep -o 'PULSAR_SERVICE_URL=[^[:space:]]*' <<<"$pulsar_env" | tail -n 1)"
  export "$(grep -o 'PULSAR_ADMIN_URL=[^[:space:]]*' <<<"$pulsar_env" | tail -n 1)"
fi

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
for run in $(seq 1 "$RUNS"); do
  for peer in "" "--peer java"; do
    # shellcheck disable=SC2086 # $peer is two words or none
    target/release/pulsar_txn_steady --service-url "$PULSAR_SERVICE_URL" \
      --admin-url "$PULSAR_ADMIN_URL" --seconds "$SECONDS_PER_RUN" $peer |
      grep '^result' | sed "s/^/run=$run /" || true
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
