#!/usr/bin/env bash
# Runs the ack-batcher throughput benchmark, then prints criterion's median ns/item for each
# bench and its ratio to the `floor` bench (a bare mpsc + oneshot round trip).
#
# Usage: scripts/bench-ack-batcher.sh [extra criterion args, e.g. --noplot]
#        SKIP_RUN=1 scripts/bench-ack-batcher.sh   # only print the last run's results
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ -z "${SKIP_RUN:-}" ]]; then
    cargo bench -p ack-batcher --bench throughput -- "$@"
fi

target_dir="${CARGO_TARGET_DIR:-target}"
python3 - "$target_dir/criterion/submit_to_result" <<'PY'
import json
import sys
from pathlib import Path

group = Path(sys.argv[1])
# bench -> (items per iteration, target ratio to floor or None)
benches = {
    "floor": (65_536, None),
    "batcher_1_key": (65_536, 3.0),
    "batcher_1000_keys": (1_024_000, 5.0),
}

def ns_per_item(bench, items):
    estimates = group / bench / "new" / "estimates.json"
    with open(estimates) as f:
        median_ns_per_iteration = json.load(f)["median"]["point_estimate"]
    return median_ns_per_iteration / items

medians = {bench: ns_per_item(bench, items) for bench, (items, _) in benches.items()}
floor = medians["floor"]
missed = 0
print(f"{'bench':<20} {'median ns/item':>15} {'Mitems/s':>10} {'ratio':>7} {'target':>7}  met?")
for bench, (_, target) in benches.items():
    ns = medians[bench]
    ratio = ns / floor
    if target is None:
        verdict, target_text = "-", "-"
    else:
        met = ratio <= target
        missed += not met
        verdict, target_text = ("yes" if met else "NO"), f"<={target:g}x"
    print(f"{bench:<20} {ns:>15.1f} {1e3 / ns:>10.2f} {ratio:>6.2f}x {target_text:>7}  {verdict}")
if missed:
    print(f"{missed} target(s) missed")
PY
