#!/usr/bin/env bash
# Issue 14's restart measurement: `rocketmq-grpc` (rocketmq_restart_stream) and the official
# Java client 5.0.8 (scripts/java-peers RocketMqRestartStream) stream side by side, each on
# its own topic with its own consumer group (a producer at RATE msg/s and a push consumer),
# while the standalone proxy (with its broker) is stopped, kept down DOWN seconds and started
# again on its data. Each client reaches the proxy through its own counting forwarder
# (rocketmq_forward), which stays up through the restart and counts every request, those
# answered UNAVAILABLE while the proxy is down included, so both clients are counted alike.
#
#   scripts/bench-rocketmq-restart.sh                     # 1 run per mode (term, kill)
#   RUNS=2 MODES=term DOWN=30 scripts/bench-rocketmq-restart.sh
#
# Per client and run it prints AckMessage and SendMessage requests per second while the proxy
# was down or not yet routing, sends that failed for good, duplicates, payloads lost, and the
# time from the proxy serving again to the first acknowledged batch (1 s resolution, from the
# forwarder). It starts the proxy through scripts/brokers/rocketmq and stops it at the end.
# BENCHMARKS-archive.md ("## rocketmq-grpc: through a proxy restart") holds a reviewed run;
# BENCHMARKS.md summarises it.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1}
MODES=${MODES:-term kill}
RATE=${RATE:-100}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-90}
RESTART_AT=${RESTART_AT:-20}
DOWN=${DOWN:-30}
LOGS=target/bench-rocketmq-restart
mkdir -p "$LOGS"

cargo build -q --release -p bench-tools --bin rocketmq_restart_stream --bin rocketmq_forward
scripts/java-peers/run > /dev/null

trap 'kill $(jobs -p) 2>/dev/null || true; scripts/brokers/rocketmq stop || true' EXIT
rocketmq_env=$(scripts/brokers/rocketmq start)
endpoint=$(grep -o 'ROCKETMQ_ENDPOINT=[^[:space:]]*' <<<"$rocketmq_env" | tail -n 1 | cut -d= -f2)

now_ms() { date +%s%3N; }
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) cores"
for run in $(seq 1 "$RUNS"); do
  for mode in $MODES; do
    tag=$run-$mode-$(now_ms)
    declare -A forward=()
    for client in ours java; do
      target/release/rocketmq_forward --upstream "$endpoint" > "$LOGS/$tag-$client.fwd" &
      until grep -q '^listening' "$LOGS/$tag-$client.fwd" 2>/dev/null; do sleep 0.1; done
      forward[$client]=$(awk '/^listening/ { print $2; exit }' "$LOGS/$tag-$client.fwd")
    done
    topic=peer-batched
    target/release/rocketmq_restart_stream --endpoint "${forward[ours]}" --topic "$topic" \
      --group "restart-ours-$tag" --rate "$RATE" --seconds "$SECONDS_PER_RUN" --patience 90 --prefix "rs-$tag-" \
      > "$LOGS/$tag-ours.log" 2> "$LOGS/$tag-ours.err" &
    ours=$!
    RESTART_STREAM_TRACE="$LOGS/$tag-java.trace" scripts/java-peers/run RocketMqRestartStream \
      "${forward[java]}" peer-java "$RATE" "$SECONDS_PER_RUN" "rs-$tag-" 90 "restart-java-$tag" \
      > "$LOGS/$tag-java.log" 2> "$LOGS/$tag-java.err" &
    java=$!
    for client in ours java; do
      end=$((SECONDS + 90))
      until grep -q '^ready' "$LOGS/$tag-$client.log" 2>/dev/null; do
        ((SECONDS < end)) || { echo "$client did not start: $(tail -3 "$LOGS/$tag-$client.err")"; exit 1; }
        sleep 0.2
      done
    done
    sleep "$RESTART_AT"
    flag=()
    [[ $mode == kill ]] && flag=(--kill)
    scripts/brokers/rocketmq stop-proxy "${flag[@]}" > "$LOGS/$tag-restart.out" 2>&1
    sleep "$DOWN"
    scripts/brokers/rocketmq start-proxy >> "$LOGS/$tag-restart.out" 2>&1
    wait "$ours" || true
    wait "$java" || true
    kill $(jobs -p) 2>/dev/null || true
    wait 2>/dev/null || true
    python3 - "$LOGS" "$tag" "$run" "$mode" <<'PY'
import json, re, sys
logs, tag, run, mode = sys.argv[1:5]
restart = open(f"{logs}/{tag}-restart.out").read()
def mark(name):
    return int(re.search(name + r"=(\d+)", restart).group(1))
down, up, ready = mark("ROCKETMQ_DOWN_AT_MS"), mark("ROCKETMQ_UP_AT_MS"), mark("ROCKETMQ_READY_AT_MS")

def ticks(client):
    rows = []
    for line in open(f"{logs}/{tag}-{client}.fwd"):
        if line.startswith("counts "):
            parts = line.split()
            rows.append((int(parts[1]), {k: int(v) for k, v in (p.split("=") for p in parts[2:])}))
    return rows

def at(rows, ms, key):
    value = 0
    for t, counts in rows:
        if t <= ms:
            value = counts.get(key, 0)
    return value

def first_ack_after(rows, ms):
    previous = None
    for t, counts in rows:
        if previous and t > ms and counts.get("AckMessage", 0) > previous.get("AckMessage", 0) \
                and counts.get("unavailable", 0) == previous.get("unavailable", 0):
            return (t - ms) / 1000
        previous = counts
    return None

def ours():
    sent, failed, seen, copies = set(), 0, set(), 0
    report = ""
    for line in open(f"{logs}/{tag}-ours.log"):
        parts = line.split()
        if parts[:1] == ["sent"]:
            sent.add(parts[2])
        elif parts[:1] == ["send-error"]:
            failed += 1
        elif parts[:1] == ["recv"]:
            copies += parts[2] in seen
            seen.add(parts[2])
        elif parts[:1] == ["report"]:
            report = " ".join(parts[1:])
    return dict(sent=len(sent), send_failed=failed, duplicates=copies, lost=len(sent - seen), report=report)

def java():
    line = [l for l in open(f"{logs}/{tag}-java.log") if l.startswith("{")][-1]
    j = json.loads(line)
    return dict(sent=j["sent"], send_failed=j["send_failed"], duplicates=j["duplicates"], lost=j["lost"], report="")

window = (ready - down) / 1000
print(f"run {run} {mode}: proxy down at {down}, serving {(up - down) / 1000:.1f} s later, routing {window:.1f} s later")
print("| client | AckMessage/s while down | SendMessage/s while down | sends failed | duplicates | lost | first ack after serving (s) | shutdown report |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for client, counts in (("ours", ours()), ("java", java())):
    rows = ticks(client)
    acks = (at(rows, ready, "AckMessage") - at(rows, down, "AckMessage")) / window
    sends = (at(rows, ready, "SendMessage") - at(rows, down, "SendMessage")) / window
    print(f"| {client} | {acks:.1f} | {sends:.1f} | {counts['send_failed']} | {counts['duplicates']} | {counts['lost']} | {first_ack_after(rows, up)} | {counts['report']} |")
PY
  done
done
