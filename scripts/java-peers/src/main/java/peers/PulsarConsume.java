package peers;

import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * Consumes COUNT messages on a Shared subscription from the earliest message and acknowledges
 * each one individually, with the client's default ack grouping.
 * Usage: PulsarConsume SERVICE_URL TOPIC SUBSCRIPTION COUNT
 * Prints "ready" once subscribed, "consumed=COUNT", waits for standard input to close, closes the consumer (which
 * flushes its acks) and prints "closed cpu_ms=CPU" (CPU from before connecting to after close).
 */
public final class PulsarConsume {
    public static void main(String[] args) throws Exception {
        long cpu = Cpu.millis();
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        int count = Integer.parseInt(args[3]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            var consumer = client.newConsumer()
                    .topic(topic)
                    .subscriptionName(subscription)
                    .subscriptionType(SubscriptionType.Shared)
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                    .subscribe();
            System.out.println("ready");
            System.out.flush();
            for (int i = 0; i < count; i++) {
                var message = consumer.receive(60, TimeUnit.SECONDS);
                if (message == null) {
                    System.out.println("timeout after=" + i);
                    System.exit(2);
                }
                consumer.acknowledge(message);
            }
            System.out.println("consumed=" + count);
            System.out.flush();
            Cpu.awaitStdinClosed();
            consumer.close();
        }
        System.out.println("closed cpu_ms=" + (Cpu.millis() - cpu));
    }
}
