package org.conflux;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/** Shutdown, close, pending handles at close, re-init, stall deadline. Runs last (class-name order). */
@TestMethodOrder(MethodOrderer.MethodName.class)
class LifecycleTest {
    @Test
    void a01_shutdownThenCloseThenReinit() {
        Conflux cfx = TestContext.get();
        int size = cfx.size();
        int rank = cfx.rank();
        // a handle only rank 0 submits: shutdown completes it with SHUT_DOWN. The barrier keeps the
        // other ranks from shutting down (which stops rank 0's context too) before rank 0 submitted
        // it: without it a fast rank 1 made rank 0's submission fail, rank 0 left the test early, and
        // its next context paired up with rank 1's re-init below, so both waited on different tensors.
        Handle<float[]> orphan = rank == 0 ? cfx.allreduceAsync("orphan", new float[1], ReduceOp.SUM) : null;
        cfx.barrier();
        cfx.shutdown();
        assertFalse(cfx.isRunning());
        assertEquals(rank, cfx.rank());  // queries still work
        assertThrows(ShutDownException.class, () -> cfx.allreduce("late", new float[1], ReduceOp.SUM));
        if (orphan != null) {
            ShutDownException e = assertThrows(ShutDownException.class, orphan::await);
            assertEquals(Status.SHUT_DOWN, e.status());
        }
        TestContext.closeShared();
        assertFalse(cfx.isRunning());
        assertThrows(IllegalStateException.class, cfx::rank);
        assertThrows(IllegalStateException.class, () -> cfx.allreduce("closed", new float[1], ReduceOp.SUM));
        cfx.close();  // idempotent

        try (Conflux again = Conflux.init()) {
            assertEquals(size, again.size());
            float[] x = {1f};
            again.allreduce("after.reinit", x, ReduceOp.SUM);
            assertEquals(size, x[0]);
        }
    }

    @Test
    void a02_closeCompletesDetachedAndPendingHandles() {
        try (Conflux cfx = Conflux.init()) {
            int rank = cfx.rank();
            Handle<float[]> kept = rank == 0 ? cfx.allreduceAsync("pending.at.close", new float[4], ReduceOp.SUM)
                    : null;
            // a detached handle whose collective does complete
            Handle<float[]> h = cfx.allreduceAsync("detached", new float[] {1f}, ReduceOp.SUM);
            h.close();
            cfx.barrier();
            cfx.close();
            if (kept != null) {
                assertTrue(kept.isDone());
                assertThrows(ShutDownException.class, kept::await);
            }
        }
    }

    @Test
    void a03_stallBecomesAnErrorOnTheRanksThatSubmitted() {
        // a context of its own with a 4 s stall deadline. Rank 0 submits a tensor nobody else does;
        // the others enter the barrier after that deadline: rank 0 is there by then (or soon after),
        // so the barrier cannot stall, however loaded the machine.
        try (Conflux cfx = Conflux.init(new Conflux.Options().stallWarningSeconds(2).stallTimeoutSeconds(4))) {
            int rank = cfx.rank();
            int size = cfx.size();
            if (rank == 0) {
                StallException e = assertThrows(StallException.class,
                        () -> cfx.allreduce("stalled", new float[1], ReduceOp.SUM));
                assertTrue(e.getMessage().contains("stalled"), e.getMessage());
                assertEquals(Status.STALL, e.status());
            } else {
                sleep(5000);
            }
            cfx.barrier();
            float[] x = {1f};
            cfx.allreduce("after.stall", x, ReduceOp.SUM);
            assertEquals(size, x[0]);
        }
    }

    @Test
    void a04_closeWhileAnotherThreadBlocksInAllreduce() throws InterruptedException {
        Conflux cfx = Conflux.init();
        int rank = cfx.rank();
        float[] x = {rank + 1f, 7f};
        RuntimeException[] failure = new RuntimeException[1];
        // rank 0's thread blocks in a collective nobody else submits; close must end it, then free
        Thread blocked = new Thread(() -> {
            try {
                cfx.allreduce("blocked.at.close", x, ReduceOp.SUM);
            } catch (RuntimeException e) {
                failure[0] = e;
            }
        });
        if (rank == 0) {
            blocked.start();
            long deadline = System.nanoTime() + 30_000_000_000L;
            while (cfx.blockingCalls() == 0 && System.nanoTime() < deadline) {
                sleep(1);
            }
            assertEquals(1, cfx.blockingCalls(), "the thread never entered the engine");
        }
        cfx.barrier();
        cfx.close();
        if (rank == 0) {
            blocked.join(30_000);
            assertFalse(blocked.isAlive());
            assertTrue(failure[0] instanceof ShutDownException, String.valueOf(failure[0]));
            assertEquals(1f, x[0]);  // a failed collective leaves the array as it was
            assertEquals(7f, x[1]);
        }
        assertEquals(0, cfx.blockingCalls());
        assertThrows(IllegalStateException.class, () -> cfx.allreduce("closed", new float[1], ReduceOp.SUM));
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
