package org.conflux;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * Shared tensor memory (Conflux.allocateShared / freeShared): allreduces on it, checked against
 * sums computed here, and the misuse freeShared must refuse. Only the a* methods are collective.
 */
@TestMethodOrder(MethodOrderer.MethodName.class)
class AllocateSharedTest extends OnSharedContext {

    static long address(ByteBuffer b) {
        return ConfluxNative.cfxj_buffer_address(b);
    }

    @Test
    void a01_allreduceLargeSharedBufferInPlace() {
        int n = 300_000;  // 1.2 MB: more than 1 MiB, so over several pipeline chunks
        ByteBuffer b = Conflux.allocateShared(4L * n);
        try {
            FloatBuffer f = b.asFloatBuffer();
            for (int i = 0; i < n; i++) {
                f.put(i, (float) TestContext.value(rank, i));
            }
            assertSame(f, cfx.allreduce("shared.f32.large", f, ReduceOp.SUM));
            for (int i = 0; i < n; i++) {
                if (f.get(i) != (float) sumOver(i)) {
                    fail("element " + i + ": " + f.get(i) + " != " + sumOver(i));
                }
            }
            assertEquals((float) sumOver(n - 1), b.getFloat(4 * (n - 1)));  // written into the shared block
        } finally {
            Conflux.freeShared(b);
        }
    }

    @Test
    void a02_allreduceSmallSharedBuffersSyncAndAsync() {
        ByteBuffer d = Conflux.allocateShared(7 * 8);
        ByteBuffer l = Conflux.allocateShared(3 * 8);
        try {
            for (int i = 0; i < 7; i++) {
                d.putDouble(8 * i, TestContext.value(rank, i));
            }
            for (int i = 0; i < 3; i++) {
                l.putLong(8 * i, (long) TestContext.value(rank, i) << 33);  // beyond 32 bits
            }
            Handle<ByteBuffer> h = cfx.allreduceAsync("shared.i64.small", l, DType.INT64, ReduceOp.SUM);
            assertSame(d, cfx.allreduce("shared.f64.small", d, DType.FLOAT64, ReduceOp.SUM));
            assertSame(l, h.await());
            for (int i = 0; i < 7; i++) {
                assertEquals(sumOver(i), d.getDouble(8 * i), "f64 element " + i);
            }
            for (int i = 0; i < 3; i++) {
                assertEquals((long) sumOver(i) << 33, l.getLong(8 * i), "i64 element " + i);
            }
        } finally {
            Conflux.freeShared(d);
            Conflux.freeShared(l);
        }
    }

    @Test
    void a03_ranksMayMixSharedAndPrivateBuffers() {
        int n = 1000;
        ByteBuffer b = rank % 2 == 0 ? Conflux.allocateShared(4L * n)
                : ByteBuffer.allocateDirect(4 * n).order(ByteOrder.nativeOrder());
        FloatBuffer f = b.asFloatBuffer();
        for (int i = 0; i < n; i++) {
            f.put(i, (float) TestContext.value(rank, i));
        }
        cfx.allreduce("shared.mixed", f, ReduceOp.SUM);
        for (int i = 0; i < n; i++) {
            assertEquals((float) sumOver(i), f.get(i), "element " + i);
        }
        if (rank % 2 == 0) {
            Conflux.freeShared(b);
        }
    }

    @Test
    void b01_allocationIsADirectNativeOrderBuffer() {
        ByteBuffer b = Conflux.allocateShared(100);
        ByteBuffer empty = Conflux.allocateShared(0);
        try {
            assertTrue(b.isDirect());
            assertEquals(100, b.capacity());
            assertEquals(0, b.position());
            assertEquals(ByteOrder.nativeOrder(), b.order());
            assertEquals(0, address(b) % 64, "64-byte aligned");
            assertEquals(0, empty.capacity());
            assertTrue(address(empty) != 0 && address(empty) != address(b));
        } finally {
            Conflux.freeShared(b);
            Conflux.freeShared(empty);
        }
        Conflux.freeShared(null);  // like cfx_free(NULL)
    }

    @Test
    void b02_freeTwiceFailsWithTheLibrarysMessage() {
        ByteBuffer b = Conflux.allocateShared(256);
        Conflux.freeShared(b);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Conflux.freeShared(b));
        assertTrue(e.getMessage().contains("not a block from cfx_alloc"), e.getMessage());
    }

    @Test
    void b03_staleBufferNeverFreesTheBlockNowAtItsAddress() {
        ByteBuffer old = Conflux.allocateShared(256);
        long at = address(old);
        Conflux.freeShared(old);
        ByteBuffer now = Conflux.allocateShared(256);  // first fit: usually the same address
        try {
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Conflux.freeShared(old));
            if (address(now) == at) {
                assertTrue(e.getMessage().contains("not the one allocateShared returned"), e.getMessage());
            }
        } finally {
            Conflux.freeShared(now);  // still allocated: this succeeds once
        }
        assertThrows(IllegalArgumentException.class, () -> Conflux.freeShared(now));
    }

    @Test
    void b04_buffersNotFromAllocateSharedAreRefused() {
        ByteBuffer shared = Conflux.allocateShared(256);
        try {
            IllegalArgumentException heap = assertThrows(IllegalArgumentException.class,
                    () -> Conflux.freeShared(ByteBuffer.allocate(16)));
            assertTrue(heap.getMessage().contains("heap buffer"), heap.getMessage());
            IllegalArgumentException direct = assertThrows(IllegalArgumentException.class,
                    () -> Conflux.freeShared(ByteBuffer.allocateDirect(16)));
            assertTrue(direct.getMessage().contains("not a block from cfx_alloc"), direct.getMessage());
            // inside the block: the library refuses the pointer
            IllegalArgumentException slice = assertThrows(IllegalArgumentException.class,
                    () -> Conflux.freeShared(shared.slice(64, 64)));
            assertTrue(slice.getMessage().contains("not a block from cfx_alloc"), slice.getMessage());
            // at its start but another object: only the buffer allocateShared returned frees it
            IllegalArgumentException dup = assertThrows(IllegalArgumentException.class,
                    () -> Conflux.freeShared(shared.duplicate()));
            assertTrue(dup.getMessage().contains("not the one allocateShared returned"), dup.getMessage());
            shared.putInt(0, 42);  // still allocated
        } finally {
            Conflux.freeShared(shared);
        }
    }

    @Test
    void b05_badSizes() {
        assertThrows(IllegalArgumentException.class, () -> Conflux.allocateShared(-1));
        assertThrows(IllegalArgumentException.class, () -> Conflux.allocateShared(1L << 31));
    }

    @Test
    void b06_aFullPoolIsOutOfMemoryWithTheLibrarysMessage() {
        // blocks are address space only until touched: filling the pool (the machine's RAM by
        // default) with 2 GiB blocks costs no memory
        List<ByteBuffer> blocks = new ArrayList<>();
        try {
            ConfluxException e = null;
            while (e == null) {
                assertTrue(blocks.size() < 4096, "the pool is not full after 8 TiB");
                try {
                    blocks.add(Conflux.allocateShared(Integer.MAX_VALUE));
                } catch (ConfluxException x) {
                    e = x;
                }
            }
            assertEquals(Status.OUT_OF_MEMORY, e.status());
            assertTrue(e.getMessage().contains("shared pool"), e.getMessage());
        } finally {
            blocks.forEach(Conflux::freeShared);
        }
        Conflux.freeShared(Conflux.allocateShared(Integer.MAX_VALUE));  // room again
    }

    @Test
    void b07_cleanerFreesABufferOnceNoViewReachesIt() throws InterruptedException {
        int before = SharedMemory.liveBlocks();
        FloatBuffer view = Conflux.allocateShared(4096).asFloatBuffer();
        collect();
        // the view keeps the buffer it came from reachable (so does a handle's operand)
        assertEquals(before + 1, SharedMemory.liveBlocks());
        view.put(0, 1f);
        assertNotNull(view);
        view = null;
        for (int i = 0; i < 500 && SharedMemory.liveBlocks() > before; i++) {
            collect();
        }
        assertEquals(before, SharedMemory.liveBlocks());
    }

    private static void collect() throws InterruptedException {
        System.gc();
        Thread.sleep(10);
    }
}
