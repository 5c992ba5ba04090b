package peers;

import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;

/**
 * The end-to-end benchmark's RocketMQ producer (rocketmq-client-java): messages of SIZE bytes
 * with sendAsync, at most IN_FLIGHT not yet answered; latency from each sendAsync to its
 * answer. COUNT messages, or with "--warmup-secs W --window-secs D" sends without end and
 * measures the answers that come in the D seconds after the first W (steady state: the JIT
 * warm-up falls outside the window).
 * Usage: E2eRocketMqProduce ENDPOINT TOPIC COUNT SIZE IN_FLIGHT [--warmup-secs W --window-secs D]
 */
public final class E2eRocketMqProduce {
    /** The most latencies kept in a steady-state window (answers beyond are counted only). */
    private static final int MAX_LATENCIES = 1_000_000;

    public static void main(String[] args) throws Exception {
        String endpoint = args[0];
        String topic = args[1];
        int count = Integer.parseInt(args[2]);
        int size = Integer.parseInt(args[3]);
        int inFlight = Integer.parseInt(args[4]);
        long warmupSecs = 0;
        long windowSecs = 0;
        for (int i = 5; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--warmup-secs" -> warmupSecs = Long.parseLong(args[i + 1]);
                case "--window-secs" -> windowSecs = Long.parseLong(args[i + 1]);
                default -> throw new IllegalArgumentException("unknown flag " + args[i]);
            }
        }
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
        var window = new Semaphore(inFlight);
        var failed = new AtomicInteger();
        if (windowSecs > 0) {
            steady(provider, producer, topic, body, window, failed, warmupSecs, windowSecs);
            return;
        }
        long[] latencies = new long[count];
        var done = new CountDownLatch(count);
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

    /** Sends until the window closes; counts the answers within it. */
    private static void steady(ClientServiceProvider provider,
            org.apache.rocketmq.client.apis.producer.Producer producer, String topic, byte[] body,
            Semaphore window, AtomicInteger failed, long warmupSecs, long windowSecs)
            throws Exception {
        long began = System.nanoTime();
        long openAt = began + warmupSecs * 1_000_000_000L;
        long closeAt = openAt + windowSecs * 1_000_000_000L;
        long[] latencies = new long[MAX_LATENCIES];
        var counted = new AtomicLong();
        boolean opened = false;
        while (System.nanoTime() < closeAt) {
            if (!opened && System.nanoTime() >= openAt) {
                E2e.start();
                opened = true;
            }
            window.acquire();
            long sent = System.nanoTime();
            var message = provider.newMessageBuilder().setTopic(topic).setBody(body).build();
            producer.sendAsync(message).whenComplete((receipt, error) -> {
                long now = System.nanoTime();
                if (error != null && failed.getAndIncrement() == 0) {
                    System.err.println("send failed: " + error);
                }
                if (error == null && now >= openAt && now < closeAt) {
                    long index = counted.getAndIncrement();
                    if (index < MAX_LATENCIES) {
                        latencies[(int) index] = now - sent;
                    }
                }
                window.release();
            });
        }
        if (failed.get() > 0) {
            System.err.println(failed.get() + " sends failed");
            System.exit(2);
        }
        long messages = counted.get();
        long[] kept = java.util.Arrays.copyOf(latencies, (int) Math.min(messages, MAX_LATENCIES));
        E2e.result(messages, openAt, kept);
        System.exit(0);
    }
}
