package peers;

import java.time.Duration;
import java.util.Collections;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;

/**
 * The end-to-end benchmark's RocketMQ latency push consumer (rocketmq-client-java, default
 * settings): every message's listener call returns SUCCESS (so the client acks it), as
 * E2eRocketMqPushConsume. Prints "ready" once built (the driver then publishes at a fixed
 * rate, each payload stamped with its send time), then measures each message's latency in the
 * window of {@link E2eLatencyWindow}.
 * Usage: E2eRocketMqPushLatency ENDPOINT TOPIC GROUP WARMUP_SECS WINDOW_SECS
 */
public final class E2eRocketMqPushLatency {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        String topic = args[1];
        String group = args[2];
        long warmup = Long.parseLong(args[3]);
        long seconds = Long.parseLong(args[4]);
        var window = new E2eLatencyWindow(warmup, seconds);
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .setRequestTimeout(Duration.ofSeconds(10))
                .enableSsl(false)
                .build();
        var consumer = provider.newPushConsumerBuilder()
                .setClientConfiguration(config)
                .setConsumerGroup(group)
                .setSubscriptionExpressions(Collections.singletonMap(
                        topic, new FilterExpression("*", FilterExpressionType.TAG)))
                .setMessageListener(message -> {
                    var body = message.getBody();
                    window.message(body.getLong(body.position()));
                    return ConsumeResult.SUCCESS;
                })
                .build();
        System.out.println("ready");
        System.out.flush();
        if (!window.await(warmup + seconds + 600)) {
            System.err.println("the window did not close");
            System.exit(2);
        }
        window.result();
        consumer.close();
        System.exit(0);
    }
}
