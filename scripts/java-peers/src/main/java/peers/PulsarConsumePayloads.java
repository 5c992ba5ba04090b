package peers;

import java.nio.charset.StandardCharsets;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * Consumes COUNT messages on a Shared subscription from the earliest message, acknowledges each
 * and prints each payload (UTF-8) on its own line as "payload=TEXT".
 * Usage: PulsarConsumePayloads SERVICE_URL TOPIC SUBSCRIPTION COUNT
 * Prints the payloads, then "consumed=COUNT" (or "timeout after=N" and exit 2).
 */
public final class PulsarConsumePayloads {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        int count = Integer.parseInt(args[3]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             var consumer = client.newConsumer()
                     .topic(topic)
                     .subscriptionName(subscription)
                     .subscriptionType(SubscriptionType.Shared)
                     .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                     .subscribe()) {
            for (int i = 0; i < count; i++) {
                var message = consumer.receive(60, TimeUnit.SECONDS);
                if (message == null) {
                    System.out.println("timeout after=" + i);
                    System.out.flush();
                    System.exit(2);
                }
                System.out.println("payload=" + new String(message.getData(), StandardCharsets.UTF_8));
                consumer.acknowledge(message);
            }
            System.out.println("consumed=" + count);
            System.out.flush();
        }
    }
}
