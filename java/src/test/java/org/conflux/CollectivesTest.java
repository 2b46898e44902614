package org.conflux;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.nio.FloatBuffer;
import java.nio.IntBuffer;
import java.nio.LongBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/** Every collective on every data kind, checked against values computed here. */
@TestMethodOrder(MethodOrderer.MethodName.class)
class CollectivesTest extends OnSharedContext {

    static ByteBuffer direct(int bytes) {
        return ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
    }

    @Test
    void a01_topology() {
        String env = System.getenv("OMPI_COMM_WORLD_SIZE");
        if (env != null) {
            assertEquals(Integer.parseInt(env), size);
            assertEquals(Integer.parseInt(System.getenv("OMPI_COMM_WORLD_RANK")), rank);
        }
        assertTrue(rank >= 0 && rank < size);
        assertTrue(cfx.localRank() >= 0 && cfx.localRank() < cfx.localSize());
        assertTrue(cfx.crossRank() >= 0 && cfx.crossRank() < cfx.crossSize());
        assertEquals(size, cfx.localSize() * cfx.crossSize());
        assertTrue(cfx.isRunning());
    }

    @Test
    void a02_version() {
        assertEquals(10400, Conflux.versionNumber());
        assertEquals("1.4.0", Conflux.version());
        assertTrue(Conflux.features().contains(Feature.MPI));
        assertTrue(Conflux.features().contains(Feature.LOCAL));
        assertEquals("mismatch across ranks".isEmpty(), Status.MISMATCH.description().isEmpty());
    }

    @Test
    void b01_allreduceFloatSum() {
        float[] x = new float[1000];
        for (int i = 0; i < x.length; i++) {
            x[i] = (float) TestContext.value(rank, i);
        }
        float[] r = cfx.allreduce("t.f32.sum", x, ReduceOp.SUM);
        assertSame(x, r);
        for (int i = 0; i < x.length; i++) {
            assertEquals((float) sumOver(i), x[i], "element " + i);
        }
    }

    @Test
    void b01a_blockingFormsStageArraysOnEitherSideOfTheStackLimit() {
        // the blocking forms stage up to 512 bytes on the C stack and more in malloc'd memory
        for (int n : new int[] {1, 128, 129}) {
            float[] x = new float[n];
            for (int i = 0; i < n; i++) {
                x[i] = (float) TestContext.value(rank, i);
            }
            cfx.allreduce("t.f32.stage." + n, x, ReduceOp.SUM);
            for (int i = 0; i < n; i++) {
                assertEquals((float) sumOver(i), x[i], n + " elements, element " + i);
            }
            int[] b = new int[n];
            for (int i = 0; i < n; i++) {
                b[i] = rank * 1000 + i;
            }
            cfx.broadcast("t.i32.stage." + n, b, size - 1);
            for (int i = 0; i < n; i++) {
                assertEquals((size - 1) * 1000 + i, b[i], n + " elements, element " + i);
            }
        }
        assertEquals(0, cfx.blockingCalls());
    }

    @Test
    void b02_allreduceDoubleAverage() {
        double[] x = new double[257];
        for (int i = 0; i < x.length; i++) {
            x[i] = TestContext.value(rank, i) + 0.5;
        }
        cfx.allreduce("t.f64.avg", x, ReduceOp.AVERAGE);
        for (int i = 0; i < x.length; i++) {
            assertEquals(sumOver(i) / size + 0.5, x[i], 1e-12, "element " + i);
        }
    }

    @Test
    void b03_allreduceIntMaxLongMinProduct() {
        int[] a = new int[100];
        long[] b = new long[100];
        long[] c = new long[10];
        for (int i = 0; i < a.length; i++) {
            a[i] = (rank * 31 + i * 7) % 50 - 25;
            b[i] = ((long) rank << 40) - i * (long) (rank + 1);
        }
        for (int i = 0; i < c.length; i++) {
            c[i] = rank + i + 1;
        }
        cfx.allreduce("t.i32.max", a, ReduceOp.MAX);
        cfx.allreduce("t.i64.min", b, ReduceOp.MIN);
        cfx.allreduce("t.i64.prod", c, ReduceOp.PRODUCT);
        for (int i = 0; i < a.length; i++) {
            int mx = Integer.MIN_VALUE;
            long mn = Long.MAX_VALUE;
            for (int r = 0; r < size; r++) {
                mx = Math.max(mx, (r * 31 + i * 7) % 50 - 25);
                mn = Math.min(mn, ((long) r << 40) - i * (long) (r + 1));
            }
            assertEquals(mx, a[i]);
            assertEquals(mn, b[i]);
        }
        for (int i = 0; i < c.length; i++) {
            long p = 1;
            for (int r = 0; r < size; r++) {
                p *= r + i + 1;
            }
            assertEquals(p, c[i]);
        }
    }

    @Test
    void b04_allreduceDirectFloatBufferZeroCopyWindow() {
        FloatBuffer fb = direct(4 * 64).asFloatBuffer();
        for (int i = 0; i < 64; i++) {
            fb.put(i, (float) TestContext.value(rank, i));
        }
        fb.position(8).limit(40);  // only [8, 40) takes part
        FloatBuffer r = cfx.allreduce("t.fb.window", fb, ReduceOp.SUM);
        assertSame(fb, r);
        assertEquals(8, fb.position());
        assertEquals(40, fb.limit());
        fb.clear();
        for (int i = 0; i < 64; i++) {
            float want = (float) (i >= 8 && i < 40 ? sumOver(i) : TestContext.value(rank, i));
            assertEquals(want, fb.get(i), "element " + i);
        }
    }

    @Test
    void b04a_allreduceAdasum() {
        // Orthogonal contributions (rank r: r + 1 at element r) combine to their sum.
        float[] o = new float[8];
        o[rank] = rank + 1;
        cfx.allreduce("t.adasum.orthogonal", o, ReduceOp.ADASUM);
        for (int i = 0; i < o.length; i++) {
            assertEquals(i < size ? (float) (i + 1) : 0f, o[i], "orthogonal, element " + i);
        }
        // Identical contributions combine to themselves.
        double[] same = new double[8];
        for (int i = 0; i < same.length; i++) {
            same[i] = 0.5 * i - 1;
        }
        cfx.allreduce("t.adasum.identical", same, ReduceOp.ADASUM);
        for (int i = 0; i < same.length; i++) {
            assertEquals(0.5 * i - 1, same[i], 1e-12, "identical, element " + i);
        }
    }

    @Test
    void b05_allreduceByteBufferWithDtypeAndScales() {
        ByteBuffer bb = direct(8 * 10);
        for (int i = 0; i < 10; i++) {
            bb.putDouble(i * 8, TestContext.value(rank, i));
        }
        cfx.allreduce("t.bb.f64", bb, DType.FLOAT64, ReduceOp.SUM);
        for (int i = 0; i < 10; i++) {
            assertEquals(sumOver(i), bb.getDouble(i * 8));
        }
        double[] x = new double[10];
        for (int i = 0; i < 10; i++) {
            x[i] = TestContext.value(rank, i);
        }
        cfx.allreduce("t.scaled", x, ReduceOp.SUM, 2.0, 0.25);
        for (int i = 0; i < 10; i++) {
            assertEquals(sumOver(i) * 0.5, x[i], 1e-12);
        }
        IntBuffer ib = direct(4 * 5).asIntBuffer();
        LongBuffer lb = direct(8 * 5).asLongBuffer();
        DoubleBuffer db = direct(8 * 5).asDoubleBuffer();
        for (int i = 0; i < 5; i++) {
            ib.put(i, rank + i);
            lb.put(i, rank * 1000L + i);
            db.put(i, rank * 0.5);
        }
        cfx.allreduce("t.ib", ib, ReduceOp.SUM);
        cfx.allreduce("t.lb", lb, ReduceOp.MAX);
        cfx.allreduce("t.db", db, ReduceOp.MIN);
        for (int i = 0; i < 5; i++) {
            assertEquals(size * (size - 1) / 2 + size * i, ib.get(i));
            assertEquals((size - 1) * 1000L + i, lb.get(i));
            assertEquals(0.0, db.get(i));
        }
    }

    @Test
    void b06_asyncOutOfOrderSubmission() {
        int n = 8;
        List<float[]> data = new ArrayList<>();
        List<Handle<float[]>> hs = new ArrayList<>();
        for (int k = 0; k < n; k++) {
            data.add(new float[16 + k]);
            hs.add(null);
        }
        // odd ranks submit in reverse order: negotiation must still match the names up
        for (int j = 0; j < n; j++) {
            int k = rank % 2 == 1 ? n - 1 - j : j;
            float[] x = data.get(k);
            for (int i = 0; i < x.length; i++) {
                x[i] = (float) TestContext.value(rank, i + k);
            }
            hs.set(k, cfx.allreduceAsync("t.async." + k, x, ReduceOp.SUM));
        }
        for (int k = 0; k < n; k++) {
            Handle<float[]> h = hs.get(k);
            assertEquals("t.async." + k, h.name());
            if (k % 2 == 0) {
                assertTrue(h.await(60, TimeUnit.SECONDS));
            } else {
                while (!h.isDone()) {
                    Thread.onSpinWait();
                }
            }
            float[] r = h.result();
            assertSame(data.get(k), r);
            for (int i = 0; i < r.length; i++) {
                assertEquals((float) sumOver(i + k), r[i]);
            }
            h.close();
            assertTrue(h.isDone());
        }
    }

    @Test
    void c01_allgatherVariableLengths() {
        float[] mine = new float[rank + 1];
        for (int j = 0; j <= rank; j++) {
            mine[j] = rank * 10 + j;
        }
        Handle<float[]> h = cfx.allgatherAsync("t.ag.f32", mine);
        float[] all = h.await();
        float[] want = new float[size * (size + 1) / 2];
        long[] wantSplits = new long[size];
        int k = 0;
        for (int r = 0; r < size; r++) {
            wantSplits[r] = r + 1;
            for (int j = 0; j <= r; j++) {
                want[k++] = r * 10 + j;
            }
        }
        assertArrayEquals(want, all);
        assertArrayEquals(wantSplits, h.splits());
        long[] l = cfx.allgather("t.ag.i64", new long[] {rank, -rank});
        assertEquals(2 * size, l.length);
        for (int r = 0; r < size; r++) {
            assertEquals(r, l[2 * r]);
            assertEquals(-r, l[2 * r + 1]);
        }
    }

    @Test
    void c02_allgatherDirectBuffer() {
        DoubleBuffer db = direct(8 * 3).asDoubleBuffer();
        for (int j = 0; j < 3; j++) {
            db.put(j, rank + j * 0.25);
        }
        DoubleBuffer all = cfx.allgather("t.ag.db", db);
        assertTrue(all.isDirect());
        assertEquals(3 * size, all.remaining());
        for (int r = 0; r < size; r++) {
            for (int j = 0; j < 3; j++) {
                assertEquals(r + j * 0.25, all.get(3 * r + j));
            }
        }
    }

    @Test
    void d01_broadcast() {
        int root = size - 1;
        int[] x = new int[33];
        for (int i = 0; i < x.length; i++) {
            x[i] = rank == root ? i * i : -1;
        }
        cfx.broadcast("t.bc.i32", x, root);
        for (int i = 0; i < x.length; i++) {
            assertEquals(i * i, x[i]);
        }
        FloatBuffer fb = direct(4 * 4).asFloatBuffer();
        for (int i = 0; i < 4; i++) {
            fb.put(i, rank == 0 ? 1.5f * i : 0f);
        }
        cfx.broadcast("t.bc.fb", fb, 0);
        for (int i = 0; i < 4; i++) {
            assertEquals(1.5f * i, fb.get(i));
        }
    }

    @Test
    void e01_alltoallEqualAndSplits() {
        // equal: 2 elements to each rank, value = 100 * sender + 10 * receiver + j
        int[] x = new int[2 * size];
        for (int dst = 0; dst < size; dst++) {
            for (int j = 0; j < 2; j++) {
                x[2 * dst + j] = 100 * rank + 10 * dst + j;
            }
        }
        int[] got = cfx.alltoall("t.a2a.eq", x, null);
        assertEquals(2 * size, got.length);
        for (int src = 0; src < size; src++) {
            for (int j = 0; j < 2; j++) {
                assertEquals(100 * src + 10 * rank + j, got[2 * src + j]);
            }
        }
        // uneven: rank r sends (dst + 1) elements to rank dst
        long[] splits = new long[size];
        int total = 0;
        for (int dst = 0; dst < size; dst++) {
            splits[dst] = dst + 1;
            total += dst + 1;
        }
        double[] y = new double[total];
        int k = 0;
        for (int dst = 0; dst < size; dst++) {
            for (int j = 0; j <= dst; j++) {
                y[k++] = rank * 1000 + dst * 10 + j;
            }
        }
        Handle<double[]> h = cfx.alltoallAsync("t.a2a.splits", y, splits);
        double[] r = h.await();
        assertEquals(size * (rank + 1), r.length);
        long[] recv = h.splits();
        for (int src = 0; src < size; src++) {
            assertEquals(rank + 1, recv[src]);
            for (int j = 0; j <= rank; j++) {
                assertEquals(src * 1000 + rank * 10 + j, r[src * (rank + 1) + j]);
            }
        }
    }

    @Test
    void f01_reducescatter() {
        int n = 2 * size + 1;  // the first n % size ranks get one more element
        float[] x = new float[n];
        for (int i = 0; i < n; i++) {
            x[i] = (float) TestContext.value(rank, i);
        }
        float[] mine = cfx.reducescatter("t.rs.f32", x, ReduceOp.SUM);
        int base = n / size;
        int extra = n % size;
        int len = base + (rank < extra ? 1 : 0);
        int start = rank * base + Math.min(rank, extra);
        assertEquals(len, mine.length);
        for (int i = 0; i < len; i++) {
            assertEquals((float) sumOver(start + i), mine[i]);
        }
        FloatBuffer fb = direct(4 * size).asFloatBuffer();
        for (int i = 0; i < size; i++) {
            fb.put(i, rank + i);
        }
        FloatBuffer got = cfx.reducescatter("t.rs.fb", fb, ReduceOp.MAX);
        assertEquals(1, got.remaining());
        assertEquals(size - 1 + rank, got.get(0));
    }

    @Test
    void f02_timeline() throws java.io.IOException {
        java.nio.file.Path dir = java.nio.file.Files.createTempDirectory("cfx-tl");
        cfx.startTimeline(dir.resolve("tl.json").toString(), true);
        cfx.allreduce("t.timeline", new float[8], ReduceOp.SUM);
        cfx.stopTimeline();
        cfx.stopTimeline();  // a no-op now
        java.nio.file.Path file = dir.resolve("tl.rank" + rank + ".json");
        String text = java.nio.file.Files.readString(file);
        assertTrue(text.contains("t.timeline"), "timeline names the tensor");
        assertTrue(text.trim().endsWith("]"), "timeline file is complete JSON");
        assertThrows(IllegalArgumentException.class, () -> cfx.startTimeline("", false));
    }

    @Test
    void g01_barrierAndJoin() {
        cfx.barrier();
        Handle<Void> b = cfx.barrierAsync();
        b.await();
        assertTrue(b.isDone());
        int last = cfx.join();
        assertTrue(last >= 0 && last < size, "join rank " + last);
        // allreduce still works after everyone joined
        float[] x = {rank};
        cfx.allreduce("t.after.join", x, ReduceOp.SUM);
        assertEquals(size * (size - 1) / 2f, x[0]);
        assertFalse(cfx.toString().isEmpty());
    }
}
