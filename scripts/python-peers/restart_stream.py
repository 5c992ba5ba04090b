"""One side of the restart benchmark (scripts/bench-restart.sh) with the official Python
client: a batching producer (10 per batch, 20 ms) and a Shared consumer on TOPIC, sending
RATE msg/s for SECONDS while the broker is restarted; every delivery is acknowledged.

Usage: restart_stream.py SERVICE_URL TOPIC RATE SECONDS PATIENCE [PREFIX]
Payloads are PREFIX (default "m") and a number; on a topic shared with another client, the
consumer (subscription "restart-PREFIX") acknowledges and skips payloads without the prefix.
Prints, with the Unix time in ms: "sent MS PAYLOAD", "send-error MS PAYLOAD ERROR",
"recv MS PAYLOAD", "recv-error MS ERROR", then "done".
"""

import sys
import threading
import time

import pulsar

lock = threading.Lock()


def say(line: str) -> None:
    with lock:
        print(line, flush=True)


def now_ms() -> int:
    return int(time.time() * 1000)


def main() -> None:
    url, topic = sys.argv[1], sys.argv[2]
    rate, seconds, patience = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    prefix = sys.argv[6] if len(sys.argv) > 6 else "m"
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    consumer = client.subscribe(
        topic,
        f"restart-{prefix}",
        consumer_type=pulsar.ConsumerType.Shared,
        initial_position=pulsar.InitialPosition.Earliest,
    )
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_messages=10,
        batching_max_publish_delay_ms=20,
        block_if_queue_full=True,
    )
    say("ready")
    sent = set()
    pending = [0]
    total = rate * seconds

    def callback(payload):
        def done(result, _msg_id):
            with lock:
                pending[0] -= 1
            if result == pulsar.Result.Ok:
                with lock:
                    sent.add(payload)
                say(f"sent {now_ms()} {payload}")
            else:
                say(f"send-error {now_ms()} {payload} {result}")

        return done

    def produce():
        started = time.monotonic()
        for i in range(total):
            wait = started + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            payload = f"{prefix}{i}"
            with lock:
                pending[0] += 1
            producer.send_async(payload.encode(), callback(payload))
        producer.flush()

    producing = threading.Thread(target=produce)
    producing.start()
    seen = set()
    deadline = time.monotonic() + seconds + patience
    while time.monotonic() < deadline:
        with lock:
            finished = not producing.is_alive() and pending[0] == 0 and sent <= seen
        if finished:
            break
        try:
            message = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        except Exception as error:  # noqa: BLE001 - every failure is reported as a line
            say(f"recv-error {now_ms()} {error}")
            time.sleep(0.1)
            continue
        payload = message.data().decode(errors="replace")
        if not (payload.startswith(prefix) and payload[len(prefix):].isdigit()):
            consumer.acknowledge(message)
            continue
        say(f"recv {now_ms()} {payload}")
        seen.add(payload)
        consumer.acknowledge(message)
    producing.join()
    consumer.close()
    producer.close()
    client.close()
    say("done")


if __name__ == "__main__":
    main()
