#!/usr/bin/env bash
# Runs pulsar-wire's codec benchmark (pulsar-wire/benches/codec.rs) and the comparison with the
# `pulsar` crate's codec on the same frames (pulsar-wire/codec-compare), then prints, from
# criterion's medians, MB/s (10^6 bytes/s), frames/s and the ratio pulsar-wire / pulsar.
#
# Usage: scripts/bench-pulsar-codec.sh [extra criterion args, e.g. --noplot]
#        SKIP_RUN=1 scripts/bench-pulsar-codec.sh   # only print the last run's results
#
# The comparison crate needs `protoc` (pulsar's build script: the system's, or the one of the
# grpcio-tools wheel through scripts/protoc) and OpenSSL headers (libssl-dev, pkg-config).
set -euo pipefail

cd "$(dirname "$0")/.."

compare_manifest=pulsar-wire/codec-compare/Cargo.toml
wire_target="${CARGO_TARGET_DIR:-target}"
compare_target="${CARGO_TARGET_DIR:-pulsar-wire/codec-compare/target}"

if [[ -z "${SKIP_RUN:-}" ]]; then
    export PROTOC="$PWD/scripts/protoc"
    cargo bench -p pulsar-wire --features unstable-wire --bench codec -- "$@"
    cargo bench --manifest-path "$compare_manifest" --bench compare -- "$@"
fi

python3 - "$wire_target/criterion" "$compare_target/criterion" <<'PY'
import json
import sys
from pathlib import Path

wire_dir, compare_dir = (Path(p) for p in sys.argv[1:3])
frames = {
    "message_batch100": "MESSAGE, 100-message batch",
    "ack1000": "ACK, 1,000 ids",
}

def result(group_dir, bench):
    """(median ns per frame, frame bytes) from criterion's files."""
    base = group_dir / bench / "new"
    with open(base / "estimates.json") as f:
        ns = json.load(f)["median"]["point_estimate"]
    with open(base / "benchmark.json") as f:
        throughput = json.load(f)["throughput"]
    return ns, throughput["Bytes"]

def row(name, ns, size):
    mbps = size / ns * 1e3
    return f"{name:<28} {ns / 1e3:>10.2f} {mbps:>10.1f} {1e9 / ns:>12,.0f}"

header = f"{'bench':<28} {'median us':>10} {'MB/s':>10} {'frames/s':>12}"
print("== pulsar-wire codec (pulsar-wire/benches/codec.rs)")
for frame, title in frames.items():
    group = wire_dir / f"codec_{frame}"
    if not group.exists():
        print(f"(no results in {group})")
        continue
    print(f"-- {frame}: {title}")
    print(header)
    for bench in ["encode", "encode_ref", "encode_with_batch", "decode", "decode_with_batch"]:
        if (group / bench / "new").exists():
            ns, size = result(group, bench)
            print(row(bench, ns, size))

print()
print("== same frames, same run: pulsar-wire vs the pulsar crate (pulsar-wire/codec-compare)")
missed = 0
for frame, title in frames.items():
    group = compare_dir / f"compare_{frame}"
    if not group.exists():
        print(f"(no results in {group})")
        continue
    ns_size = {}
    for codec in ["pulsar_wire", "pulsar"]:
        for op in ["encode", "decode"]:
            ns_size[codec, op] = result(group, f"{codec}_{op}")
    size = ns_size["pulsar_wire", "encode"][1]
    print(f"-- {frame}: {title}, {size:,} bytes")
    print(f"{'op':<8} {'pulsar-wire MB/s':>17} {'frames/s':>12} {'pulsar MB/s':>12} {'frames/s':>12} {'ratio':>7}  target met?")
    for op in ["encode", "decode"]:
        wire_ns, _ = ns_size["pulsar_wire", op]
        pulsar_ns, _ = ns_size["pulsar", op]
        ratio = pulsar_ns / wire_ns
        met = ratio >= 1.0
        missed += not met
        print(
            f"{op:<8} {size / wire_ns * 1e3:>17.1f} {1e9 / wire_ns:>12,.0f}"
            f" {size / pulsar_ns * 1e3:>12.1f} {1e9 / pulsar_ns:>12,.0f} {ratio:>6.3f}x  {'yes' if met else 'NO'}"
        )
    for bench, op in [("suggested_backpatch_encode", "encode"), ("suggested_slice_decode", "decode")]:
        if not (group / bench / "new").exists():
            continue
        ns, _ = result(group, bench)
        pulsar_ns, _ = ns_size["pulsar", op]
        print(
            f"{op + '*':<8} {size / ns * 1e3:>17.1f} {1e9 / ns:>12,.0f}"
            f" {'':>12} {'':>12} {pulsar_ns / ns:>6.3f}x  (* a suggested change, not pulsar-wire's code)"
        )
print()
print("ratio = pulsar-wire throughput / pulsar throughput; target: >= 1.00x (at least as fast)")
if missed:
    print(f"{missed} target(s) missed")
PY
