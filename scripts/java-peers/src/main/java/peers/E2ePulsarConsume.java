package peers;

import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * The end-to-end benchmark's Pulsar consumer: drains COUNT messages on a Shared subscription,
 * acknowledging each one individually (the client's default 100 ms ack grouping).
 * Usage: E2ePulsarConsume SERVICE_URL TOPIC SUBSCRIPTION COUNT
 * The window runs from before subscribe to the COUNT-th acknowledge call.
 */
public final class E2ePulsarConsume {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        int count = Integer.parseInt(args[3]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            E2e.start();
            long start = System.nanoTime();
            var consumer = client.newConsumer()
                    .topic(topic)
                    .subscriptionName(subscription)
                    .subscriptionType(SubscriptionType.Shared)
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                    .subscribe();
            for (int i = 0; i < count; i++) {
                var message = consumer.receive(60, TimeUnit.SECONDS);
                if (message == null) {
                    System.err.println("timeout after " + i + " messages");
                    System.exit(2);
                }
                consumer.acknowledge(message);
            }
            E2e.result(count, start, null);
            consumer.close();
        }
    }
}
