#!/usr/bin/env bash
# Immediate against batched RocketMQ acks under load: builds the load example and the emulator's
# binary in release, runs `rocketmq_ack_load` (which starts `rocketmq_emulator` as a separate
# process) with the given arguments, and appends the tables, the exact command and the machine
# to BENCHMARKS-archive.md (the full run logs) under "## rocketmq-grpc: batched acks under load".
# BENCHMARKS.md's summary and scripts/benchmarks/data/ack_rpcs.csv are updated by hand from a
# reviewed run (then the command in BENCHMARKS.md, "How to rerun", redraws the plots).
#
#   scripts/bench-rocketmq-acks.sh                         # the full run: 60 s per mode, (a) (b) (c)
#   scripts/bench-rocketmq-acks.sh --duration 10 --scenarios a,c
#   NO_APPEND=1 scripts/bench-rocketmq-acks.sh ...        # print only, leave BENCHMARKS-archive.md alone
#
# Every argument goes to `rocketmq_ack_load` (see `target/release/rocketmq_ack_load --help`).
set -euo pipefail

cd "$(dirname "$0")/.."
HEADING="## rocketmq-grpc: batched acks under load"
LOG=BENCHMARKS-archive.md

cargo build --release -p bench-tools -p examples --bin rocketmq_ack_load --bin rocketmq_emulator

tables=$(mktemp)
trap 'rm -f "$tables"' EXIT
command_line="scripts/bench-rocketmq-acks.sh${*:+ $*}"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')

target/release/rocketmq_ack_load --markdown-out "$tables" "$@"

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
if [[ "${NO_APPEND:-0}" == 1 ]]; then
  exit 0
fi

run=$(mktemp)
trap 'rm -f "$tables" "$run"' EXIT
{
  echo "### Run of ${started}"
  echo
  echo '```sh'
  echo "$command_line"
  echo '```'
  echo
  echo "- $(nproc) vCPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), Linux $(uname -r), $(rustc --version)"
  echo "- load average (1, 5, 15 min) before: ${load_before}; after: ${load_after}"
  echo
  cat "$tables"
} >"$run"

if ! grep -qxF "$HEADING" "$LOG"; then
  printf '\n%s\n\n' "$HEADING" >>"$LOG"
fi
# Insert the run at the end of the section: before the next "## " heading, or at the end.
awk -v heading="$HEADING" -v runfile="$run" '
  function emit() { while ((getline line < runfile) > 0) print line; close(runfile); done = 1 }
  $0 == heading { inside = 1; print; next }
  inside && /^## / && !done { emit(); print ""; inside = 0 }
  { print }
  END { if (!done) { print ""; emit() } }
' "$LOG" >"$LOG.new"
mv "$LOG.new" "$LOG"
echo "appended to $LOG under \"${HEADING}\"" >&2
