#!/usr/bin/env bash
# Runs the compression comparison of pulsar-wire with the `pulsar` crate
# (pulsar-wire/codec-compare/benches/compression.rs), then prints, from criterion's medians,
# MB/s (10^6 bytes/s of uncompressed payload) per codec, payload and direction, and the ratio
# pulsar-wire / pulsar.
#
# Usage: scripts/bench-pulsar-compression.sh [criterion args, e.g. --warm-up-time 1 --measurement-time 3]
#        SKIP_RUN=1 scripts/bench-pulsar-compression.sh   # only print the last run's results
#
# The comparison crate needs `protoc` (pulsar's build script: the system's, or the one of the
# grpcio-tools wheel through scripts/protoc) and OpenSSL headers (libssl-dev, pkg-config).
set -euo pipefail

cd "$(dirname "$0")/.."

compare_manifest=pulsar-wire/codec-compare/Cargo.toml
compare_target="${CARGO_TARGET_DIR:-pulsar-wire/codec-compare/target}"

if [[ -z "${SKIP_RUN:-}" ]]; then
    export PROTOC="$PWD/scripts/protoc"
    cargo bench --manifest-path "$compare_manifest" --bench compression -- --noplot "$@"
fi

python3 - "$compare_target/criterion" <<'PY'
import json
import sys
from pathlib import Path

root = Path(sys.argv[1])
codecs = ["none", "lz4", "zlib", "zstd", "snappy"]

def median_ns(bench_dir):
    with open(bench_dir / "new" / "estimates.json") as f:
        return json.load(f)["median"]["point_estimate"]

def size(bench_dir):
    with open(bench_dir / "new" / "benchmark.json") as f:
        return json.load(f)["throughput"]["Bytes"]

def table(title, prefix, payloads, ops):
    print(f"== {title}")
    print(f"{'payload':<10} {'codec':<7} {'op':<11} {'pulsar-wire MB/s':>17} {'pulsar MB/s':>12} {'ratio':>7}")
    for payload in payloads:
        for codec in codecs:
            group = root / f"{prefix}_{payload}_{codec}"
            if not group.exists():
                continue
            for op, ours, theirs in ops:
                a, b = group / ours, group / theirs
                if not (a / "new").exists() or not (b / "new").exists():
                    continue
                n = size(a)
                ours_ns, theirs_ns = median_ns(a), median_ns(b)
                print(
                    f"{payload:<10} {codec.upper():<7} {op:<11} {n / ours_ns * 1e3:>17.1f}"
                    f" {n / theirs_ns * 1e3:>12.1f} {theirs_ns / ours_ns:>6.2f}x"
                )
    print()

table(
    "payload compression (compression/{payload}/{codec})",
    "compression",
    ["json_1k", "json_64k", "batch100"],
    [
        ("compress", "pulsar_wire_compress", "pulsar_compress"),
        ("decompress", "pulsar_wire_decompress", "pulsar_decompress"),
    ],
)
table(
    "whole frames with a compressed 100-message batch (frame/batch100/{codec})",
    "frame",
    ["batch100"],
    [
        ("encode SEND", "pulsar_wire_encode_send", "pulsar_encode_send"),
        ("decode MSG", "pulsar_wire_decode_message", "pulsar_decode_message"),
    ],
)
print("MB/s = 10^6 bytes/s of uncompressed payload; ratio = pulsar-wire throughput / pulsar throughput")
PY
