package peers;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.message.MessageView;

/**
 * The official RocketMQ 5 Java client 5.2.0 with priority messages and lite topics (RocketMQ
 * 5.4+).
 * <ul>
 * <li>{@code send-priority ENDPOINT TOPIC PREFIX LEVEL COUNT}: sends COUNT messages with bodies
 * PREFIX-0 ... and priority LEVEL ({@code setPriority}); prints "sent=BODY" per message.</li>
 * <li>{@code send-lite ENDPOINT TOPIC PREFIX LITE_TOPIC COUNT}: the same with a lite topic
 * ({@code setLiteTopic}).</li>
 * <li>{@code receive ENDPOINT TOPIC GROUP PREFIX COUNT TIMEOUT_S [PAUSE_S]}: a simple consumer
 * that first takes (and acknowledges) what is left for the group, prints "ready", waits PAUSE_S
 * seconds (0; time for a backlog to be sent), then prints
 * "got=BODY priority=P lite=L" (-1 and - when absent) for each message whose body starts with
 * PREFIX, in arrival order, until COUNT came; exits with status 1 after TIMEOUT_S seconds
 * without them.</li>
 * <li>{@code lite-consume ENDPOINT TOPIC GROUP LITE_TOPIC PREFIX COUNT TIMEOUT_S}: a lite push
 * consumer bound to TOPIC that subscribes to LITE_TOPIC, prints "ready", then "got=BODY
 * priority=P lite=L" per message with PREFIX until COUNT came (status 1 after TIMEOUT_S).</li>
 * </ul>
 */
public final class RocketMq55 {
    private static String line(MessageView message) {
        String body = StandardCharsets.UTF_8.decode(message.getBody()).toString();
        return "got=" + body + " priority=" + message.getPriority().orElse(-1)
                + " lite=" + message.getLiteTopic().orElse("-");
    }

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
            case "send-priority", "send-lite" -> {
                String prefix = args[3];
                String option = args[4];
                int count = Integer.parseInt(args[5]);
                var producer = provider.newProducerBuilder()
                        .setClientConfiguration(config)
                        .setTopics(topic)
                        .build();
                for (int i = 0; i < count; i++) {
                    String body = prefix + "-" + i;
                    var builder = provider.newMessageBuilder()
                            .setTopic(topic)
                            .setBody(body.getBytes(StandardCharsets.UTF_8));
                    if (mode.equals("send-priority")) {
                        builder.setPriority(Integer.parseInt(option));
                    } else {
                        builder.setLiteTopic(option);
                    }
                    producer.send(builder.build());
                    System.out.println("sent=" + body);
                }
                System.out.flush();
                producer.close();
            }
            case "receive" -> {
                String group = args[3];
                String prefix = args[4];
                int count = Integer.parseInt(args[5]);
                long timeout = Long.parseLong(args[6]);
                var consumer = provider.newSimpleConsumerBuilder()
                        .setClientConfiguration(config)
                        .setConsumerGroup(group)
                        .setAwaitDuration(Duration.ofSeconds(5))
                        .setSubscriptionExpressions(java.util.Collections.singletonMap(
                                topic, new FilterExpression("*", FilterExpressionType.TAG)))
                        .build();
                while (true) {
                    var left = consumer.receive(32, Duration.ofSeconds(30));
                    if (left.isEmpty()) {
                        break;
                    }
                    for (var message : left) {
                        consumer.ack(message);
                    }
                }
                System.out.println("ready");
                System.out.flush();
                if (args.length > 7) {
                    Thread.sleep(Long.parseLong(args[7]) * 1000);
                }
                long end = System.currentTimeMillis() + timeout * 1000;
                int got = 0;
                while (got < count && System.currentTimeMillis() < end) {
                    for (var message : consumer.receive(32, Duration.ofSeconds(30))) {
                        consumer.ack(message);
                        String body = StandardCharsets.UTF_8.decode(message.getBody().duplicate()).toString();
                        if (body.startsWith(prefix)) {
                            System.out.println(line(message));
                            got++;
                        }
                    }
                    System.out.flush();
                }
                consumer.close();
                if (got < count) {
                    System.out.println("timeout got=" + got);
                    System.out.flush();
                    System.exit(1);
                }
            }
            case "lite-consume" -> {
                String group = args[3];
                String lite = args[4];
                String prefix = args[5];
                int count = Integer.parseInt(args[6]);
                long timeout = Long.parseLong(args[7]);
                var got = new AtomicInteger();
                var done = new CountDownLatch(1);
                var consumer = provider.newLitePushConsumerBuilder()
                        .setClientConfiguration(config)
                        .setConsumerGroup(group)
                        .bindTopic(topic)
                        .setMessageListener(message -> {
                            String body = StandardCharsets.UTF_8.decode(message.getBody().duplicate()).toString();
                            if (body.startsWith(prefix)) {
                                synchronized (System.out) {
                                    System.out.println(line(message));
                                    System.out.flush();
                                }
                                if (got.incrementAndGet() >= count) {
                                    done.countDown();
                                }
                            }
                            return ConsumeResult.SUCCESS;
                        })
                        .build();
                consumer.subscribeLite(lite);
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
            default -> throw new IllegalArgumentException(
                    "MODE is send-priority, send-lite, receive or lite-consume: " + mode);
        }
        System.exit(0);
    }
}
