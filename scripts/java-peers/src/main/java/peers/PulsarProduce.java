package peers;

import java.util.HashSet;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.impl.BatchMessageIdImpl;
import org.apache.pulsar.client.impl.MessageIdImpl;

/**
 * Produces COUNT messages "j0".."j{COUNT-1}" (property "i" = index) with the official client's
 * batching, PER_BATCH messages per batch.
 * Usage: PulsarProduce SERVICE_URL TOPIC COUNT PER_BATCH
 * Prints: produced=COUNT entries=DISTINCT_ENTRIES batched=MESSAGES_WITH_A_BATCH_INDEX
 */
public final class PulsarProduce {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        int perBatch = Integer.parseInt(args[3]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             var producer = client.newProducer(Schema.STRING)
                     .topic(topic)
                     .enableBatching(true)
                     .batchingMaxMessages(perBatch)
                     .batchingMaxPublishDelay(1, TimeUnit.SECONDS)
                     .blockIfQueueFull(true)
                     .create()) {
            List<CompletableFuture<MessageId>> sends = new java.util.ArrayList<>();
            for (int i = 0; i < count; i++) {
                sends.add(producer.newMessage().value("j" + i).property("i", Integer.toString(i)).sendAsync());
            }
            producer.flush();
            var entries = new HashSet<String>();
            int batched = 0;
            for (var send : sends) {
                MessageId id = send.get(60, TimeUnit.SECONDS);
                var impl = (MessageIdImpl) id;
                entries.add(impl.getLedgerId() + ":" + impl.getEntryId());
                if (id instanceof BatchMessageIdImpl) {
                    batched++;
                }
            }
            System.out.println("produced=" + count + " entries=" + entries.size() + " batched=" + batched);
        }
    }
}
