package peers;

import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
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
import org.apache.pulsar.client.api.PulsarClientException;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.apache.pulsar.client.api.transaction.Transaction;

/**
 * The steady shape of transactional Shared consumers: a batching producer sends at a fixed rate while
 * CONSUMERS Shared consumers on one subscription (named c0, c1, ...), each on its own thread, acknowledge
 * every message inside a transaction: every TXN_EVERY received messages (or fewer, when a receive times out)
 * a consumer opens a transaction, acknowledges them in it all at once, waits for every answer and ends it in
 * the background (at most two ends in flight) while it goes on receiving, aborting every ABORT_EVERY-th
 * transaction it ends (0 = never), until every produced payload is in a committed transaction (of any
 * consumer). Whichever consumer receives an aborted transaction's messages acknowledges them again.
 * Usage: PulsarTxnSteady SERVICE_URL TOPIC SUBSCRIPTION SECONDS RATE BATCH TXN_EVERY ABORT_EVERY TIMEOUT_SECONDS
 * [CONSUMERS [WARM_UP_SECONDS]]
 * The producer sends "p0", "p1", ... (UTF-8) without transactions: one batch of BATCH messages every
 * BATCH/RATE seconds, as many batches as make at least SECONDS * RATE messages, with a 50 ms batching delay.
 * A failed transactional ack counts in acks_refused (its payload is not part of the transaction), and in
 * ack_conflicts too when the broker answered TransactionConflict; a failed commit counts in commits_refused,
 * the transaction is then aborted and its payloads are not committed.
 * With WARM_UP_SECONDS above 0 the same shape runs first for that long on TOPIC-warm-up (created by the
 * caller), in this JVM, and prints one "warm-up ..." line.
 * Prints "ready" once the measured run's consumers are subscribed, then one line per payload committed again
 * double_commit payload=P first=I first_ms=T second=J second_ms=T
 * (the consumer that committed it first and the later one, each with when its ack was answered, in ms from
 * the start of producing), then one line:
 * result produced=N committed=N duplicates=N committed_again=N txns_committed=N txns_aborted=N acks_refused=N
 * ack_conflicts=N commits_refused=N drain_ms=N drained=true|false committed_by=N,N,...
 * (committed = distinct payloads committed, duplicates = commits of payloads committed before,
 * committed_again = distinct payloads committed more than once, drain_ms = from the start of producing to
 * done, committed_by = payload commits per consumer). Exits 0 when drained, 2 when TIMEOUT_SECONDS passed
 * first.
 */
public final class PulsarTxnSteady {
    private static final long WAIT_SECONDS = 30;

    public static void main(String[] args) throws Exception {
        String url = args[0];
        String topic = args[1];
        String subscription = args[2];
        int seconds = Integer.parseInt(args[3]);
        int rate = Integer.parseInt(args[4]);
        int batch = Integer.parseInt(args[5]);
        int txnEvery = Integer.parseInt(args[6]);
        int abortEvery = Integer.parseInt(args[7]);
        int timeoutSeconds = Integer.parseInt(args[8]);
        int consumers = args.length > 9 ? Integer.parseInt(args[9]) : 1;
        int warmUpSeconds = args.length > 10 ? Integer.parseInt(args[10]) : 0;

        PulsarClient client = PulsarClient.builder().serviceUrl(url).enableTransaction(true).build();
        if (warmUpSeconds > 0) {
            Run warmUp = new Run(client, topic + "-warm-up", subscription, warmUpSeconds, rate, batch, txnEvery,
                    abortEvery, warmUpSeconds + 30, consumers);
            warmUp.execute(false);
            System.out.println("warm-up produced=" + warmUp.produced.size() + " committed=" + warmUp.firstCommit.size()
                    + " drained=" + warmUp.drained);
        }
        Run run = new Run(client, topic, subscription, seconds, rate, batch, txnEvery, abortEvery, timeoutSeconds,
                consumers);
        run.execute(true);
        run.print();
        closeQuietly("client", client.closeAsync());
        System.exit(run.drained ? 0 : 2);
    }

    /** One run of the shape on one topic. */
    private static final class Run {
        private final PulsarClient client;
        private final String topic;
        private final String subscription;
        private final int seconds;
        private final int rate;
        private final int batch;
        private final int txnEvery;
        private final int abortEvery;
        private final int timeoutSeconds;
        private final int consumerCount;

        private final Set<String> produced = ConcurrentHashMap.newKeySet();
        private final AtomicInteger sendsFailed = new AtomicInteger();
        private volatile boolean producerDone;
        private volatile boolean stopProducing;
        private long start;
        private long deadline;

        /** Guards firstCommit, doubles, drained and doneAt. */
        private final Object lock = new Object();
        /** The first commit of each payload: {consumer, ack answered in ms from the start}. */
        private final Map<String, long[]> firstCommit = new HashMap<>();
        /** Each later commit: {payload, first consumer, first ms, consumer, ms}. */
        private final List<Object[]> doubles = new ArrayList<>();
        private boolean drained;
        private long doneAt;
        private final List<Loop> loops = new ArrayList<>();

        Run(PulsarClient client, String topic, String subscription, int seconds, int rate, int batch, int txnEvery,
                int abortEvery, int timeoutSeconds, int consumerCount) {
            this.client = client;
            this.topic = topic;
            this.subscription = subscription;
            this.seconds = seconds;
            this.rate = rate;
            this.batch = batch;
            this.txnEvery = txnEvery;
            this.abortEvery = abortEvery;
            this.timeoutSeconds = timeoutSeconds;
            this.consumerCount = consumerCount;
        }

        void execute(boolean announce) throws Exception {
            List<Consumer<byte[]>> consumers = new ArrayList<>();
            for (int i = 0; i < consumerCount; i++) {
                consumers.add(client.newConsumer()
                        .topic(topic)
                        .subscriptionName(subscription)
                        .consumerName("c" + i)
                        .subscriptionType(SubscriptionType.Shared)
                        .subscriptionInitialPosition(SubscriptionInitialPosition.Earliest)
                        .subscribe());
            }
            if (announce) {
                System.out.println("ready");
                System.out.flush();
            }
            Producer<byte[]> producer = client.newProducer()
                    .topic(topic)
                    .enableBatching(true)
                    .batchingMaxMessages(batch)
                    .batchingMaxPublishDelay(50, TimeUnit.MILLISECONDS)
                    .blockIfQueueFull(true)
                    .create();

            start = System.nanoTime();
            deadline = start + TimeUnit.SECONDS.toNanos(timeoutSeconds);
            Thread producing = new Thread(() -> produce(producer), "producer");
            producing.setDaemon(true);
            producing.start();
            List<Thread> threads = new ArrayList<>();
            for (int i = 0; i < consumerCount; i++) {
                Loop loop = new Loop(this, i, consumers.get(i));
                loops.add(loop);
                Thread thread = new Thread(loop, "consumer-" + i);
                thread.start();
                threads.add(thread);
            }
            for (Thread thread : threads) {
                thread.join();
            }
            synchronized (lock) {
                if (doneAt == 0) {
                    doneAt = System.nanoTime();
                }
            }
            stopProducing = true;
            producing.join(TimeUnit.SECONDS.toMillis(WAIT_SECONDS));
            if (sendsFailed.get() > 0) {
                System.err.println("sends failed: " + sendsFailed.get());
            }
            for (Consumer<byte[]> consumer : consumers) {
                closeQuietly("consumer", consumer.closeAsync());
            }
            closeQuietly("producer", producer.closeAsync());
        }

        /** True once the producer is done and every payload it sent is committed (noting when). */
        boolean done() {
            if (!producerDone) {
                return false;
            }
            synchronized (lock) {
                if (drained) {
                    return true;
                }
                if (firstCommit.size() < produced.size() || !firstCommit.keySet().containsAll(produced)) {
                    return false;
                }
                drained = true;
                doneAt = System.nanoTime();
                return true;
            }
        }

        long millisSinceStart(long nanos) {
            return TimeUnit.NANOSECONDS.toMillis(nanos - start);
        }

        /** Records a committed transaction's payloads (with when each ack was answered) of consumer `index`. */
        void committed(int index, List<String> payloads, List<Long> ackedAt) {
            synchronized (lock) {
                for (int i = 0; i < payloads.size(); i++) {
                    String payload = payloads.get(i);
                    long ms = millisSinceStart(ackedAt.get(i));
                    long[] first = firstCommit.get(payload);
                    if (first == null) {
                        firstCommit.put(payload, new long[] {index, ms});
                    } else {
                        doubles.add(new Object[] {payload, first[0], first[1], (long) index, ms});
                    }
                }
            }
        }

        void print() {
            int txnsCommitted = 0;
            int txnsAborted = 0;
            int acksRefused = 0;
            int ackConflicts = 0;
            int commitsRefused = 0;
            StringBuilder committedBy = new StringBuilder();
            for (Loop loop : loops) {
                txnsCommitted += loop.txnsCommitted;
                txnsAborted += loop.txnsAborted;
                acksRefused += loop.acksRefused;
                ackConflicts += loop.ackConflicts;
                commitsRefused += loop.commitsRefused;
                committedBy.append(committedBy.length() == 0 ? "" : ",").append(loop.committed);
            }
            synchronized (lock) {
                Set<Object> again = new java.util.HashSet<>();
                for (Object[] d : doubles) {
                    again.add(d[0]);
                    System.out.println("double_commit payload=" + d[0] + " first=" + d[1] + " first_ms=" + d[2]
                            + " second=" + d[3] + " second_ms=" + d[4]);
                }
                System.out.println("result produced=" + produced.size() + " committed=" + firstCommit.size()
                        + " duplicates=" + doubles.size() + " committed_again=" + again.size() + " txns_committed="
                        + txnsCommitted + " txns_aborted=" + txnsAborted + " acks_refused=" + acksRefused
                        + " ack_conflicts=" + ackConflicts + " commits_refused=" + commitsRefused + " drain_ms="
                        + millisSinceStart(doneAt) + " drained=" + drained + " committed_by=" + committedBy);
            }
            System.out.flush();
        }

        /**
         * Sends "p<i>": one batch of BATCH every BATCH/RATE seconds, paced against the start, as many batches as
         * make at least SECONDS * RATE messages, then waits for every send.
         */
        private void produce(Producer<byte[]> producer) {
            List<CompletableFuture<MessageId>> sends = new ArrayList<>();
            try {
                long ticks = ((long) seconds * rate + batch - 1) / batch;
                long next = 0;
                for (long tick = 0; tick < ticks && !stopProducing; tick++) {
                    long due = start + tick * batch * 1_000_000_000L / rate;
                    long wait = due - System.nanoTime();
                    if (wait > 0) {
                        TimeUnit.NANOSECONDS.sleep(wait);
                    }
                    for (int i = 0; i < batch; i++) {
                        String payload = "p" + next++;
                        sends.add(producer.sendAsync(payload.getBytes(StandardCharsets.UTF_8))
                                .whenComplete((id, e) -> {
                                    if (e == null) {
                                        produced.add(payload);
                                    } else if (sendsFailed.incrementAndGet() <= 3) {
                                        System.err.println("send failed " + payload + ": " + e);
                                    }
                                }));
                    }
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
    }

    /** One consumer's receive, acknowledge and end loop. */
    private static final class Loop implements Runnable {
        private final Run run;
        private final int index;
        private final Consumer<byte[]> consumer;
        private int txnsCommitted;
        private int txnsAborted;
        private int acksRefused;
        private int ackConflicts;
        private int commitsRefused;
        private int txnsEnded;
        private long committed;

        Loop(Run run, int index, Consumer<byte[]> consumer) {
            this.run = run;
            this.index = index;
            this.consumer = consumer;
        }

        @Override
        public void run() {
            try {
                loop();
            } catch (Exception e) {
                System.err.println("consumer c" + index + " failed: " + e);
            }
        }

        private void loop() throws Exception {
            List<Message<byte[]>> received = new ArrayList<>();
            CompletableFuture<Transaction> next = null;
            ArrayDeque<Ending> ending = new ArrayDeque<>();
            while (true) {
                while (!ending.isEmpty() && ending.peekFirst().end.isDone()) {
                    settle(ending.pollFirst());
                }
                if (run.done() || System.nanoTime() - run.deadline >= 0) {
                    break;
                }
                Message<byte[]> message = consumer.receive(200, TimeUnit.MILLISECONDS);
                if (message != null) {
                    received.add(message);
                    if (received.size() < run.txnEvery) {
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
                        next = openTransaction(run.client);
                    }
                    txn = next.get(WAIT_SECONDS, TimeUnit.SECONDS);
                    next = openTransaction(run.client);
                } catch (Exception e) {
                    next = null;
                    System.err.println("newTransaction failed: " + e);
                    received.forEach(consumer::negativeAcknowledge);
                    received.clear();
                    continue;
                }
                List<CompletableFuture<Long>> acks = new ArrayList<>();
                for (Message<byte[]> each : received) {
                    acks.add(consumer.acknowledgeAsync(each.getMessageId(), txn).thenApply(v -> System.nanoTime()));
                }
                List<String> txnPayloads = new ArrayList<>();
                List<Long> ackedAt = new ArrayList<>();
                for (int i = 0; i < received.size(); i++) {
                    Message<byte[]> each = received.get(i);
                    String payload = new String(each.getData(), StandardCharsets.UTF_8);
                    try {
                        ackedAt.add(acks.get(i).get(WAIT_SECONDS, TimeUnit.SECONDS));
                        txnPayloads.add(payload);
                    } catch (ExecutionException e) {
                        acksRefused++;
                        if (isConflict(e)) {
                            ackConflicts++;
                        }
                        if (acksRefused <= 3) {
                            System.err.println("c" + index + " ack refused " + payload + " " + each.getMessageId()
                                    + ": " + e.getCause());
                        }
                    } catch (Exception e) {
                        acksRefused++;
                        if (acksRefused <= 3) {
                            System.err.println("c" + index + " ack failed " + payload + " " + each.getMessageId()
                                    + ": " + e);
                        }
                    }
                }
                received.clear();
                while (ending.size() >= 2) {
                    settle(ending.pollFirst());
                }
                ending.addLast(endTransaction(txn, txnPayloads, ackedAt));
            }
            while (!ending.isEmpty()) {
                settle(ending.pollFirst());
            }
            if (next != null) {
                try {
                    abortQuietly(next.get(WAIT_SECONDS, TimeUnit.SECONDS));
                } catch (Exception e) {
                    System.err.println("the unused transaction: " + e);
                }
            }
        }

        /** Starts ending the transaction: the ABORT_EVERY-th ended ones are aborted, the others committed. */
        private Ending endTransaction(Transaction txn, List<String> payloads, List<Long> ackedAt) {
            txnsEnded++;
            boolean abort = run.abortEvery > 0 && txnsEnded % run.abortEvery == 0;
            return new Ending(txn, abort, payloads, ackedAt, abort ? txn.abort() : txn.commit());
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
                    System.err.println("c" + index + " commit refused " + txn.getTxnID() + ": " + e);
                }
                if (txn.getState() != Transaction.State.ABORTED) {
                    abortQuietly(txn);
                }
                return;
            }
            txnsCommitted++;
            committed += ending.payloads().size();
            run.committed(index, ending.payloads(), ending.ackedAt());
        }
    }

    /** Whether a failed ack's cause, at any depth, is the broker's TransactionConflict. */
    private static boolean isConflict(Throwable e) {
        for (Throwable cause = e; cause != null; cause = cause.getCause()) {
            if (cause instanceof PulsarClientException.TransactionConflictException) {
                return true;
            }
        }
        return false;
    }

    /** Opens a transaction with a 60 s timeout (a failed future when the client refuses). */
    private static CompletableFuture<Transaction> openTransaction(PulsarClient client) {
        try {
            return client.newTransaction().withTransactionTimeout(60, TimeUnit.SECONDS).build();
        } catch (Exception e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /** A transaction ending in the background, with its payloads and when each one's ack was answered. */
    private record Ending(Transaction txn, boolean abort, List<String> payloads, List<Long> ackedAt,
            CompletableFuture<Void> end) {
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
