package peers;

import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;

/**
 * Consumes COUNT values of FORMAT (json, avro, protobuf; see PulsarSchemaProduce) from the
 * earliest message as SUBSCRIPTION, acknowledging each, waiting at most 30 s for each.
 * Usage: PulsarSchemaConsume SERVICE_URL TOPIC SUBSCRIPTION FORMAT COUNT
 * Prints: "value <fields> version=<hex schema version>" per message, then consumed=N
 */
public final class PulsarSchemaConsume {
    @SuppressWarnings({"unchecked", "rawtypes"})
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        String format = args[3];
        int count = Integer.parseInt(args[4]);
        Schema schema = PulsarSchemas.of(format);
        int consumed = 0;
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             Consumer consumer = client.newConsumer(schema)
                     .topic(topic)
                     .subscriptionName(subscription)
                     .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                     .subscribe()) {
            for (; consumed < count; consumed++) {
                Message message = consumer.receive(30, TimeUnit.SECONDS);
                if (message == null) {
                    break;
                }
                System.out.println("value " + PulsarSchemas.line(message.getValue())
                        + " version=" + PulsarSchemas.hex(message.getSchemaVersion()));
                consumer.acknowledge(message);
            }
        }
        System.out.println("consumed=" + consumed);
    }
}
