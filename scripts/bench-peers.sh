#!/usr/bin/env bash
# Our consumers against the official Java clients on the real brokers, in one run: ack requests
# (or ACK frames) and client CPU per 10,000 consumed messages. Builds `peer_compare` in release
# and the Java peers (scripts/java-peers), then runs the comparison.
#
#   scripts/bench-peers.sh                 # 10,000 messages per consumer
#   scripts/bench-peers.sh --messages 2000
#
# Uses the brokers named by ROCKETMQ_ENDPOINT and PULSAR_SERVICE_URL when both are set;
# otherwise starts both through scripts/brokers and stops them at the end. The tables go to
# standard output; BENCHMARKS-archive.md ("## Peers: the official Java clients") holds a
# reviewed run; BENCHMARKS.md summarises it.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build -q --release -p bench-tools --bin peer_compare
scripts/java-peers/run

if [[ -z "${ROCKETMQ_ENDPOINT:-}" || -z "${PULSAR_SERVICE_URL:-}" ]]; then
  stop_all() {
    scripts/brokers/rocketmq stop || true
    scripts/brokers/pulsar stop || true
  }
  trap stop_all EXIT
  rocketmq_env=$(scripts/brokers/rocketmq start)
  export "$(grep -o 'ROCKETMQ_ENDPOINT=[^[:space:]]*' <<<"$rocketmq_env" | tail -n 1)"
  pulsar_env=$(scripts/brokers/pulsar start)
  export "$(grep -o 'PULSAR_SERVICE_URL=[^[:space:]]*' <<<"$pulsar_env" | tail -n 1)"
fi

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
target/release/peer_compare --rocketmq "$ROCKETMQ_ENDPOINT" --pulsar "$PULSAR_SERVICE_URL" "$@"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
