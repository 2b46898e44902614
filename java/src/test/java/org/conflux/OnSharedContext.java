package org.conflux;

import org.junit.jupiter.api.BeforeAll;

/**
 * Base of the test classes that run on the shared context (TestContext, one per rank): the
 * context, this rank and the job size, set before the class's first test, and the expected sums.
 */
abstract class OnSharedContext {
    static Conflux cfx;
    static int rank;
    static int size;

    @BeforeAll
    static void openSharedContext() {
        cfx = TestContext.get();
        rank = cfx.rank();
        size = cfx.size();
    }

    /** Sum over every rank of its known contribution to element i (TestContext.value). */
    static double sumOver(int i) {
        double s = 0;
        for (int r = 0; r < size; r++) {
            s += TestContext.value(r, i);
        }
        return s;
    }
}
