package peers;

import java.nio.ByteBuffer;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * The end-to-end benchmark's Pulsar latency consumer (pulsar-client, default settings): on a
 * Shared subscription, acknowledging each message individually (the client's default 100 ms
 * ack grouping), as E2ePulsarConsume. Prints "ready" once subscribed (the driver then publishes
 * at a fixed rate, each payload stamped with its send time), then measures each message's
 * latency in the window of {@link E2eLatencyWindow}.
 * Usage: E2ePulsarLatency SERVICE_URL TOPIC SUBSCRIPTION WARMUP_SECS WINDOW_SECS
 */
public final class E2ePulsarLatency {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        var window = new E2eLatencyWindow(Long.parseLong(args[3]), Long.parseLong(args[4]));
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            var consumer = client.newConsumer()
                    .topic(topic)
                    .subscriptionName(subscription)
                    .subscriptionType(SubscriptionType.Shared)
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                    .subscribe();
            System.out.println("ready");
            System.out.flush();
            while (!window.isClosed()) {
                var message = consumer.receive(60, TimeUnit.SECONDS);
                if (message == null) {
                    System.err.println("no message within 60 s");
                    System.exit(2);
                }
                window.message(ByteBuffer.wrap(message.getData()).getLong());
                consumer.acknowledge(message);
            }
            window.result();
            consumer.close();
        }
    }
}
