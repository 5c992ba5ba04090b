package peers;

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
 * The end-to-end benchmark's RocketMQ push consumer (rocketmq-client-java, default settings):
 * handles COUNT messages, each returning SUCCESS (so the client acks it).
 * Usage: E2eRocketMqPushConsume ENDPOINT TOPIC GROUP COUNT
 * The window runs from before the consumer is built to the COUNT-th handled message.
 */
public final class E2eRocketMqPushConsume {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        String topic = args[1];
        String group = args[2];
        int count = Integer.parseInt(args[3]);
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .setRequestTimeout(Duration.ofSeconds(10))
                .enableSsl(false)
                .build();
        var handled = new AtomicInteger();
        var done = new CountDownLatch(1);
        E2e.start();
        long start = System.nanoTime();
        var consumer = provider.newPushConsumerBuilder()
                .setClientConfiguration(config)
                .setConsumerGroup(group)
                .setSubscriptionExpressions(Collections.singletonMap(
                        topic, new FilterExpression("*", FilterExpressionType.TAG)))
                .setMessageListener(message -> {
                    if (handled.incrementAndGet() == count) {
                        done.countDown();
                    }
                    return ConsumeResult.SUCCESS;
                })
                .build();
        if (!done.await(600, TimeUnit.SECONDS)) {
            System.err.println("timeout after " + handled.get() + " messages");
            System.exit(2);
        }
        E2e.result(count, start, null);
        consumer.close();
        System.exit(0);
    }
}
