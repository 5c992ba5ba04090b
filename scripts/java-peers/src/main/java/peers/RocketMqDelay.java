package peers;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collections;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;

/**
 * The official RocketMQ 5 Java client with delay (timed) messages.
 * <ul>
 * <li>{@code send ENDPOINT TOPIC PREFIX COUNT DELAY_MS}: sends COUNT messages with bodies
 * PREFIX-0 ... each with a delivery timestamp DELAY_MS after its send; prints
 * "sent=BODY due=UNIX_MS" per message.</li>
 * <li>{@code consume ENDPOINT TOPIC GROUP PREFIX COUNT TIMEOUT_S}: a push consumer that prints
 * "ready" once started and "got=BODY at=UNIX_MS due=UNIX_MS" for each message whose body starts
 * with PREFIX (the delivery timestamp the message carries, -1 without one) until COUNT came;
 * exits with status 1 after TIMEOUT_S seconds without them.</li>
 * </ul>
 */
public final class RocketMqDelay {
    public static void main(String[] args) throws Exception {
        String mode = args[0];
        String endpoint = args[1];
        String topic = args[2];
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .setRequestTimeout(Duration.ofSeconds(10))
                .enableSsl(false)
                .build();
        switch (mode) {
            case "send" -> {
                String prefix = args[3];
                int count = Integer.parseInt(args[4]);
                long delayMs = Long.parseLong(args[5]);
                var producer = provider.newProducerBuilder()
                        .setClientConfiguration(config)
                        .setTopics(topic)
                        .build();
                for (int i = 0; i < count; i++) {
                    String body = prefix + "-" + i;
                    long due = System.currentTimeMillis() + delayMs;
                    var message = provider.newMessageBuilder()
                            .setTopic(topic)
                            .setBody(body.getBytes(StandardCharsets.UTF_8))
                            .setDeliveryTimestamp(due)
                            .build();
                    producer.send(message);
                    System.out.println("sent=" + body + " due=" + due);
                }
                System.out.flush();
                producer.close();
            }
            case "consume" -> {
                String group = args[3];
                String prefix = args[4];
                int count = Integer.parseInt(args[5]);
                long timeout = Long.parseLong(args[6]);
                var got = new AtomicInteger();
                var done = new CountDownLatch(1);
                var consumer = provider.newPushConsumerBuilder()
                        .setClientConfiguration(config)
                        .setConsumerGroup(group)
                        .setSubscriptionExpressions(Collections.singletonMap(
                                topic, new FilterExpression("*", FilterExpressionType.TAG)))
                        .setMessageListener(message -> {
                            long at = System.currentTimeMillis();
                            String body = StandardCharsets.UTF_8.decode(message.getBody()).toString();
                            if (body.startsWith(prefix)) {
                                long due = message.getDeliveryTimestamp().orElse(-1L);
                                synchronized (System.out) {
                                    System.out.println("got=" + body + " at=" + at + " due=" + due);
                                    System.out.flush();
                                }
                                if (got.incrementAndGet() >= count) {
                                    done.countDown();
                                }
                            }
                            return ConsumeResult.SUCCESS;
                        })
                        .build();
                System.out.println("ready");
                System.out.flush();
                boolean all = done.await(timeout, TimeUnit.SECONDS);
                consumer.close();
                if (!all) {
                    System.out.println("timeout got=" + got.get());
                    System.out.flush();
                    System.exit(1);
                }
            }
            default -> throw new IllegalArgumentException("MODE is send or consume: " + mode);
        }
        System.exit(0);
    }
}
