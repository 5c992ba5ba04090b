package peers;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;

/**
 * One side of the restart benchmark (scripts/bench-restart.sh) with the official Java client:
 * a batching producer (10 per batch, 20 ms) and a Shared consumer on TOPIC, sending RATE msg/s
 * for SECONDS while the broker is restarted; every delivery is acknowledged.
 * Usage: PulsarRestartStream SERVICE_URL TOPIC RATE SECONDS PATIENCE
 * Prints, with the Unix time in ms: "sent MS PAYLOAD", "send-error MS PAYLOAD ERROR",
 * "recv MS PAYLOAD", "recv-error MS ERROR", then "done".
 */
public final class PulsarRestartStream {
    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        int rate = Integer.parseInt(args[2]);
        int seconds = Integer.parseInt(args[3]);
        int patience = Integer.parseInt(args[4]);
        try (PulsarClient client = PulsarClient.builder().serviceUrl(url).build()) {
            var consumer = client.newConsumer()
                    .topic(topic)
                    .subscriptionName("restart")
                    .subscriptionType(SubscriptionType.Shared)
                    .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                    .subscribe();
            var producer = client.newProducer()
                    .topic(topic)
                    .enableBatching(true)
                    .batchingMaxMessages(10)
                    .batchingMaxPublishDelay(20, TimeUnit.MILLISECONDS)
                    .blockIfQueueFull(true)
                    .create();
            say("ready");
            Set<String> sent = ConcurrentHashMap.newKeySet();
            AtomicInteger pending = new AtomicInteger();
            long total = (long) rate * seconds;
            Thread producing = new Thread(() -> {
                long started = System.nanoTime();
                for (long i = 0; i < total; i++) {
                    long wait = started + i * 1_000_000_000L / rate - System.nanoTime();
                    if (wait > 0) {
                        try {
                            TimeUnit.NANOSECONDS.sleep(wait);
                        } catch (InterruptedException e) {
                            return;
                        }
                    }
                    String payload = "m" + i;
                    pending.incrementAndGet();
                    producer.sendAsync(payload.getBytes()).whenComplete((id, error) -> {
                        if (error == null) {
                            sent.add(payload);
                            say("sent " + System.currentTimeMillis() + " " + payload);
                        } else {
                            say("send-error " + System.currentTimeMillis() + " " + payload + " "
                                    + error.getClass().getSimpleName());
                        }
                        pending.decrementAndGet();
                    });
                }
            });
            producing.start();
            Set<String> seen = ConcurrentHashMap.newKeySet();
            long deadline = System.currentTimeMillis() + (seconds + patience) * 1000L;
            while (System.currentTimeMillis() < deadline) {
                if (!producing.isAlive() && pending.get() == 0 && seen.containsAll(sent)) {
                    break;
                }
                try {
                    var message = consumer.receive(200, TimeUnit.MILLISECONDS);
                    if (message == null) {
                        continue;
                    }
                    String payload = new String(message.getData());
                    say("recv " + System.currentTimeMillis() + " " + payload);
                    seen.add(payload);
                    consumer.acknowledgeAsync(message);
                } catch (Exception e) {
                    say("recv-error " + System.currentTimeMillis() + " " + e.getClass().getSimpleName());
                    Thread.sleep(100);
                }
            }
            producing.join();
            consumer.close();
            producer.close();
        }
        say("done");
    }
}
