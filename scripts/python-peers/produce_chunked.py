"""Produces COUNT chunked messages of SIZE bytes with the official Python client (chunking on,
batching off), property "i" = i: bytes that do not compress, byte j of message i being bits
24..31 of the (j+1)-th step of xorshift64 (13, 7, 17) from (i + 1) * 0x9E3779B97F4A7C15.

Usage: produce_chunked.py SERVICE_URL TOPIC COUNT SIZE CODEC   (CODEC: NONE or LZ4, ...)
Prints: produced=COUNT
"""

import sys

import pulsar

CODECS = {
    "NONE": pulsar.CompressionType.NONE,
    "LZ4": pulsar.CompressionType.LZ4,
    "ZLIB": pulsar.CompressionType.ZLib,
    "ZSTD": pulsar.CompressionType.ZSTD,
    "SNAPPY": pulsar.CompressionType.SNAPPY,
}


MASK = (1 << 64) - 1


def payload(i: int, size: int) -> bytes:
    out = bytearray(size)
    x = ((i + 1) * 0x9E3779B97F4A7C15) & MASK
    for j in range(size):
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        out[j] = (x >> 24) & 0xFF
    return bytes(out)


def main() -> None:
    url, topic = sys.argv[1], sys.argv[2]
    count, size, codec = int(sys.argv[3]), int(sys.argv[4]), CODECS[sys.argv[5]]
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        producer = client.create_producer(
            topic,
            chunking_enabled=True,
            batching_enabled=False,
            compression_type=codec,
            send_timeout_millis=120_000,
        )
        for i in range(count):
            producer.send(payload(i, size), properties={"i": str(i)})
        producer.close()
    finally:
        client.close()
    print(f"produced={count}", flush=True)


if __name__ == "__main__":
    main()
