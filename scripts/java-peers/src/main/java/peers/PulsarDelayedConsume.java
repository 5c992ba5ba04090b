package peers;

import java.util.HashSet;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * Consumes COUNT messages on a Shared subscription (from the earliest message; bytes, as the
 * topic's producers send) and compares each arrival with its property "due" (milliseconds since
 * the epoch).
 * Usage: PulsarDelayedConsume SERVICE_URL TOPIC SUBSCRIPTION COUNT TIMEOUT_S
 * Prints: ready (once subscribed), then
 *   received=N distinct=D early=E earliest_ms=MIN_LATENESS latest_ms=MAX_LATENESS
 */
public final class PulsarDelayedConsume {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        int count = Integer.parseInt(args[3]);
        long deadline = System.currentTimeMillis() + Long.parseLong(args[4]) * 1000;
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             var consumer = client.newConsumer(Schema.BYTES)
                     .topic(topic)
                     .subscriptionName(subscription)
                     .subscriptionType(SubscriptionType.Shared)
                     .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                     .subscribe()) {
            System.out.println("ready");
            System.out.flush();
            int received = 0;
            int early = 0;
            long earliest = Long.MAX_VALUE;
            long latest = Long.MIN_VALUE;
            var distinct = new HashSet<String>();
            while (received < count && System.currentTimeMillis() < deadline) {
                Message<byte[]> message = consumer.receive(1, TimeUnit.SECONDS);
                if (message == null) {
                    continue;
                }
                long lateness = System.currentTimeMillis() - Long.parseLong(message.getProperty("due"));
                received++;
                distinct.add(new String(message.getValue(), java.nio.charset.StandardCharsets.UTF_8));
                if (lateness < 0) {
                    early++;
                }
                earliest = Math.min(earliest, lateness);
                latest = Math.max(latest, lateness);
                consumer.acknowledge(message);
            }
            System.out.println("received=" + received + " distinct=" + distinct.size() + " early=" + early
                    + " earliest_ms=" + earliest + " latest_ms=" + latest);
        }
    }
}
