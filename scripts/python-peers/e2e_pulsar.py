"""The end-to-end benchmark's Python peer (bench-tools/src/bin/e2e_load), official pulsar-client.

Usage:
  e2e_pulsar.py produce SERVICE_URL TOPIC COUNT SIZE IN_FLIGHT BATCH_MAX BATCH_DELAY_MS
      COUNT messages of SIZE bytes, batching (at most BATCH_MAX messages / BATCH_DELAY_MS /
      4 MiB), at most IN_FLIGHT pending (max_pending_messages, blocking when full); latency
      from each send_async to its callback.
  e2e_pulsar.py consume SERVICE_URL TOPIC SUBSCRIPTION COUNT
      drains COUNT messages on a Shared subscription, acknowledging each individually.

Line protocol: "start" when the measured window opens, "result messages=N seconds=S
[p50_ms=X p99_ms=Y]" when it closes, then waits for standard input to close.
"""

import math
import sys
import threading
import time

import pulsar


def percentile_ms(sorted_seconds, q):
    if not sorted_seconds:
        return float("nan")
    rank = min(len(sorted_seconds), max(1, math.ceil(q * len(sorted_seconds))))
    return sorted_seconds[rank - 1] * 1000.0


def finish(line):
    print(line, flush=True)
    sys.stdin.read()


def produce(url, topic, count, size, in_flight, batch_max, delay_ms):
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=batch_max,
        batching_max_publish_delay_ms=delay_ms,
        batching_max_allowed_size_in_bytes=4 << 20,
        max_pending_messages=in_flight,
        block_if_queue_full=True,
        send_timeout_millis=120_000,
    )
    payload = b"x" * size
    sent_at = [0.0] * count
    latencies = [0.0] * count
    failed = []
    done = threading.Event()
    remaining = [count]
    lock = threading.Lock()

    def callback(index):
        def sent(result, _msg_id):
            latencies[index] = time.perf_counter() - sent_at[index]
            if result != pulsar.Result.Ok:
                failed.append(result)
            with lock:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        return sent

    print("start", flush=True)
    start = time.perf_counter()
    for i in range(count):
        sent_at[i] = time.perf_counter()
        producer.send_async(payload, callback(i))
    producer.flush()
    done.wait()
    seconds = time.perf_counter() - start
    if failed:
        raise SystemExit(f"{len(failed)} sends failed: {failed[:3]}")
    latencies.sort()
    finish(
        f"result messages={count} seconds={seconds:.6f} "
        f"p50_ms={percentile_ms(latencies, 0.5):.3f} p99_ms={percentile_ms(latencies, 0.99):.3f}"
    )
    producer.close()
    client.close()


def consume(url, topic, subscription, count):
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    print("start", flush=True)
    start = time.perf_counter()
    consumer = client.subscribe(
        topic,
        subscription,
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    for _ in range(count):
        message = consumer.receive(timeout_millis=60_000)
        consumer.acknowledge(message)
    seconds = time.perf_counter() - start
    finish(f"result messages={count} seconds={seconds:.6f}")
    consumer.close()
    client.close()


def main():
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "produce":
        url, topic = args[0], args[1]
        count, size, in_flight, batch_max, delay_ms = map(int, args[2:7])
        produce(url, topic, count, size, in_flight, batch_max, delay_ms)
    elif mode == "consume":
        consume(args[0], args[1], args[2], int(args[3]))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
