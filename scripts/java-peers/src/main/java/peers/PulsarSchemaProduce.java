package peers;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Schema;

/**
 * Produces COUNT values 0..COUNT-1 of FORMAT (json: JSONSchema, avro: AvroSchema of
 * SchemaOrder; protobuf: ProtobufSchema of Ticket) without batching; COUNT 0 only prints the
 * schema (no broker is contacted).
 * Usage: PulsarSchemaProduce SERVICE_URL TOPIC FORMAT COUNT
 * Prints: type=TYPE, definition=DEFINITION, property KEY=VALUE (sorted), then
 * produced=COUNT
 */
public final class PulsarSchemaProduce {
    @SuppressWarnings({"unchecked", "rawtypes"})
    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String format = args[2];
        int count = Integer.parseInt(args[3]);
        Schema schema = PulsarSchemas.of(format);
        System.out.println("type=" + schema.getSchemaInfo().getType());
        System.out.println("definition=" + schema.getSchemaInfo().getSchemaDefinition());
        Map<String, String> properties = new TreeMap<>(schema.getSchemaInfo().getProperties());
        properties.forEach((key, value) -> System.out.println("property " + key + "=" + value));
        if (count == 0) {
            return;
        }
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build();
             Producer producer = client.newProducer(schema)
                     .topic(topic)
                     .enableBatching(false)
                     .create()) {
            for (int i = 0; i < count; i++) {
                producer.newMessage().value(PulsarSchemas.value(format, i))
                        .sendAsync().get(60, TimeUnit.SECONDS);
            }
            System.out.println("produced=" + count);
        }
    }
}
