#!/usr/bin/env python3
"""Drives the pulsar-wire broker emulator with the Python client (`pip install pulsar-client`):
a reader from the earliest message, `Consumer.get_last_message_id`, and `Consumer.seek` to the
earliest, to a message id and to a publish time followed by what each must deliver; every
call must finish at once, not after the client's operation timeout.

Usage (the emulator on a port of its own, never 6650):

    cargo build -p examples --bin pulsar_emulator
    scripts/python-peers/run emulator_check --emulator target/debug/pulsar_emulator
    # or, against an emulator already running:
    scripts/python-peers/run emulator_check --url pulsar://127.0.0.1:6660

Prints one line per check and exits 1 if any check failed. In CI through the integration test
`tests/tests/python_emulator.rs` (run by scripts/test-real-brokers).
"""

import argparse
import subprocess
import sys
import time

import pulsar

# Far longer than any answer the emulator gives; a check that takes this long waited out a
# timeout.
OPERATION_TIMEOUT_S = 30
AT_ONCE_S = 2.0


def start_emulator(path):
    proc = subprocess.Popen(
        [path, "--port", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline().strip()
    if not line.startswith("endpoint="):
        proc.kill()
        sys.exit(f"the emulator printed {line!r}, not endpoint=...")
    return proc, line[len("endpoint="):]


def timed(name, results, action):
    start = time.monotonic()
    try:
        outcome = ("ok", action())
    except Exception as error:  # the client raises one class per server error
        outcome = ("error", f"{type(error).__name__}: {error}")
    elapsed = time.monotonic() - start
    results.append((name, elapsed, outcome))
    print(f"{name}: {outcome[0]} after {elapsed:.3f}s: {outcome[1]}")
    return outcome


def main():
    parser = argparse.ArgumentParser()
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--url", help="service URL of a running emulator")
    group.add_argument("--emulator", help="path of the pulsar_emulator binary to start")
    args = parser.parse_args()
    proc = None
    url = args.url
    if args.emulator:
        proc, url = start_emulator(args.emulator)
    failures = []
    results = []
    client = pulsar.Client(url, operation_timeout_seconds=OPERATION_TIMEOUT_S)
    try:
        topic = f"python-check-{int(time.time() * 1000)}"
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(3):
            producer.send(f"m{i}".encode())

        reader = client.create_reader(topic, pulsar.MessageId.earliest)

        def read_three():
            return [reader.read_next(timeout_millis=5000).data() for _ in range(3)]

        outcome = timed("reader from earliest: 3 messages", results, read_three)
        if outcome != ("ok", [b"m0", b"m1", b"m2"]):
            failures.append("reader")
        timed("reader.has_message_available", results, reader.has_message_available)

        consumer = client.subscribe(
            topic,
            "python-check",
            initial_position=pulsar.InitialPosition.Earliest,
        )
        if hasattr(consumer, "get_last_message_id"):
            timed("consumer.get_last_message_id", results, consumer.get_last_message_id)
        else:
            print("consumer.get_last_message_id: not in this pulsar-client version")
        def take(count):
            taken = []
            for _ in range(count):
                message = consumer.receive(timeout_millis=5000)
                consumer.acknowledge(message)
                taken.append(message)
            return taken

        first = take(3)
        timed("consumer.seek(earliest)", results, lambda: consumer.seek(pulsar.MessageId.earliest))
        outcome = timed(
            "after seek(earliest): m0 again",
            results,
            lambda: [m.data() for m in take(3)],
        )
        if outcome != ("ok", [b"m0", b"m1", b"m2"]):
            failures.append("seek(earliest)")
        # The Python client's seek by id is exclusive: the next message follows the id.
        timed("consumer.seek(id of m0)", results, lambda: consumer.seek(first[0].message_id()))
        outcome = timed(
            "after seek(id of m0): m1",
            results,
            lambda: [m.data() for m in take(2)],
        )
        if outcome != ("ok", [b"m1", b"m2"]):
            failures.append("seek(id)")
        publish = first[1].publish_timestamp()
        timed("consumer.seek(publish time of m1)", results, lambda: consumer.seek(publish))
        outcome = timed(
            "after seek(publish time of m1): from m1",
            results,
            lambda: [m.data() for m in take(1)],
        )
        if outcome != ("ok", [b"m1"]) and outcome != ("ok", [b"m0"]):
            failures.append("seek(time)")
    finally:
        client.close()
        if proc is not None:
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            report = proc.stdout.read()
            proc.wait(timeout=10)
            print(report, end="")
    for name, elapsed, _ in results:
        if elapsed > AT_ONCE_S:
            failures.append(f"{name} took {elapsed:.1f}s")
    if failures:
        print("FAILED: " + "; ".join(failures))
        return 1
    print("all checks finished at once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
