package peers;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.apache.pulsar.client.api.transaction.Transaction;

/**
 * The steady shape of a transactional Shared consumer: a batching producer sends at a fixed rate while
 * one Shared consumer acknowledges every message inside a transaction: every TXN_EVERY received messages
 * (or fewer, when a receive times out) it opens a transaction, acknowledges them in it all at once, waits
 * for every answer and ends it in the background (at most two ends in flight) while it goes on receiving,
 * aborting every ABORT_EVERY-th ended transaction (0 = never), until every produced payload is in a
 * committed transaction.
 * Usage: PulsarTxnSteady SERVICE_URL TOPIC SUBSCRIPTION SECONDS RATE BATCH TXN_EVERY ABORT_EVERY TIMEOUT_SECONDS
 * The producer sends "p0", "p1", ... (UTF-8) for SECONDS seconds at RATE messages per second, without
 * transactions, BATCH messages per batch at most, with a 50 ms batching delay. A failed transactional ack
 * counts in acks_refused (its payload is not part of the transaction); a failed commit counts in
 * commits_refused, the transaction is then aborted and its payloads are not committed.
 * Prints "ready" once subscribed, then one line:
 * result produced=N committed=N duplicates=N txns_committed=N txns_aborted=N acks_refused=N
 * commits_refused=N drain_ms=N drained=true|false
 * (committed = distinct payloads committed, duplicates = payloads committed again, drain_ms = from the start
 * of producing to done). Exits 0 when drained, 2 when TIMEOUT_SECONDS passed first.
 */
public final class PulsarTxnSteady {
    private static final long WAIT_SECONDS = 30;

    private final Set<String> produced = ConcurrentHashMap.newKeySet();
    private final AtomicInteger sendsFailed = new AtomicInteger();
    private volatile boolean producerDone;
    private volatile boolean stopProducing;

    private final Set<String> committed = new HashSet<>();
    private int duplicates;
    private int txnsCommitted;
    private int txnsAborted;
    private int acksRefused;
    private int commitsRefused;
    private int txnsEnded;

    public static void main(String[] args) throws Exception {
        System.exit(new PulsarTxnSteady().run(args));
    }

    private int run(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        int seconds = Integer.parseInt(args[3]);
        int rate = Integer.parseInt(args[4]);
        int batch = Integer.parseInt(args[5]);
        int txnEvery = Integer.parseInt(args[6]);
        int abortEvery = Integer.parseInt(args[7]);
        int timeoutSeconds = Integer.parseInt(args[8]);

        PulsarClient client = PulsarClient.builder().serviceUrl(url).enableTransaction(true).build();
        Consumer<byte[]> consumer = client.newConsumer()
                .topic(topic)
                .subscriptionName(subscription)
                .subscriptionType(SubscriptionType.Shared)
                .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                .subscribe();
        System.out.println("ready");
        System.out.flush();
        Producer<byte[]> producer = client.newProducer()
                .topic(topic)
                .enableBatching(true)
                .batchingMaxMessages(batch)
                .batchingMaxPublishDelay(50, TimeUnit.MILLISECONDS)
                .blockIfQueueFull(true)
                .create();

        long start = System.nanoTime();
        long deadline = start + TimeUnit.SECONDS.toNanos(timeoutSeconds);
        Thread producing = new Thread(() -> produce(producer, seconds, rate, start), "producer");
        producing.setDaemon(true);
        producing.start();

        List<Message<byte[]>> received = new ArrayList<>();
        boolean drained = false;
        long doneAt;
        CompletableFuture<Transaction> next = null;
        java.util.ArrayDeque<Ending> ending = new java.util.ArrayDeque<>();
        while (true) {
            while (!ending.isEmpty() && ending.peekFirst().end.isDone()) {
                settle(ending.pollFirst());
            }
            if (producerDone && committed.containsAll(produced)) {
                drained = true;
                doneAt = System.nanoTime();
                break;
            }
            if (System.nanoTime() - deadline >= 0) {
                doneAt = System.nanoTime();
                break;
            }
            Message<byte[]> message = consumer.receive(200, TimeUnit.MILLISECONDS);
            if (message != null) {
                received.add(message);
                if (received.size() < txnEvery) {
                    continue;
                }
            } else if (received.isEmpty()) {
                continue;
            }
            // The messages received are acknowledged in one transaction, all at once (the acks go
            // out together and the transaction ends once every answer is in). The transaction was
            // opened while the previous one went on, and the next one is opened now (as the Rust
            // loop does; this client registers the subscription itself, at the first ack).
            Transaction txn;
            try {
                if (next == null) {
                    next = openTransaction(client);
                }
                txn = next.get(WAIT_SECONDS, TimeUnit.SECONDS);
                next = openTransaction(client);
            } catch (Exception e) {
                next = null;
                System.err.println("newTransaction failed: " + e);
                received.forEach(consumer::negativeAcknowledge);
                received.clear();
                continue;
            }
            List<CompletableFuture<Void>> acks = new ArrayList<>();
            for (Message<byte[]> each : received) {
                acks.add(consumer.acknowledgeAsync(each.getMessageId(), txn));
            }
            List<String> txnPayloads = new ArrayList<>();
            for (int i = 0; i < received.size(); i++) {
                Message<byte[]> each = received.get(i);
                String payload = new String(each.getData(), StandardCharsets.UTF_8);
                try {
                    acks.get(i).get(WAIT_SECONDS, TimeUnit.SECONDS);
                    txnPayloads.add(payload);
                } catch (ExecutionException e) {
                    acksRefused++;
                    if (acksRefused <= 3) {
                        System.err.println("ack refused " + payload + " " + each.getMessageId() + ": "
                                + e.getCause());
                    }
                } catch (Exception e) {
                    acksRefused++;
                    if (acksRefused <= 3) {
                        System.err.println("ack failed " + payload + " " + each.getMessageId() + ": " + e);
                    }
                }
            }
            received.clear();
            while (ending.size() >= 2) {
                settle(ending.pollFirst());
            }
            ending.addLast(endTransaction(txn, txnPayloads, abortEvery));
        }
        while (!ending.isEmpty()) {
            settle(ending.pollFirst());
        }
        long drainMs = TimeUnit.NANOSECONDS.toMillis(doneAt - start);
        if (next != null) {
            try {
                abortQuietly(next.get(WAIT_SECONDS, TimeUnit.SECONDS));
            } catch (Exception e) {
                System.err.println("the unused transaction: " + e);
            }
        }
        stopProducing = true;
        producing.join(TimeUnit.SECONDS.toMillis(WAIT_SECONDS));
        if (sendsFailed.get() > 0) {
            System.err.println("sends failed: " + sendsFailed.get());
        }
        System.out.println("result produced=" + produced.size() + " committed=" + committed.size()
                + " duplicates=" + duplicates + " txns_committed=" + txnsCommitted + " txns_aborted=" + txnsAborted
                + " acks_refused=" + acksRefused + " commits_refused=" + commitsRefused + " drain_ms=" + drainMs
                + " drained=" + drained);
        System.out.flush();
        closeQuietly("consumer", consumer.closeAsync());
        closeQuietly("producer", producer.closeAsync());
        closeQuietly("client", client.closeAsync());
        return drained ? 0 : 2;
    }

    /** Sends "p<i>" at RATE per second for SECONDS seconds, paced against the start, then waits for every send. */
    private void produce(Producer<byte[]> producer, int seconds, int rate, long start) {
        List<CompletableFuture<MessageId>> sends = new ArrayList<>();
        try {
            long total = (long) seconds * rate;
            for (long i = 0; i < total && !stopProducing; i++) {
                long due = start + i * 1_000_000_000L / rate;
                long wait = due - System.nanoTime();
                if (wait > 0) {
                    TimeUnit.NANOSECONDS.sleep(wait);
                }
                String payload = "p" + i;
                sends.add(producer.sendAsync(payload.getBytes(StandardCharsets.UTF_8)).whenComplete((id, e) -> {
                    if (e == null) {
                        produced.add(payload);
                    } else if (sendsFailed.incrementAndGet() <= 3) {
                        System.err.println("send failed " + payload + ": " + e);
                    }
                }));
            }
            producer.flushAsync().get(WAIT_SECONDS, TimeUnit.SECONDS);
        } catch (Exception e) {
            System.err.println("producer failed: " + e);
        }
        for (var send : sends) {
            try {
                send.get(WAIT_SECONDS, TimeUnit.SECONDS);
            } catch (Exception e) {
                // counted in sendsFailed (or timed out: not produced)
            }
        }
        producerDone = true;
    }

    /** Opens a transaction with a 60 s timeout (a failed future when the client refuses). */
    private static CompletableFuture<Transaction> openTransaction(PulsarClient client) {
        try {
            return client.newTransaction().withTransactionTimeout(60, TimeUnit.SECONDS).build();
        } catch (Exception e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /** A transaction ending in the background. */
    private record Ending(Transaction txn, boolean abort, List<String> payloads, CompletableFuture<Void> end) {
    }

    /** Starts ending the transaction: the ABORT_EVERY-th ended ones are aborted, the others committed. */
    private Ending endTransaction(Transaction txn, List<String> payloads, int abortEvery) {
        txnsEnded++;
        boolean abort = abortEvery > 0 && txnsEnded % abortEvery == 0;
        return new Ending(txn, abort, payloads, abort ? txn.abort() : txn.commit());
    }

    /** Waits for the end and counts it: a commit's payloads are committed. */
    private void settle(Ending ending) {
        Transaction txn = ending.txn();
        if (ending.abort()) {
            try {
                ending.end().get(WAIT_SECONDS, TimeUnit.SECONDS);
            } catch (Exception e) {
                System.err.println("abort failed " + txn.getTxnID() + ": " + e);
            }
            txnsAborted++;
            return;
        }
        try {
            ending.end().get(WAIT_SECONDS, TimeUnit.SECONDS);
        } catch (Exception e) {
            commitsRefused++;
            if (commitsRefused <= 3) {
                System.err.println("commit refused " + txn.getTxnID() + ": " + e);
            }
            if (txn.getState() != Transaction.State.ABORTED) {
                abortQuietly(txn);
            }
            return;
        }
        txnsCommitted++;
        for (String payload : ending.payloads()) {
            if (!committed.add(payload)) {
                duplicates++;
            }
        }
    }

    private static void abortQuietly(Transaction txn) {
        try {
            txn.abort().get(WAIT_SECONDS, TimeUnit.SECONDS);
        } catch (Exception e) {
            // ignored: the transaction is not committed either way
        }
    }

    private static void closeQuietly(String what, CompletableFuture<Void> close) {
        try {
            close.get(WAIT_SECONDS, TimeUnit.SECONDS);
        } catch (Exception e) {
            System.err.println("close " + what + " failed: " + e);
        }
    }
}
