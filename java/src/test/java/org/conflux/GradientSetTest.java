package org.conflux;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.nio.ByteBuffer;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * GradientSet across ranks: registration in an order of each rank's own, readiness in another,
 * accumulation, unused gradients and a mismatched registration; every result is checked against
 * the reduction of what each rank put in, recomputed here. Every method is collective.
 */
@TestMethodOrder(MethodOrderer.MethodName.class)
class GradientSetTest extends OnSharedContext {
    private static final String[] NAMES = {"conv.weight", "conv.bias", "fc.weight", "fc.bias", "emb"};
    private static final long[][] SHAPES = {{4, 3}, {4}, {5, 2}, {5}, {30}};
    private static final DType[] DTYPES = {DType.FLOAT32, DType.FLOAT32, DType.FLOAT64, DType.FLOAT64,
        DType.FLOAT32};

    /** Rank r's value of gradient g's element i in a step and pass: small integers (exact sums). */
    static double value(int r, int g, int i, int step, int pass) {
        return (r + 1) * (((i + g + 3 * step + 5 * pass) % 7) + 1);
    }

    static int count(int g) {
        long n = 1;
        for (long d : SHAPES[g]) {
            n *= d;
        }
        return (int) n;
    }

    /** This rank's registration order: rotated by the rank, reversed on odd ranks. */
    static int[] order(int r) {
        int n = NAMES.length;
        int[] o = new int[n];
        for (int k = 0; k < n; k++) {
            o[r % 2 == 1 ? n - 1 - k : k] = (k + r) % n;
        }
        return o;
    }

    static int[] register(GradientSet gs) {
        int[] index = new int[NAMES.length];
        for (int g : order(rank)) {
            index[g] = gs.add(NAMES[g], SHAPES[g], DTYPES[g]);
        }
        return index;
    }

    static double get(ByteBuffer b, int g, int i) {
        return DTYPES[g] == DType.FLOAT32 ? b.getFloat(4 * i) : b.getDouble(8 * i);
    }

    static void put(ByteBuffer b, int g, int i, double v) {
        if (DTYPES[g] == DType.FLOAT32) {
            b.putFloat(4 * i, (float) v);
        } else {
            b.putDouble(8 * i, v);
        }
    }

    static void fill(GradientSet gs, int[] index, int g, int step, int pass, boolean add) {
        ByteBuffer b = gs.buffer(index[g]);
        for (int i = 0; i < count(g); i++) {
            put(b, g, i, (add ? get(b, g, i) : 0) + value(rank, g, i, step, pass));
        }
    }

    /** The average over ranks of the passes' sum, times scale. */
    static void check(GradientSet gs, int[] index, int step, int passes, double scale) {
        for (int g = 0; g < NAMES.length; g++) {
            ByteBuffer b = gs.buffer(index[g]);
            assertEquals(count(g) * DTYPES[g].size, b.capacity(), NAMES[g]);
            for (int i = 0; i < count(g); i++) {
                double want = 0;
                for (int r = 0; r < size; r++) {
                    for (int p = 0; p < passes; p++) {
                        want += value(r, g, i, step, p);
                    }
                }
                want = want * scale / size;
                if (Math.abs(get(b, g, i) - want) > 1e-5 * Math.abs(want)) {
                    fail(NAMES[g] + "[" + i + "] step " + step + ": " + get(b, g, i) + " != " + want);
                }
            }
        }
    }

    @Test
    void a01_averagesGradientsRegisteredAndReadyInAnyOrder() {
        try (GradientSet gs = new GradientSet(cfx, "java.orders", new GradientSet.Options().bucketBytes(64))) {
            int[] index = register(gs);
            assertThrows(IllegalStateException.class, () -> gs.buffer(index[0]));
            gs.commit();
            assertEquals(0.0f, gs.buffer(index[4]).getFloat(0));  // zeroed
            for (int step = 0; step < 3; step++) {
                for (int g : order(rank + step + 1)) {
                    fill(gs, index, g, step, 0, false);
                    if (g % 2 == 0) {
                        gs.ready(NAMES[g]);
                    } else {
                        gs.ready(index[g]);
                    }
                }
                gs.await(60);
                check(gs, index, step, 1, 1.0);
            }
        }
    }

    @Test
    void a02_accumulatesPassesBeforeOneReduction() {
        GradientSet.Options o = new GradientSet.Options().accumulateSteps(2).prescale(0.5);
        try (GradientSet gs = new GradientSet(cfx, "java.accumulate", o)) {
            int[] index = register(gs);
            gs.commit();
            for (int step = 0; step < 2; step++) {
                for (int pass = 0; pass < 2; pass++) {
                    for (int g = NAMES.length - 1; g >= 0; g--) {
                        fill(gs, index, g, step, pass, pass > 0);
                        gs.ready(index[g]);
                    }
                }
                IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> gs.ready(index[0]));
                assertTrue(e.getMessage().contains("marked ready"), e.getMessage());
                gs.await(60);
                check(gs, index, step, 2, 0.5);
            }
        }
    }

    @Test
    void a03_reducesGradientsNeverMarkedReadyAsTheyAre() {
        try (GradientSet gs = new GradientSet(cfx, "java.unused", new GradientSet.Options().bucketBytes(64))) {
            int[] index = register(gs);
            gs.commit();
            for (int step = 0; step < 2; step++) {
                for (int g = 0; g < NAMES.length; g++) {
                    fill(gs, index, g, step, 0, false);
                    if ((step == 0 && g != rank % NAMES.length) || (step == 1 && g == 0)) {
                        gs.ready(index[g]);
                    }
                }
                gs.await(60);
                check(gs, index, step, 1, 1.0);
            }
        }
    }

    @Test
    void a04_sumsWithScales() {
        GradientSet.Options o = new GradientSet.Options().op(ReduceOp.SUM).prescale(2).postscale(0.25);
        try (GradientSet gs = new GradientSet(cfx, "java.sum", o)) {
            int[] index = register(gs);
            gs.commit();
            for (int g = 0; g < NAMES.length; g++) {
                fill(gs, index, g, 0, 0, false);
                gs.ready(index[g]);
            }
            gs.await();
            check(gs, index, 0, 1, 0.5 * size);  // sum = average * size
        }
    }

    @Test
    void a05_mismatchedRegistrationFailsOnEveryRankNamingTheGradient() {
        try (GradientSet gs = new GradientSet(cfx, "java.mismatch", new GradientSet.Options())) {
            gs.add("fc.bias", new long[] {3}, DType.FLOAT32);
            gs.add("fc.weight", rank == size - 1 ? new long[] {4, 2} : new long[] {2, 4}, DType.FLOAT32);
            MismatchException e = assertThrows(MismatchException.class, gs::commit);
            assertTrue(e.getMessage().contains("'fc.weight' is float32 [2, 4]"), e.getMessage());
            assertTrue(e.getMessage().contains("float32 [4, 2] on rank " + (size - 1)), e.getMessage());
        }
    }

    @Test
    void a06_badLocalArgumentsAreRefused() {
        GradientSet gs = new GradientSet(cfx, "java.errors", new GradientSet.Options());
        int i = gs.add("w", new long[] {4}, DType.FLOAT32);
        assertThrows(DuplicateNameException.class, () -> gs.add("w", new long[] {2}, DType.FLOAT32));
        assertThrows(IllegalArgumentException.class, () -> gs.add("n", new long[] {-1}, DType.FLOAT32));
        gs.commit();
        assertThrows(IllegalStateException.class, () -> gs.add("late", new long[] {2}, DType.FLOAT32));
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> gs.ready("nope"));
        assertTrue(e.getMessage().contains("no gradient 'nope'"), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> gs.ready(7));
        gs.ready(i);
        gs.await();
        gs.close();
        gs.close();  // idempotent
        assertThrows(IllegalStateException.class, () -> gs.ready(i));
        assertThrows(IllegalArgumentException.class,
                () -> new GradientSet(cfx, "java.errors.bad", new GradientSet.Options().accumulateSteps(0)));
    }
}
