package peers;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.message.MessageView;

/**
 * The official RocketMQ 5 Java client's simple consumer: receives (16 at a time, invisible for
 * 30 s, awaiting up to 10 s) and acknowledges every message, until COUNT messages whose body
 * starts with PREFIX were acknowledged, then closes.
 * Usage: RocketMqSimpleConsume ENDPOINT TOPIC GROUP PREFIX COUNT [LIMIT_SECONDS]
 * Prints "consumed=COUNT" and "others=N" (messages of other bodies, acknowledged too), or
 * "timeout after=N" and exits 2 when LIMIT_SECONDS (default 120) pass first.
 */
public final class RocketMqSimpleConsume {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        String topic = args[1];
        String group = args[2];
        String prefix = args[3];
        int count = Integer.parseInt(args[4]);
        long limit = args.length > 5 ? Long.parseLong(args[5]) : 120;
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .setRequestTimeout(Duration.ofSeconds(10))
                .enableSsl(false)
                .build();
        var consumer = provider.newSimpleConsumerBuilder()
                .setClientConfiguration(config)
                .setConsumerGroup(group)
                .setAwaitDuration(Duration.ofSeconds(10))
                .setSubscriptionExpressions(Collections.singletonMap(
                        topic, new FilterExpression("*", FilterExpressionType.TAG)))
                .build();
        long deadline = System.nanoTime() + limit * 1_000_000_000L;
        var seen = new java.util.HashSet<String>();
        int others = 0;
        while (seen.size() < count) {
            if (System.nanoTime() > deadline) {
                System.out.println("timeout after=" + seen.size());
                System.exit(2);
            }
            for (MessageView message : consumer.receive(16, Duration.ofSeconds(30))) {
                var body = StandardCharsets.UTF_8.decode(message.getBody()).toString();
                consumer.ack(message);
                if (body.startsWith(prefix)) {
                    seen.add(body);
                } else {
                    others++;
                }
            }
        }
        System.out.println("consumed=" + seen.size());
        System.out.println("others=" + others);
        System.out.flush();
        consumer.close();
        System.exit(0);
    }
}
