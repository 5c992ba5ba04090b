package peers;

import java.time.Duration;
import java.util.Collections;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;
import org.apache.rocketmq.client.apis.consumer.SimpleConsumer;
import org.apache.rocketmq.client.apis.message.MessageView;

/**
 * The end-to-end benchmark's RocketMQ simple consumer (rocketmq-client-java): 4 threads each
 * receive up to 32 messages invisible for 30 s (awaiting up to 30 s) and acknowledge each one
 * with {@code ackAsync} (one AckMessage request per message, as the client sends them), until
 * COUNT messages came. The window opens at the WARMUP-th message (the JIT's warm-up excluded).
 * Usage: E2eRocketMqSimpleConsume ENDPOINT TOPIC GROUP COUNT WARMUP
 */
public final class E2eRocketMqSimpleConsume {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        String topic = args[1];
        String group = args[2];
        int count = Integer.parseInt(args[3]);
        int warmup = Integer.parseInt(args[4]);
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .setRequestTimeout(Duration.ofSeconds(10))
                .enableSsl(false)
                .build();
        SimpleConsumer consumer = provider.newSimpleConsumerBuilder()
                .setClientConfiguration(config)
                .setConsumerGroup(group)
                .setAwaitDuration(Duration.ofSeconds(30))
                .setSubscriptionExpressions(Collections.singletonMap(
                        topic, new FilterExpression("*", FilterExpressionType.TAG)))
                .build();
        var received = new AtomicInteger();
        var failedAcks = new AtomicInteger();
        var done = new CountDownLatch(1);
        long[] start = new long[1];
        for (int t = 0; t < 4; t++) {
            var thread = new Thread(() -> {
                while (true) {
                    java.util.List<MessageView> messages;
                    try {
                        messages = consumer.receive(32, Duration.ofSeconds(30));
                    } catch (Exception e) {
                        continue;
                    }
                    for (MessageView message : messages) {
                        int n = received.incrementAndGet();
                        if (n == warmup) {
                            synchronized (start) {
                                start[0] = System.nanoTime();
                            }
                            E2e.start();
                        }
                        if (n == count) {
                            done.countDown();
                        }
                        consumer.ackAsync(message).whenComplete((ok, error) -> {
                            if (error != null) {
                                failedAcks.incrementAndGet();
                            }
                        });
                    }
                }
            });
            thread.setDaemon(true);
            thread.start();
        }
        if (!done.await(600, TimeUnit.SECONDS)) {
            System.err.println("timeout after " + received.get() + " messages");
            System.exit(2);
        }
        long begun;
        synchronized (start) {
            begun = start[0];
        }
        System.out.println("note ack_requests=" + count + " (one per message) failed_acks=" + failedAcks.get());
        E2e.result(count - warmup, begun, null);
        consumer.close();
        System.exit(0);
    }
}
