package peers;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;

/**
 * Produces COUNT messages "j0".."j{COUNT-1}" with deliverAfter(DELAY_MS), each with property
 * "due" (the deliverAt time in milliseconds since the epoch), from a batching producer (the
 * client sends delayed messages on their own).
 * Usage: PulsarDelayedProduce SERVICE_URL TOPIC COUNT DELAY_MS
 * Prints: produced=COUNT
 */
public final class PulsarDelayedProduce {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        long delay = Long.parseLong(args[3]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             var producer = client.newProducer(Schema.STRING)
                     .topic(topic)
                     .enableBatching(true)
                     .create()) {
            List<CompletableFuture<MessageId>> sends = new ArrayList<>();
            for (int i = 0; i < count; i++) {
                long due = System.currentTimeMillis() + delay;
                sends.add(producer.newMessage().value("j" + i)
                        .property("due", Long.toString(due))
                        .deliverAt(due)
                        .sendAsync());
            }
            producer.flush();
            for (var send : sends) {
                send.get(60, TimeUnit.SECONDS);
            }
            System.out.println("produced=" + count);
        }
    }
}
