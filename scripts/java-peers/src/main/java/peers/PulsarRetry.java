package peers;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.DeadLetterPolicy;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * A Shared consumer of TOPIC as SUBSCRIPTION with the Java client's retry enabled
 * (enableRetry, a DeadLetterPolicy with MAX_REDELIVER redeliveries and the default retry and
 * dead-letter topics): receives COUNT messages (each within 30 s) and either reconsumes each
 * later (ACTION reconsume, after DELAY_MS) or acknowledges it (ACTION ack).
 * Usage: PulsarRetry SERVICE_URL TOPIC SUBSCRIPTION MAX_REDELIVER COUNT ACTION DELAY_MS
 * Prints one line per message: TOPIC PAYLOAD then its properties as NAME=VALUE, sorted,
 * separated by spaces; then done=COUNT.
 */
public final class PulsarRetry {
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        int max = Integer.parseInt(args[3]);
        int count = Integer.parseInt(args[4]);
        String action = args[5];
        long delay = Long.parseLong(args[6]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             Consumer<byte[]> consumer = client.newConsumer(Schema.BYTES)
                     .topic(topic)
                     .subscriptionName(subscription)
                     .subscriptionType(SubscriptionType.Shared)
                     .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                     .enableRetry(true)
                     .deadLetterPolicy(DeadLetterPolicy.builder().maxRedeliverCount(max).build())
                     .subscribe()) {
            for (int i = 0; i < count; i++) {
                Message<byte[]> message = consumer.receive(30, TimeUnit.SECONDS);
                if (message == null) {
                    throw new IllegalStateException("only " + i + " of " + count + " arrived");
                }
                StringBuilder line = new StringBuilder(message.getTopicName())
                        .append(' ')
                        .append(new String(message.getValue()));
                Map<String, String> properties = new TreeMap<>(message.getProperties());
                properties.forEach((name, value) -> line.append(' ').append(name).append('=').append(value));
                System.out.println(line);
                if (action.equals("reconsume")) {
                    consumer.reconsumeLater(message, delay, TimeUnit.MILLISECONDS);
                } else {
                    consumer.acknowledge(message);
                }
            }
            System.out.println("done=" + count);
        }
    }
}
