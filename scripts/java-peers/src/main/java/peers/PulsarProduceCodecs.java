package peers;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.CompressionType;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;

/**
 * Produces COUNT messages with each codec (LZ4, ZLIB, ZSTD, SNAPPY), once batched (10 per batch)
 * and once without batching: payload "CODEC-b-I" or "CODEC-u-I" followed by a compressible
 * filler of I % 200 times "payload ", property "codec" = CODEC-b or CODEC-u.
 * Usage: PulsarProduceCodecs SERVICE_URL TOPIC COUNT
 * Prints: produced=TOTAL
 */
public final class PulsarProduceCodecs {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        int total = 0;
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            for (CompressionType codec : List.of(CompressionType.LZ4, CompressionType.ZLIB,
                    CompressionType.ZSTD, CompressionType.SNAPPY)) {
                for (boolean batched : List.of(true, false)) {
                    String tag = codec + (batched ? "-b" : "-u");
                    try (var producer = client.newProducer(Schema.STRING)
                            .topic(topic)
                            .compressionType(codec)
                            .enableBatching(batched)
                            .batchingMaxMessages(10)
                            .batchingMaxPublishDelay(1, TimeUnit.SECONDS)
                            .blockIfQueueFull(true)
                            .create()) {
                        List<CompletableFuture<MessageId>> sends = new ArrayList<>();
                        for (int i = 0; i < count; i++) {
                            String payload = tag + "-" + i + "payload ".repeat(i % 200);
                            sends.add(producer.newMessage().value(payload).property("codec", tag).sendAsync());
                        }
                        producer.flush();
                        for (var send : sends) {
                            send.get(60, TimeUnit.SECONDS);
                        }
                        total += count;
                    }
                }
            }
        }
        System.out.println("produced=" + total);
    }
}
