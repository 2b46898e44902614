package org.conflux;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * What every binding accepts alike (docs/bindings.md): AVERAGE when no op is named, a compression
 * by its name as well as its enum value, init options set by name. Results are checked against
 * every rank's contribution (TestContext.value) summed here.
 */
@TestMethodOrder(MethodOrderer.MethodName.class)
class AcceptedFormsTest extends OnSharedContext {

    private static double[] mine(int n) {
        double[] x = new double[n];
        for (int i = 0; i < n; i++) {
            x[i] = TestContext.value(rank, i);
        }
        return x;
    }

    @Test
    void a01_defaultOpIsAverage() {
        assertEquals(ReduceOp.AVERAGE, Conflux.DEFAULT_OP);
        double[] x = cfx.allreduce("forms.default", mine(5));
        double[] y = cfx.allreduce("forms.default.opts", mine(5), new Conflux.AllreduceOptions());
        double[] z = cfx.allreduceAsync("forms.default.async", mine(5)).await();
        for (int i = 0; i < 5; i++) {
            assertEquals(sumOver(i) / size, x[i], 1e-12, "element " + i);
            assertEquals(x[i], y[i]);
            assertEquals(x[i], z[i]);
        }
    }

    @Test
    void a02_compressionByNameIsTheEnum() {
        for (Compression c : Compression.values()) {
            String name = c.name().toLowerCase(java.util.Locale.ROOT);
            float[] byEnum = new float[33];
            float[] byName = new float[33];
            for (int i = 0; i < 33; i++) {
                byEnum[i] = byName[i] = (float) (TestContext.value(rank, i) / 7.0);
            }
            cfx.allreduce("forms.z.enum." + name, byEnum, new Conflux.AllreduceOptions().op(ReduceOp.SUM).compression(c));
            cfx.allreduce("forms.z.name." + name, byName,
                    new Conflux.AllreduceOptions().op(ReduceOp.SUM).compression(c == Compression.FP16 ? "FP16" : name));
            assertArrayEquals(byEnum, byName, name);
            for (int i = 0; i < 33; i++) {
                assertEquals(sumOver(i) / 7.0, byName[i], Math.abs(sumOver(i) / 7.0) / 64 + 1e-6, name + " element " + i);
            }
            assertEquals(c, Compression.of(name));
        }
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> Compression.of("fp8"));
        assertTrue(e.getMessage().contains("unknown compression 'fp8'; use one of: none, fp16, bf16"), e.getMessage());
    }

    @Test
    void a03_initOptionsByNameAreCheckedInC() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> Conflux.init(new Conflux.Options().set("no_such_option", 1)));
        assertTrue(e.getMessage().contains("unknown option 'no_such_option' (known: transport"), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> Conflux.init(new Conflux.Options().cacheCapacity(-3)));
        assertTrue(e.getMessage().contains("init option cache_capacity must be a whole number >= 0, not -3"),
                e.getMessage());
    }
}
