#!/usr/bin/env bash
# Issue 13's restart measurement: `pulsar-wire`, the official Python client (pulsar-client
# from PyPI) and the official Java client 4.0.8 stream side by side, each on its own topic
# (a batching producer and a Shared consumer, RATE msg/s), while the standalone broker is
# stopped and started again on its data (TERM, then kill -9). Per client and restart it
# prints how long after the broker listened again the first receipt and the first delivery
# came, how many payloads were lost, delivered again, or failed to send.
#
#   scripts/bench-restart.sh                    # 2 runs of each mode, 40 s each at 20 msg/s
#   RUNS=1 MODES=term scripts/bench-restart.sh
#
# It starts the broker through scripts/brokers/pulsar (which it must restart) and stops it at
# the end. BENCHMARKS-archive.md ("## pulsar-wire: back after a broker restart") holds a reviewed
# run; BENCHMARKS.md summarises it.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-2}
MODES=${MODES:-term kill}
RATE=${RATE:-20}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-40}
RESTART_AT=${RESTART_AT:-10}
PATIENCE=${PATIENCE:-90}
LOGS=target/bench-restart
mkdir -p "$LOGS"

cargo build -q --release -p bench-tools --bin pulsar_restart_stream
scripts/java-peers/run
scripts/python-peers/run

trap 'scripts/brokers/pulsar stop || true' EXIT
pulsar_env=$(scripts/brokers/pulsar start)
url=$(grep -o 'PULSAR_SERVICE_URL=[^[:space:]]*' <<<"$pulsar_env" | tail -n 1 | cut -d= -f2)
port=${url##*:}

now_ms() { date +%s%3N; }
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; }

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
for run in $(seq 1 "$RUNS"); do
  for mode in $MODES; do
    tag=$run-$mode-$(now_ms)
    pids=()
    for client in ours python java; do
      topic=persistent://public/default/restart-$client-$tag
      case $client in
        ours) cmd=(target/release/pulsar_restart_stream --service-url "$url" --topic "$topic"
          --rate "$RATE" --seconds "$SECONDS_PER_RUN" --patience "$PATIENCE") ;;
        python) cmd=(scripts/python-peers/run restart_stream "$url" "$topic" "$RATE"
          "$SECONDS_PER_RUN" "$PATIENCE") ;;
        java) cmd=(scripts/java-peers/run PulsarRestartStream "$url" "$topic" "$RATE"
          "$SECONDS_PER_RUN" "$PATIENCE") ;;
      esac
      "${cmd[@]}" > "$LOGS/$tag-$client.log" 2> "$LOGS/$tag-$client.err" &
      pids+=($!)
    done
    for client in ours python java; do
      end=$((SECONDS + 60))
      until grep -q '^ready' "$LOGS/$tag-$client.log" 2>/dev/null; do
        ((SECONDS < end)) || { echo "$client did not start: $(tail -3 "$LOGS/$tag-$client.err")"; exit 1; }
        sleep 0.2
      done
    done
    sleep "$RESTART_AT"
    restart_ms=$(now_ms)
    flag=()
    [[ $mode == kill ]] && flag=(--kill)
    scripts/brokers/pulsar restart "${flag[@]}" > "$LOGS/$tag-restart.out" 2>&1 &
    restarting=$!
    while listening; do sleep 0.05; done
    down_ms=$(now_ms)
    until listening; do sleep 0.05; done
    listening_ms=$(now_ms)
    wait "$restarting" || { echo "the restart failed: $(tail -5 "$LOGS/$tag-restart.out")"; exit 1; }
    ready_ms=$(now_ms)
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    python3 - "$LOGS" "$tag" "$run" "$mode" "$restart_ms" "$down_ms" "$listening_ms" "$ready_ms" <<'PY'
import sys
logs, tag, run, mode = sys.argv[1:5]
restart, down, listening, ready = (int(v) for v in sys.argv[5:9])

def resumed(times):
    """The end of the longest gap between events that spans the outage."""
    times = sorted(times)
    best = None
    for before, after in zip(times, times[1:]):
        if after > down and before < ready and (best is None or after - before > best[1] - best[0]):
            best = (before, after)
    return None if best is None else best[1]

for client in ("ours", "python", "java"):
    sent, received, send_errors, recv_errors = {}, [], 0, 0
    done = False
    with open(f"{logs}/{tag}-{client}.log") as lines:
        for line in lines:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "sent":
                sent[parts[2]] = int(parts[1])
            elif parts[0] == "recv":
                received.append((int(parts[1]), parts[2]))
            elif parts[0] == "send-error":
                send_errors += 1
            elif parts[0] == "recv-error":
                recv_errors += 1
            elif parts[0] == "done":
                done = True
    seen = {payload for _, payload in received}
    lost = sum(1 for payload in sent if payload not in seen)
    copies = len(received) - len(seen)
    first_sent = resumed(sent.values())
    first_recv = resumed([t for t, _ in received])
    rel = lambda t: "none" if t is None else t - listening
    print(f"run={run} mode={mode} client={client} down_s={(listening - down) / 1000:.1f} "
          f"ready_after_listening_ms={ready - listening} sent={len(sent)} lost={lost} "
          f"redelivered={copies} send_errors={send_errors} recv_errors={recv_errors} "
          f"first_sent_ms={rel(first_sent)} first_recv_ms={rel(first_recv)} done={done}")
PY
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
