package org.conflux;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/** Failures: across ranks (mismatch, duplicates) and local bad arguments; stalls: LifecycleTest. */
@TestMethodOrder(MethodOrderer.MethodName.class)
class ErrorsTest extends OnSharedContext {

    static void assertWorks(String name) {
        float[] x = {rank + 1f, 2f};
        cfx.allreduce(name, x, ReduceOp.SUM);
        assertEquals(size * (size + 1) / 2f, x[0]);
        assertEquals(2f * size, x[1]);
    }

    @Test
    void a00_statusesAreTheCLibrarysList() {
        int count = 0;
        while (ConfluxNative.cfx_status_name(count) != null) {
            String name = ConfluxNative.cfx_status_name(count);
            Status s = Status.of(count);
            assertEquals(name, s.name(), "status " + count);
            assertEquals(count, s.code);
            assertEquals(ConfluxNative.cfx_status_string(count), s.description());
            count++;
        }
        assertEquals(ConfluxNativeConstants.CFX_STATUS_COUNT, count);
        assertEquals(count + 1, Status.values().length, "every C status and UNKNOWN");
        assertEquals(5, Status.MISMATCH.code);  // CFX_ERR_MISMATCH in the header
        assertEquals(Status.UNKNOWN, Status.of(count));
        assertEquals(-1, Status.UNKNOWN.code);
        ConfluxException e = (ConfluxException) ConfluxException.of(Status.PEER_LOST.code, "gone");
        assertEquals("PEER_LOST", e.statusName());
    }

    @Test
    void a01_shapeMismatchFailsOnEveryRankAndNamesTheTensor() {
        float[] x = new float[rank == 0 ? 4 : 5];
        MismatchException e = assertThrows(MismatchException.class,
                () -> cfx.allreduce("bad.shape", x, ReduceOp.SUM));
        assertEquals(Status.MISMATCH, e.status());
        assertTrue(e.getMessage().contains("bad.shape"), e.getMessage());
        assertWorks("after.shape.mismatch");
    }

    @Test
    void a02_dtypeMismatch() {
        Handle<?> h = rank == 0 ? cfx.allreduceAsync("bad.dtype", new float[3], ReduceOp.SUM)
                : cfx.allreduceAsync("bad.dtype", new double[3], ReduceOp.SUM);
        ConfluxException e = assertThrows(MismatchException.class, h::await);
        assertTrue(e.getMessage().contains("bad.dtype"), e.getMessage());
        assertTrue(h.isDone());
        assertThrows(MismatchException.class, h::result);  // the outcome stays with the handle
        assertWorks("after.dtype.mismatch");
    }

    @Test
    void a03_opMismatch() {
        ReduceOp op = rank == 0 ? ReduceOp.SUM : ReduceOp.MAX;
        MismatchException e = assertThrows(MismatchException.class,
                () -> cfx.allreduce("bad.op", new int[2], op));
        assertTrue(e.getMessage().contains("bad.op"), e.getMessage());
        assertWorks("after.op.mismatch");
    }

    @Test
    void b01_duplicateInFlightName() {
        Handle<float[]> first = null;
        float[] x = {rank};
        if (rank == 0) {
            // only rank 0 submits at first: "dup" cannot complete until the others submit it
            first = cfx.allreduceAsync("dup", x, ReduceOp.SUM);
            DuplicateNameException e = assertThrows(DuplicateNameException.class,
                    () -> cfx.allreduceAsync("dup", new float[1], ReduceOp.SUM));
            assertEquals(Status.DUPLICATE_NAME, e.status());
            assertTrue(e.getMessage().contains("dup"), e.getMessage());
            assertFalse(first.await(0, TimeUnit.SECONDS));
        }
        cfx.barrier();
        if (rank != 0) {
            first = cfx.allreduceAsync("dup", x, ReduceOp.SUM);
        }
        assertEquals(size * (size - 1) / 2f, first.await()[0]);
        // the name is free again once complete
        assertWorks("dup");
    }

    @Test
    void c01_badLocalArguments() {
        assertThrows(IllegalArgumentException.class,
                () -> cfx.allreduce("x", ByteBuffer.allocate(16), ReduceOp.SUM));                 // heap buffer
        assertThrows(IllegalArgumentException.class,
                () -> cfx.allreduce("x", ByteBuffer.allocate(16).asFloatBuffer(), ReduceOp.SUM)); // heap view
        FloatBuffer bigEndian = ByteBuffer.allocateDirect(16).order(ByteOrder.BIG_ENDIAN).asFloatBuffer();
        if (ByteOrder.nativeOrder() != ByteOrder.BIG_ENDIAN) {
            assertThrows(IllegalArgumentException.class, () -> cfx.allreduce("x", bigEndian, ReduceOp.SUM));
        }
        ByteBuffer ro = ByteBuffer.allocateDirect(16).order(ByteOrder.nativeOrder()).asReadOnlyBuffer();
        assertThrows(IllegalArgumentException.class, () -> cfx.allreduce("x", ro, DType.FLOAT32, ReduceOp.SUM));
        ByteBuffer seven = ByteBuffer.allocateDirect(7);
        assertThrows(IllegalArgumentException.class, () -> cfx.allreduce("x", seven, DType.FLOAT32, ReduceOp.SUM));
        assertThrows(IllegalArgumentException.class, () -> cfx.allreduce("x", (float[]) null, ReduceOp.SUM));
        assertThrows(IllegalArgumentException.class, () -> cfx.allreduce("x", new float[2], (ReduceOp) null));
        assertThrows(IllegalArgumentException.class, () -> cfx.allreduce("x", "not data", ReduceOp.SUM, 1, 1));
        assertThrows(IllegalArgumentException.class, () -> cfx.broadcast("x", new float[2], -1));
        assertThrows(IllegalArgumentException.class, () -> cfx.broadcast("x", new float[2], size));
        assertThrows(IllegalArgumentException.class,
                () -> cfx.alltoall("x", new float[4], new long[] {1, 2, 3, 4, 5, 6}));            // wrong count
        assertThrows(IllegalArgumentException.class, () -> Conflux.init(new Conflux.Options().fusionThresholdBytes(-1)));
        Handle<float[]> h = cfx.allreduceAsync("bad.args.ok", new float[] {1f}, ReduceOp.SUM);
        assertThrows(IllegalArgumentException.class, () -> h.await(-1, TimeUnit.SECONDS));
        assertEquals(size, h.await()[0]);
        // nothing above reached the other ranks: a collective still lines up
        assertWorks("after.bad.args");
    }
}
