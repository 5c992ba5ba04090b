package peers;

import java.util.concurrent.TimeUnit;
import java.util.zip.CRC32C;
import org.apache.pulsar.client.api.CompressionType;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * Chunked messages with the official Java client.
 *
 * <p>produce SERVICE_URL TOPIC COUNT SIZE CODEC: a producer with chunking (batching off) and
 * CODEC (NONE, LZ4, ...) sends COUNT messages of SIZE bytes, property "i" = i: bytes that do not
 * compress, byte j of message i being bits 24..31 of the (j+1)-th step of xorshift64 (13, 7,
 * 17) from (i + 1) * 0x9E3779B97F4A7C15. Prints "sent i=I id=ID" for
 * each, then "produced=COUNT".
 *
 * <p>consume SERVICE_URL TOPIC SUBSCRIPTION COUNT: an Exclusive consumer from the earliest
 * message receives COUNT messages, acknowledges each and prints "message i=I size=N
 * crc32c=HEX" (CRC-32C of the payload), then "consumed=COUNT" (or "timeout after=N", exit 2).
 */
public final class PulsarChunks {
    public static void main(String[] args) throws Exception {
        String mode = args[0];
        String url = args[1];
        String topic = args[2];
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            if (mode.equals("produce")) {
                produce(client, topic, Integer.parseInt(args[3]), Integer.parseInt(args[4]),
                        CompressionType.valueOf(args[5]));
            } else {
                consume(client, topic, args[3], Integer.parseInt(args[4]));
            }
        }
    }

    static byte[] payload(int i, int size) {
        byte[] bytes = new byte[size];
        long x = (i + 1L) * 0x9E3779B97F4A7C15L;
        for (int j = 0; j < size; j++) {
            x ^= x << 13;
            x ^= x >>> 7;
            x ^= x << 17;
            bytes[j] = (byte) (x >>> 24);
        }
        return bytes;
    }

    private static void produce(PulsarClient client, String topic, int count, int size,
            CompressionType codec) throws Exception {
        try (var producer = client.newProducer()
                .topic(topic)
                .enableBatching(false)
                .enableChunking(true)
                .compressionType(codec)
                .sendTimeout(120, TimeUnit.SECONDS)
                .create()) {
            for (int i = 0; i < count; i++) {
                MessageId id = producer.newMessage()
                        .value(payload(i, size))
                        .property("i", Integer.toString(i))
                        .send();
                System.out.println("sent i=" + i + " id=" + id);
            }
        }
        System.out.println("produced=" + count);
        System.out.flush();
    }

    private static void consume(PulsarClient client, String topic, String subscription, int count)
            throws Exception {
        try (var consumer = client.newConsumer()
                .topic(topic)
                .subscriptionName(subscription)
                .subscriptionType(SubscriptionType.Exclusive)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe()) {
            for (int i = 0; i < count; i++) {
                var message = consumer.receive(120, TimeUnit.SECONDS);
                if (message == null) {
                    System.out.println("timeout after=" + i);
                    System.out.flush();
                    System.exit(2);
                }
                CRC32C crc = new CRC32C();
                crc.update(message.getData());
                System.out.println("message i=" + message.getProperty("i") + " size="
                        + message.getData().length + " crc32c=" + Long.toHexString(crc.getValue()));
                consumer.acknowledge(message);
            }
            System.out.println("consumed=" + count);
            System.out.flush();
        }
    }
}
