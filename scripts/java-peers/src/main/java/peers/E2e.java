package peers;

import java.util.Arrays;

/** The line protocol of the end-to-end benchmark (bench-tools/src/bin/e2e_load): "ready" when a
 * latency consumer is subscribed (the driver then publishes), "start" when
 * the measured window opens, "result messages=N seconds=S [p50_ms=X p99_ms=Y]" when it closes,
 * then wait for standard input to close. */
final class E2e {
    private E2e() {}

    static void start() {
        System.out.println("start");
        System.out.flush();
    }

    /** Nearest-rank percentile of sorted latencies in nanoseconds, in milliseconds. */
    static double percentileMs(long[] sortedNanos, double q) {
        if (sortedNanos.length == 0) {
            return Double.NaN;
        }
        int rank = (int) Math.ceil(q * sortedNanos.length);
        rank = Math.max(1, Math.min(sortedNanos.length, rank));
        return sortedNanos[rank - 1] / 1e6;
    }

    /** Prints the result line (with p50/p99 when latencies are given) and waits for stdin. */
    static void result(long messages, long startNanos, long[] latencyNanos) throws java.io.IOException {
        result(messages, (System.nanoTime() - startNanos) / 1e9, latencyNanos);
    }

    /** As {@link #result(long, long, long[])}, with the window's length measured already. */
    static void result(long messages, double seconds, long[] latencyNanos) throws java.io.IOException {
        String line = String.format(java.util.Locale.ROOT, "result messages=%d seconds=%.6f", messages, seconds);
        if (latencyNanos != null) {
            Arrays.sort(latencyNanos);
            line += String.format(java.util.Locale.ROOT, " p50_ms=%.3f p99_ms=%.3f",
                    percentileMs(latencyNanos, 0.50), percentileMs(latencyNanos, 0.99));
        }
        System.out.println(line);
        System.out.flush();
        Cpu.awaitStdinClosed();
    }
}
