package peers;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.apis.ClientConfiguration;
import org.apache.rocketmq.client.apis.ClientServiceProvider;
import org.apache.rocketmq.client.apis.consumer.ConsumeResult;
import org.apache.rocketmq.client.apis.consumer.FilterExpression;
import org.apache.rocketmq.client.apis.consumer.FilterExpressionType;

/**
 * One side of the RocketMQ restart benchmark with the official Java client (5.0.8): a producer
 * sending a steady stream (asynchronous sends, the client's default retry policy: 3 attempts
 * with backoff, 3 s request timeout) and a push consumer (every message returns SUCCESS, so the
 * client acks it) on TOPIC, while the broker is stopped and started again from outside.
 *
 * <p>Usage: RocketMqRestartStream ENDPOINT TOPIC RATE SECONDS [PREFIX [DRAIN_SECONDS [GROUP]]]
 *
 * <ul>
 *   <li>PREFIX (default "rs-" plus the start time): the payloads are PREFIX + sequence number;
 *       only deliveries with this prefix count, so older messages on the topic do not.
 *   <li>DRAIN_SECONDS (60): after the last send completes, how long to wait for the missing
 *       deliveries; the wait ends earlier once every sent message was received and 3 s passed
 *       without a delivery (late duplicates still count).
 *   <li>GROUP (default "restart-stream"): the consumer group.
 * </ul>
 *
 * <p>Before the stream, warm-up messages (PREFIX + "warmup-N", not counted) go out every 500 ms
 * until the consumer receives one (at most 60 s), so the stream begins with a live consumer.
 *
 * <p>Prints "ready" when the stream begins, a progress line every 5 s on standard error, and at
 * the end one JSON line on standard output: sent (acknowledged by the broker), send_failed (the
 * client gave up after its attempts), send_attempt_errors (always null: the failed attempts
 * the client retried are not observable, as the public API reports only the last one and the
 * 5.0.8 client's shaded logging binds to no backend, so it logs nothing), the first and last
 * send failure (Unix ms) and the latency of the failed sends (min, median, max ms, from the
 * send call to the failure: the time the retries took), send_errors (the final failures by
 * exception and message), received (deliveries), unique, duplicates (received - unique),
 * redelivered (deliveries whose delivery attempt is above 1), lost (sent but never received),
 * received_not_acked_send (received although the send reported a failure), the longest gap
 * between two send acknowledgements and between two deliveries (start, end in Unix ms, and
 * length), and cpu_ms of the whole JVM (see Cpu.java). Exits 0. With RESTART_STREAM_TRACE=FILE
 * it also writes one line per send result and per delivery there ("sent MS PAYLOAD MSGID",
 * "send-failed MS PAYLOAD ERROR", "recv MS PAYLOAD attempt=N id=MSGID [duplicate]").
 */
public final class RocketMqRestartStream {
    private static final Set<String> SENT = ConcurrentHashMap.newKeySet();
    private static final Set<String> FAILED = ConcurrentHashMap.newKeySet();
    private static final Set<String> SEEN = ConcurrentHashMap.newKeySet();
    private static final AtomicInteger RECEIVED = new AtomicInteger();
    private static final AtomicInteger REDELIVERED = new AtomicInteger();
    private static java.io.PrintStream traceOut;

    /** One line of the optional trace (RESTART_STREAM_TRACE=FILE). */
    private static void trace(String what, long ms, String payload, String detail) {
        if (traceOut != null) {
            synchronized (traceOut) {
                traceOut.println(what + " " + ms + " " + payload + " " + detail);
            }
        }
    }
    private static final Map<String, Integer> SEND_ERRORS = new TreeMap<>();
    private static final List<Long> FAILURE_LATENCIES = new ArrayList<>();

    /** Tracks the longest pause between consecutive events (send acks or deliveries). */
    private static final class Gaps {
        private volatile long last;
        private long gapStart;
        private long gapEnd;

        synchronized void event(long now) {
            if (last != 0 && now - last > gapEnd - gapStart) {
                gapStart = last;
                gapEnd = now;
            }
            last = now;
        }

        synchronized String json(String name) {
            return String.format("\"%s_gap_ms\":%d,\"%s_gap_from_ms\":%d,\"%s_gap_to_ms\":%d",
                    name, gapEnd - gapStart, name, gapStart, name, gapEnd);
        }
    }

    public static void main(String[] args) throws Exception {
        long cpu = Cpu.millis();
        if (args.length < 4) {
            System.err.println("usage: RocketMqRestartStream ENDPOINT TOPIC RATE SECONDS [PREFIX [DRAIN_SECONDS [GROUP]]]");
            System.exit(2);
        }
        String endpoint = args[0];
        String topic = args[1];
        int rate = Integer.parseInt(args[2]);
        int seconds = Integer.parseInt(args[3]);
        String prefix = args.length > 4 ? args[4] : "rs-" + System.currentTimeMillis() + "-";
        int drain = args.length > 5 ? Integer.parseInt(args[5]) : 60;
        String group = args.length > 6 ? args[6] : "restart-stream";

        String tracePath = System.getenv("RESTART_STREAM_TRACE");
        if (tracePath != null && !tracePath.isEmpty()) {
            traceOut = new java.io.PrintStream(new java.io.FileOutputStream(tracePath), false, "UTF-8");
        }
        var provider = ClientServiceProvider.loadService();
        var config = ClientConfiguration.newBuilder().setEndpoints(endpoint).enableSsl(false).build();
        Gaps sendGaps = new Gaps();
        Gaps recvGaps = new Gaps();
        AtomicInteger warm = new AtomicInteger();
        var consumer = provider.newPushConsumerBuilder()
                .setClientConfiguration(config)
                .setConsumerGroup(group)
                .setSubscriptionExpressions(Collections.singletonMap(
                        topic, new FilterExpression("*", FilterExpressionType.TAG)))
                .setMessageListener(message -> {
                    String body = StandardCharsets.UTF_8.decode(message.getBody()).toString();
                    if (!body.startsWith(prefix)) {
                        return ConsumeResult.SUCCESS;
                    }
                    if (body.startsWith(prefix + "warmup-")) {
                        warm.incrementAndGet();
                        return ConsumeResult.SUCCESS;
                    }
                    long now = System.currentTimeMillis();
                    recvGaps.event(now);
                    RECEIVED.incrementAndGet();
                    if (message.getDeliveryAttempt() > 1) {
                        REDELIVERED.incrementAndGet();
                    }
                    boolean first = SEEN.add(body);
                    trace("recv", now, body, "attempt=" + message.getDeliveryAttempt()
                            + " id=" + message.getMessageId() + (first ? "" : " duplicate"));
                    return ConsumeResult.SUCCESS;
                })
                .build();
        var producer = provider.newProducerBuilder().setClientConfiguration(config).setTopics(topic).build();

        long warmEnd = System.currentTimeMillis() + 60_000;
        for (int i = 0; warm.get() == 0; i++) {
            if (System.currentTimeMillis() > warmEnd) {
                System.err.println("the consumer received no warm-up message within 60 s");
                System.exit(1);
            }
            producer.sendAsync(provider.newMessageBuilder().setTopic(topic)
                    .setBody((prefix + "warmup-" + i).getBytes(StandardCharsets.UTF_8)).build());
            Thread.sleep(500);
        }
        System.out.println("ready");
        System.out.flush();

        AtomicInteger pending = new AtomicInteger();
        AtomicLong firstFailure = new AtomicLong();
        AtomicLong lastFailure = new AtomicLong();
        long total = (long) rate * seconds;
        long started = System.nanoTime();
        long startedMs = System.currentTimeMillis();
        Thread progress = new Thread(() -> {
            while (!Thread.currentThread().isInterrupted()) {
                try {
                    Thread.sleep(5000);
                } catch (InterruptedException e) {
                    return;
                }
                System.err.printf("[%ds] sent=%d failed=%d pending=%d received=%d unique=%d%n",
                        (System.currentTimeMillis() - startedMs) / 1000, SENT.size(), FAILED.size(),
                        pending.get(), RECEIVED.get(), SEEN.size());
            }
        });
        progress.setDaemon(true);
        progress.start();
        for (long i = 0; i < total; i++) {
            long wait = started + i * 1_000_000_000L / rate - System.nanoTime();
            if (wait > 0) {
                TimeUnit.NANOSECONDS.sleep(wait);
            }
            String payload = prefix + i;
            pending.incrementAndGet();
            long sentAt = System.currentTimeMillis();
            var message = provider.newMessageBuilder().setTopic(topic)
                    .setBody(payload.getBytes(StandardCharsets.UTF_8)).build();
            producer.sendAsync(message).whenComplete((receipt, error) -> {
                long now = System.currentTimeMillis();
                if (error == null) {
                    SENT.add(payload);
                    sendGaps.event(now);
                    trace("sent", now, payload, receipt.getMessageId().toString());
                } else {
                    trace("send-failed", now, payload, String.valueOf(error.getMessage()).replace('\n', ' '));
                    FAILED.add(payload);
                    firstFailure.compareAndSet(0, now);
                    lastFailure.accumulateAndGet(now, Math::max);
                    synchronized (FAILURE_LATENCIES) {
                        FAILURE_LATENCIES.add(now - sentAt);
                    }
                    String what = error.getClass().getSimpleName() + ": "
                            + String.valueOf(error.getMessage()).replaceAll("request-id=[^,\\]]*", "request-id=*");
                    synchronized (SEND_ERRORS) {
                        SEND_ERRORS.merge(what.length() > 200 ? what.substring(0, 200) : what, 1, Integer::sum);
                    }
                }
                pending.decrementAndGet();
            });
        }
        long sendEnd = System.currentTimeMillis() + 120_000;
        while (pending.get() > 0 && System.currentTimeMillis() < sendEnd) {
            Thread.sleep(50);
        }
        long drainEnd = System.currentTimeMillis() + drain * 1000L;
        while (System.currentTimeMillis() < drainEnd) {
            boolean all = SEEN.containsAll(SENT);
            long quiet = System.currentTimeMillis() - Math.max(recvGaps.last, 0);
            if (all && quiet > 3000) {
                break;
            }
            Thread.sleep(100);
        }
        progress.interrupt();
        producer.close();
        consumer.close();
        long cpuMs = Cpu.millis() - cpu;
        if (traceOut != null) {
            traceOut.flush();
        }
        long[] latencies;
        synchronized (FAILURE_LATENCIES) {
            latencies = FAILURE_LATENCIES.stream().mapToLong(Long::longValue).sorted().toArray();
        }
        String failLatency = latencies.length == 0 ? "null"
                : String.format("{\"min\":%d,\"median\":%d,\"max\":%d}", latencies[0],
                        latencies[latencies.length / 2], latencies[latencies.length - 1]);
        List<String> lost = new ArrayList<>();
        for (String p : SENT) {
            if (!SEEN.contains(p)) {
                lost.add(p);
            }
        }
        int receivedFailed = 0;
        for (String p : FAILED) {
            if (SEEN.contains(p)) {
                receivedFailed++;
            }
        }
        StringBuilder errors = new StringBuilder("{");
        synchronized (SEND_ERRORS) {
            for (var e : SEND_ERRORS.entrySet()) {
                if (errors.length() > 1) {
                    errors.append(',');
                }
                errors.append('"').append(e.getKey().replace("\\", "\\\\").replace("\"", "\\\""))
                        .append("\":").append(e.getValue());
            }
        }
        errors.append('}');
        System.out.println("{\"client\":\"java-5.0.8\",\"topic\":\"" + topic + "\",\"rate\":" + rate
                + ",\"seconds\":" + seconds + ",\"started_ms\":" + startedMs
                + ",\"sent\":" + SENT.size() + ",\"send_failed\":" + FAILED.size()
                + ",\"send_unfinished\":" + pending.get()
                + ",\"send_attempt_errors\":null"
                + ",\"first_send_failure_ms\":" + firstFailure.get()
                + ",\"last_send_failure_ms\":" + lastFailure.get()
                + ",\"send_failure_latency_ms\":" + failLatency
                + ",\"received\":" + RECEIVED.get() + ",\"unique\":" + SEEN.size()
                + ",\"duplicates\":" + (RECEIVED.get() - SEEN.size()) + ",\"redelivered\":" + REDELIVERED.get()
                + ",\"lost\":" + lost.size()
                + ",\"received_not_acked_send\":" + receivedFailed
                + "," + sendGaps.json("send_ack") + "," + recvGaps.json("receive")
                + ",\"send_errors\":" + errors + ",\"cpu_ms\":" + cpuMs + "}");
        System.out.flush();
        System.exit(0);
    }
}
