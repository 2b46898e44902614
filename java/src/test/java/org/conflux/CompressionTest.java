package org.conflux;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * Compression through org.conflux: allreduces and gradient sets with the _EVERYWHERE values,
 * checked against the exact sum of every rank's contribution computed here, error feedback on a
 * quadratic, and the engine's errors for bad input. Every method is collective.
 *
 * <p>The suites run twice. In the java.junit runs the ranks share a host and the shared-memory
 * reduction carries every allreduce: nothing is compressed, so each result must equal the
 * uncompressed one bit for bit. The java.compress runs set CFX_SHM=0 (the MPI path, where the
 * _EVERYWHERE values compress on one host) and CFX_TEST_EXPECT_COMPRESSED=1: each result must lie
 * within the rounding the engine documents (every contribution rounded once to the 16-bit form,
 * every combine once) of the exact sum, and an unscaled sum must be a value of the 16-bit form
 * (proof that it travelled compressed). Either way every rank's result is bitwise the same.
 */
@TestMethodOrder(MethodOrderer.MethodName.class)
class CompressionTest {
    private static Conflux cfx;
    private static int rank;
    private static int size;
    /** Whether the _EVERYWHERE values compress in this run (CFX_TEST_EXPECT_COMPRESSED=1). */
    private static boolean compressed;

    @BeforeAll
    static void open() {
        String expect = System.getenv("CFX_TEST_EXPECT_COMPRESSED");
        compressed = "1".equals(expect);
        if (expect != null && !compressed && !"0".equals(expect)) {
            fail("CFX_TEST_EXPECT_COMPRESSED=" + expect + " is neither 0 nor 1");
        }
        cfx = Conflux.init(new Conflux.Options().stallWarningSeconds(20).stallTimeoutSeconds(90));
        rank = cfx.rank();
        size = cfx.size();
    }

    @AfterAll
    static void close() {
        if (cfx != null) {
            cfx.close();
        }
    }

    /** Rank r's value of element i of tensor t: spread over [-8, 8], rarely a 16-bit value. */
    static double value(int r, int t, int i) {
        long h = (r + 1) * 0x9E3779B97F4A7C15L ^ (t + 7) * 0xC2B2AE3D27D4EB4FL ^ i * 0x165667B19E3779F9L;
        h ^= h >>> 29;
        h *= 0xBF58476D1CE4E5B9L;
        h ^= h >>> 32;
        return (Long.remainderUnsigned(h, 20001) - 10000.0) / 1234.567;
    }

    static boolean isBf16(Compression c) {
        return c == Compression.BF16 || c == Compression.BF16_EVERYWHERE;
    }

    /** Whether v is exactly a value of the 16-bit form (binary16 with subnormals, or bfloat16). */
    static boolean representable(Compression c, double v) {
        if (v == 0 || !Double.isFinite(v)) {
            return true;
        }
        if (isBf16(c)) {
            float f = (float) v;
            return f == v && (Float.floatToRawIntBits(f) & 0xFFFF) == 0;
        }
        double a = Math.abs(v);
        if (a > 65504.0) {
            return false;
        }
        int e = Math.getExponent(a);  // a = m 2^e, m in [1, 2)
        double scaled = e >= -14 ? Math.scalb(a, 10 - e) : Math.scalb(a, 24);
        return scaled == Math.floor(scaled);
    }

    /** A tensor's data and what each rank contributed to it (after rounding to the dtype). */
    private static final class Case {
        final int tensor;
        final boolean single;   // float32, else float64
        final int n;
        final ReduceOp op;
        final double pre;
        final double post;

        Case(int tensor, boolean single, int n, ReduceOp op, double pre, double post) {
            this.tensor = tensor;
            this.single = single;
            this.n = n;
            this.op = op;
            this.pre = pre;
            this.post = post;
        }

        double contribution(int r, int i) {
            double v = value(r, tensor, i);
            return single ? (float) v : v;
        }

        Object input() {
            if (single) {
                float[] a = new float[n];
                for (int i = 0; i < n; i++) {
                    a[i] = (float) contribution(rank, i);
                }
                return a;
            }
            double[] a = new double[n];
            for (int i = 0; i < n; i++) {
                a[i] = contribution(rank, i);
            }
            return a;
        }

        Conflux.AllreduceOptions options(Compression c) {
            return new Conflux.AllreduceOptions().op(op).prescale(pre).postscale(post).compression(c);
        }
    }

    static double at(Object data, int i) {
        return data instanceof float[] ? ((float[]) data)[i] : ((double[]) data)[i];
    }

    static long bits(Object data, int i) {
        return data instanceof float[] ? Float.floatToRawIntBits(((float[]) data)[i])
                : Double.doubleToRawLongBits(((double[]) data)[i]);
    }

    /**
     * Checks `got` against the exact postscale * op(prescale * x_r) over every rank's contribution:
     * within the documented rounding when `travelled` says it was compressed, else bit for bit
     * equal to `plain` (the uncompressed result).
     */
    static void check(String what, Case k, Compression c, boolean travelled, Object got, Object plain) {
        double u = isBf16(c) ? 0x1p-8 : 0x1p-11;
        int bad = 0;
        int unrepresentable = 0;
        StringBuilder first = new StringBuilder();
        for (int i = 0; i < k.n; i++) {
            double exact = 0;
            double mag = 0;
            for (int r = 0; r < size; r++) {
                exact += k.pre * k.contribution(r, i);
                mag += Math.abs(k.pre * k.contribution(r, i));
            }
            double f = k.op == ReduceOp.AVERAGE ? k.post / size : k.post;
            exact *= f;
            mag *= Math.abs(f);
            double v = at(got, i);
            boolean ok;
            if (travelled) {
                ok = Math.abs(v - exact) <= u * size * mag + 1e-6 * mag;
                if (k.op == ReduceOp.SUM && k.post == 1.0 && k.pre == 1.0 && !representable(c, v)) {
                    unrepresentable++;
                }
            } else {
                ok = bits(got, i) == bits(plain, i) && Math.abs(v - exact) <= 0x1p-22 * size * mag;
            }
            if (!ok && bad++ < 3) {
                first.append(String.format(" [%d] %.9g, exact %.9g, uncompressed %.9g;", i, v, exact,
                        at(plain, i)));
            }
        }
        if (bad > 0) {
            fail(what + " (" + c + (travelled ? ", compressed" : ", not compressed") + "): " + bad + " of "
                    + k.n + " elements off:" + first);
        }
        if (unrepresentable > 0) {
            fail(what + ": " + unrepresentable + " of " + k.n + " sums are no " + (isBf16(c) ? "bfloat16" : "float16")
                    + " values: the data did not travel compressed");
        }
    }

    /** Every rank's result bytes are this rank's. */
    static void identical(String what, Object data) {
        Object all = data instanceof float[] ? cfx.allgather("cz.same." + what, (float[]) data)
                : cfx.allgather("cz.same." + what, (double[]) data);
        int n = java.lang.reflect.Array.getLength(data);
        for (int r = 0; r < size; r++) {
            for (int i = 0; i < n; i++) {
                if (bits(all, r * n + i) != bits(data, i)) {
                    fail(what + ": rank " + r + "'s result differs from rank " + rank + "'s at element " + i);
                }
            }
        }
    }

    static Object copy(Object data) {
        return data instanceof float[] ? ((float[]) data).clone() : ((double[]) data).clone();
    }

    private static final Case[] CASES = {
        new Case(0, true, 20000, ReduceOp.SUM, 1.0, 1.0),
        new Case(1, false, 5001, ReduceOp.SUM, 1.0, 1.0),
        new Case(2, true, 17, ReduceOp.AVERAGE, 0.5, 3.0),
        new Case(3, false, 1, ReduceOp.SUM, 2.0, 0.25),
    };

    @Test
    void a01_everywhereSumsWithinTheRoundingOfTheExactSum() {
        for (Compression c : new Compression[] {Compression.FP16_EVERYWHERE, Compression.BF16_EVERYWHERE}) {
            for (Case k : CASES) {
                String name = "cz." + c + "." + k.tensor;
                Object plain = cfx.allreduce(name + ".plain", k.input(), k.options(Compression.NONE));
                Object got = cfx.allreduce(name, k.input(), k.options(c));
                check(name, k, c, compressed, got, plain);
                identical(name, got);
            }
        }
    }

    @Test
    void a02_crossHostCompressionLeavesOneHostExact() {
        // FP16 and BF16 compress only between hosts: one host reduces exactly on either path
        for (Compression c : new Compression[] {Compression.FP16, Compression.BF16}) {
            Case k = CASES[0];
            Object plain = cfx.allreduce("cz.host.plain", k.input(), k.options(Compression.NONE));
            Object got = cfx.allreduce("cz.host." + c, k.input(), k.options(c));
            check("cz.host." + c, k, c, false, got, plain);
        }
    }

    @Test
    void a03_directBuffersByteBuffersAndAsync() {
        Case k = CASES[0];
        Compression c = Compression.FP16_EVERYWHERE;
        float[] plain = (float[]) cfx.allreduce("cz.buf.plain", k.input(), k.options(Compression.NONE));
        FloatBuffer fb = ByteBuffer.allocateDirect(4 * k.n).order(ByteOrder.nativeOrder()).asFloatBuffer();
        fb.put((float[]) k.input()).flip();
        ByteBuffer bb = ByteBuffer.allocateDirect(4 * k.n).order(ByteOrder.nativeOrder());
        bb.asFloatBuffer().put((float[]) k.input());
        Handle<FloatBuffer> hf = cfx.allreduceAsync("cz.buf.float", fb, k.options(c));
        Handle<ByteBuffer> hb = cfx.allreduceAsync("cz.buf.byte", bb, DType.FLOAT32, k.options(c));
        Handle<float[]> ha = cfx.allreduceAsync("cz.buf.array", (float[]) k.input(), k.options(c));
        float[] a = ha.await();
        assertTrue(hf.await() == fb && hb.await() == bb);
        float[] f = new float[k.n];
        float[] b = new float[k.n];
        fb.get(0, f);
        bb.asFloatBuffer().get(0, b);
        check("cz.buf.float", k, c, compressed, f, plain);
        check("cz.buf.byte", k, c, compressed, b, plain);
        check("cz.buf.array", k, c, compressed, a, plain);
        identical("cz.buf", f);
    }

    @Test
    void a04_gradientSetSumsWithinTheRoundingOfTheExactSum() {
        Case[] grads = {new Case(10, true, 10000, ReduceOp.SUM, 1.0, 1.0), new Case(11, false, 513, ReduceOp.SUM, 1.0, 1.0)};
        long[][] shapes = {{200, 50}, {513}};
        Compression c = Compression.BF16_EVERYWHERE;
        GradientSet.Options o = new GradientSet.Options().op(ReduceOp.SUM).compression(c);
        try (GradientSet gs = new GradientSet(cfx, "cz.set", o)) {
            int[] index = new int[2];
            for (int g = 1; g >= 0; g--) {  // in the opposite order of the readiness below
                index[g] = gs.add("g" + g, shapes[g], grads[g].single ? DType.FLOAT32 : DType.FLOAT64);
            }
            gs.commit();
            for (int step = 0; step < 2; step++) {
                Object[] input = new Object[2];
                for (int g = 0; g < 2; g++) {
                    input[g] = grads[g].input();
                    ByteBuffer b = gs.buffer(index[g]);
                    if (grads[g].single) {
                        b.asFloatBuffer().put((float[]) input[g]);
                    } else {
                        b.asDoubleBuffer().put((double[]) input[g]);
                    }
                }
                gs.ready(index[0]);
                gs.ready(index[1]);
                gs.await(60);
                for (int g = 0; g < 2; g++) {
                    Object plain = cfx.allreduce("cz.set.plain" + g, input[g], grads[g].options(Compression.NONE));
                    Object got;
                    if (grads[g].single) {
                        float[] v = new float[grads[g].n];
                        gs.buffer(index[g]).asFloatBuffer().get(v);
                        got = v;
                    } else {
                        double[] v = new double[grads[g].n];
                        gs.buffer(index[g]).asDoubleBuffer().get(v);
                        got = v;
                    }
                    check("cz.set g" + g + " step " + step, grads[g], c, compressed, got, plain);
                    identical("cz.set" + step + "." + g, got);
                }
            }
        }
    }

    /**
     * SGD on sum_i (w_i - t_i)^2 / 2 through a gradient set: every rank's gradient is w - t plus an
     * offset that cancels over the ranks but is large enough that the 16-bit rounding of each
     * rank's value swallows w - t once w nears t. Returns the mean |w - t| at the end.
     */
    static double quadratic(Compression c, boolean feedback) {
        final int n = 256;
        final int steps = 1000;
        GradientSet.Options o = new GradientSet.Options().compression(c).errorFeedback(feedback);
        try (GradientSet gs = new GradientSet(cfx, feedback ? "cz.quadratic.ef" : "cz.quadratic", o)) {
            int idx = gs.add("w", new long[] {n}, DType.FLOAT32);
            gs.commit();
            FloatBuffer g = gs.buffer(idx).asFloatBuffer();
            double[] w = new double[n];
            double[] t = new double[n];
            double big = isBf16(c) ? 200.0 : 1000.0;
            double offset = rank < size - 1 ? big : -big * (size - 1);
            for (int i = 0; i < n; i++) {
                t[i] = value(0, 99, i) / 8.0;
            }
            for (int k = 0; k < steps; k++) {
                for (int i = 0; i < n; i++) {
                    g.put(i, (float) (w[i] - t[i] + offset));
                }
                gs.ready(idx);
                gs.await(60);
                double lr = 0.5 / (1.0 + k / 20.0);
                for (int i = 0; i < n; i++) {
                    w[i] -= lr * g.get(i);  // the average: every rank takes the same step
                }
            }
            identical(feedback ? "quadratic.ef" : "quadratic", w);
            double err = 0;
            for (int i = 0; i < n; i++) {
                err += Math.abs(w[i] - t[i]) / n;
            }
            return err;
        }
    }

    @Test
    void a05_errorFeedbackBringsTheQuadraticCloserToItsMinimum() {
        Compression c = Compression.FP16_EVERYWHERE;
        double plain = quadratic(c, false);
        double fed = quadratic(c, true);
        String got = String.format("mean |w - t|: %.4g without error feedback, %.4g with", plain, fed);
        if (compressed) {
            assertTrue(plain > 0.05, got + ": the rounding did not stall plain SGD, so this shows nothing");
            assertTrue(fed < 0.02 && fed < plain / 3, got);
        } else {
            assertTrue(plain < 0.02 && fed < 0.02, got + " (uncompressed: both should converge)");
        }
    }

    @Test
    void a06_badInputRaisesTheEnginesError() {
        Conflux.AllreduceOptions half = new Conflux.AllreduceOptions().compression(Compression.FP16_EVERYWHERE);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> cfx.allreduce("cz.int", new int[] {1, 2, 3}, half));
        assertTrue(e.getMessage().contains("tensor 'cz.int'")
                && e.getMessage().contains("compression takes float32 and float64 tensors, not int32"),
                e.getMessage());
        e = assertThrows(IllegalArgumentException.class,
                () -> cfx.allreduce("cz.adasum", new float[4], new Conflux.AllreduceOptions()
                        .op(ReduceOp.ADASUM).compression(Compression.BF16)));
        assertTrue(e.getMessage().contains("cz.adasum"), e.getMessage());
        GradientSet.Options o = new GradientSet.Options().compression(Compression.FP16);
        try (GradientSet gs = new GradientSet(cfx, "cz.halfset", o)) {
            e = assertThrows(IllegalArgumentException.class, () -> gs.add("h", new long[] {4}, DType.FLOAT16));
            assertTrue(e.getMessage().contains("gradient 'h'"), e.getMessage());
        }
        e = assertThrows(IllegalArgumentException.class,
                () -> new GradientSet(cfx, "cz.ef.none", new GradientSet.Options().errorFeedback(true)));
        assertTrue(e.getMessage().contains("error_feedback"), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> new Conflux.AllreduceOptions().compression((Compression) null));
        assertThrows(IllegalArgumentException.class, () -> cfx.allreduce("cz.null", new float[1],
                (Conflux.AllreduceOptions) null));
        // only local checks above: no rank may go on (and close its context) while another makes them
        cfx.barrier();
    }

    @Test
    void a07_ranksThatDisagreeOnCompressionFailNamingTheTensor() {
        Compression mine = rank == 0 ? Compression.FP16 : Compression.NONE;
        MismatchException e = assertThrows(MismatchException.class,
                () -> cfx.allreduce("cz.mismatched", new float[8], new Conflux.AllreduceOptions().compression(mine)));
        assertTrue(e.getMessage().contains("cz.mismatched") && e.getMessage().contains("compression")
                && e.getMessage().contains("fp16"), e.getMessage());
        GradientSet.Options o = new GradientSet.Options()
                .compression(rank == size - 1 ? Compression.BF16 : Compression.NONE);
        try (GradientSet gs = new GradientSet(cfx, "cz.mixed", o)) {
            gs.add("w", new long[] {8}, DType.FLOAT32);
            MismatchException m = assertThrows(MismatchException.class, gs::commit);
            assertTrue(m.getMessage().contains("cz.mixed") && m.getMessage().contains("bf16"), m.getMessage());
        }
        float[] x = {1f};
        cfx.allreduce("cz.after", x, ReduceOp.SUM);
        assertEquals(size, x[0]);
    }
}
