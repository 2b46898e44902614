package org.conflux;

import org.junit.jupiter.api.BeforeAll;

/**
 * Base of the test classes that run on the shared context (TestContext, one per rank): the
 * context, this rank and the job size, set before the class's first test.
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
}
