package peers;

import java.lang.management.ManagementFactory;

/** This process's CPU time, for the comparison in BENCHMARKS-archive.md. */
final class Cpu {
    private Cpu() {}

    /** User plus system CPU time of the whole JVM so far, in milliseconds. */
    static long millis() {
        var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
        return os.getProcessCpuTime() / 1_000_000;
    }

    /** Blocks until standard input is closed: the driver's signal to shut down. */
    static void awaitStdinClosed() throws java.io.IOException {
        while (System.in.read() >= 0) {
            // ignore
        }
    }
}
