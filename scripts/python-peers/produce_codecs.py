"""Produces COUNT messages with each codec (LZ4, ZLIB, ZSTD, SNAPPY) with the official Python
client, once batched (10 per batch) and once without batching: payload "py-CODEC-b-I" or
"py-CODEC-u-I" followed by a compressible filler of I % 200 times "payload ", property
"codec" = the tag before the index.

Usage: produce_codecs.py SERVICE_URL TOPIC COUNT
Prints: produced=TOTAL
"""

import sys

import pulsar

CODECS = {
    "LZ4": pulsar.CompressionType.LZ4,
    "ZLIB": pulsar.CompressionType.ZLib,
    "ZSTD": pulsar.CompressionType.ZSTD,
    "SNAPPY": pulsar.CompressionType.SNAPPY,
}


def main() -> None:
    url, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    total = 0
    try:
        for name, codec in CODECS.items():
            for batched in (True, False):
                tag = f"py-{name}-{'b' if batched else 'u'}"
                producer = client.create_producer(
                    topic,
                    compression_type=codec,
                    batching_enabled=batched,
                    batching_max_messages=10,
                    batching_max_publish_delay_ms=1000,
                    block_if_queue_full=True,
                )
                failed = []

                def sent(result, _msg_id, index=None):
                    if result != pulsar.Result.Ok:
                        failed.append(result)

                for i in range(count):
                    payload = f"{tag}-{i}" + "payload " * (i % 200)
                    producer.send_async(
                        payload.encode(), sent, properties={"codec": tag}
                    )
                producer.flush()
                producer.close()
                if failed:
                    raise SystemExit(f"{len(failed)} sends failed: {failed[:3]}")
                total += count
    finally:
        client.close()
    print(f"produced={total}", flush=True)


if __name__ == "__main__":
    main()
