package org.conflux;

/**
 * The context the test classes share (one per JVM, i.e. per rank). Test classes run in class-name
 * order and methods in method-name order on every rank, so synchronous collectives line up;
 * LifecycleTest, last, closes it.
 */
final class TestContext {
    private static Conflux cfx;

    private TestContext() {
    }

    static synchronized Conflux get() {
        if (cfx == null) {
            // generous deadlines: on a loaded machine ranks may drift apart by seconds between tests
            // (LifecycleTest checks a short stall deadline on a context of its own)
            cfx = Conflux.init(new Conflux.Options().stallWarningSeconds(20).stallTimeoutSeconds(90));
        }
        return cfx;
    }

    static synchronized void closeShared() {
        if (cfx != null) {
            cfx.close();
            cfx = null;
        }
    }

    /** Rank r's known contribution to element i: small integers, so float sums are exact. */
    static double value(int rank, int i) {
        return (rank + 1) * ((i % 13) + 1);
    }
}
