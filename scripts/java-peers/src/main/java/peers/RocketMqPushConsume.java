package peers;

import java.time.Duration;
import java.util.Collections;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;

/**
 * The official RocketMQ 5 Java client's push consumer: consumes until COUNT messages whose body
 * starts with PREFIX were handled (each returns SUCCESS, so the client acks it).
 * Usage: RocketMqPushConsume ENDPOINT TOPIC GROUP PREFIX COUNT
 * Prints "ready" once started, "consumed=COUNT", waits for standard input to close, closes the consumer and prints
 * "closed cpu_ms=CPU" (CPU from before starting to after close).
 */
public final class RocketMqPushConsume {
    public static void main(String[] args) throws Exception {
        long cpu = Cpu.millis();
        String endpoint = args[0];
        String topic = args[1];
        String group = args[2];
        String prefix = args[3];
        int count = Integer.parseInt(args[4]);
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .setRequestTimeout(Duration.ofSeconds(10))
                .enableSsl(false)
                .build();
        var ours = new AtomicInteger();
        var done = new java.util.concurrent.CountDownLatch(1);
        var consumer = provider.newPushConsumerBuilder()
                .setClientConfiguration(config)
                .setConsumerGroup(group)
                .setSubscriptionExpressions(Collections.singletonMap(
                        topic, new FilterExpression("*", FilterExpressionType.TAG)))
                .setMessageListener(message -> {
                    var body = java.nio.charset.StandardCharsets.UTF_8.decode(message.getBody()).toString();
                    if (body.startsWith(prefix) && ours.incrementAndGet() == count) {
                        done.countDown();
                    }
                    return ConsumeResult.SUCCESS;
                })
                .build();
        System.out.println("ready");
        System.out.flush();
        if (!done.await(300, java.util.concurrent.TimeUnit.SECONDS)) {
            System.out.println("timeout after=" + ours.get());
            System.exit(2);
        }
        System.out.println("consumed=" + count);
        System.out.flush();
        Cpu.awaitStdinClosed();
        consumer.close();
        System.out.println("closed cpu_ms=" + (Cpu.millis() - cpu));
        System.exit(0);
    }
}
