package peers;

import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;

/**
 * The end-to-end benchmark's RocketMQ producer (rocketmq-client-java): COUNT messages of SIZE
 * bytes with sendAsync, at most IN_FLIGHT not yet answered; latency from each sendAsync to its
 * answer.
 * Usage: E2eRocketMqProduce ENDPOINT TOPIC COUNT SIZE IN_FLIGHT
 */
public final class E2eRocketMqProduce {
    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        int size = Integer.parseInt(args[3]);
        int inFlight = Integer.parseInt(args[4]);
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder()
                .setEndpoints(endpoint)
                .setRequestTimeout(Duration.ofSeconds(30))
                .enableSsl(false)
                .build();
        var producer = provider.newProducerBuilder()
                .setClientConfiguration(config)
                .setTopics(topic)
                .build();
        byte[] body = new byte[size];
        java.util.Arrays.fill(body, (byte) 'x');
        long[] latencies = new long[count];
        var window = new Semaphore(inFlight);
        var done = new CountDownLatch(count);
        var failed = new AtomicInteger();
        E2e.start();
        long start = System.nanoTime();
        for (int i = 0; i < count; i++) {
            window.acquire();
            final int index = i;
            long sent = System.nanoTime();
            var message = provider.newMessageBuilder().setTopic(topic).setBody(body).build();
            producer.sendAsync(message).whenComplete((receipt, error) -> {
                latencies[index] = System.nanoTime() - sent;
                if (error != null && failed.getAndIncrement() == 0) {
                    System.err.println("send failed: " + error);
                }
                window.release();
                done.countDown();
            });
        }
        done.await();
        if (failed.get() > 0) {
            System.err.println(failed.get() + " of " + count + " sends failed");
            System.exit(2);
        }
        E2e.result(count, start, latencies);
        producer.close();
        System.exit(0);
    }
}
