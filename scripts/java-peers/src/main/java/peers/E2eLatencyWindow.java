package peers;

import java.time.Instant;
import java.util.Arrays;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * The end-to-end benchmark's latency window (bench-tools/src/bin/e2e_load/latency.rs): every
 * payload's first 8 bytes are its send time in microseconds since the UNIX epoch, big-endian;
 * the warm-up starts at the first message, the window opens WARMUP seconds after it (printing
 * "start") and closes WINDOW seconds after that. The message that opens the window and the one
 * that closes it are not counted; every other message in it counts with its latency (its
 * receipt time less its stamp). Thread-safe: a push consumer's listener threads share one.
 */
final class E2eLatencyWindow {
    private final long warmupNanos;
    private final long windowNanos;
    private final CountDownLatch closed = new CountDownLatch(1);
    private long firstNanos = -1;
    private long openNanos = -1;
    private double seconds = Double.NaN;
    private boolean done;
    private long[] latencyNanos = new long[1 << 16];
    private int count;

    E2eLatencyWindow(long warmupSeconds, long windowSeconds) {
        this.warmupNanos = TimeUnit.SECONDS.toNanos(warmupSeconds);
        this.windowNanos = TimeUnit.SECONDS.toNanos(windowSeconds);
    }

    /** The wall-clock time in microseconds since the UNIX epoch. */
    static long nowMicros() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000L + now.getNano() / 1_000;
    }

    /** Takes one message whose payload was stamped at {@code sentMicros}, received now. */
    synchronized void message(long sentMicros) {
        long latency = Math.max(0, nowMicros() - sentMicros) * 1_000;
        long now = System.nanoTime();
        if (done) {
            return;
        }
        if (firstNanos < 0) {
            firstNanos = now;
        }
        if (openNanos < 0) {
            if (now - firstNanos >= warmupNanos) {
                openNanos = now;
                E2e.start();
            }
            return;
        }
        if (now - openNanos >= windowNanos) {
            seconds = (now - openNanos) / 1e9;
            done = true;
            closed.countDown();
            return;
        }
        if (count == latencyNanos.length) {
            latencyNanos = Arrays.copyOf(latencyNanos, count * 2);
        }
        latencyNanos[count++] = latency;
    }

    /** Whether the window has closed. */
    synchronized boolean isClosed() {
        return done;
    }

    /** Waits up to {@code seconds} for the window to close; false if it did not. */
    boolean await(long seconds) throws InterruptedException {
        return closed.await(seconds, TimeUnit.SECONDS);
    }

    /** Prints the result line of a closed window and waits for standard input to close. */
    void result() throws java.io.IOException {
        long[] latencies;
        double measured;
        synchronized (this) {
            latencies = Arrays.copyOf(latencyNanos, count);
            measured = seconds;
        }
        E2e.result(latencies.length, measured, latencies);
    }
}
