/*
 * GradientStep.java - one gradient-set step through org.conflux.GradientSet (every parameter of a
 * workload registered once, owned storage, each step ready in reverse registration order, then
 * await), interleaved in blocks with the same step on the same set issued from C in this process
 * (a JNI helper reached by reflection: it is not public API), so that both see the same set, the
 * same buckets and the same load. The result of one step of each kind is checked first against
 * the sum of what every rank put in. See run.sh.
 * Usage: java -cp conflux.jar GradientStep.java WORKLOAD.tsv [steps] [blocks]
 * Rank 0 prints "<path> <median_us> <p10> <p90> <min>" for c-gradset-in-java and java-gradset (the
 * step), and c-ready-in-java and java-ready (its ready calls alone: what the binding adds per step).
 */
import java.io.IOException;
import java.lang.reflect.Field;
import java.nio.FloatBuffer;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.conflux.Conflux;
import org.conflux.DType;
import org.conflux.GradientSet;
import org.conflux.ReduceOp;

public final class GradientStep {
    /** bench/lang's C step (loops.c, through loops_jni.c): -Dconflux.bench.jni names the library. */
    private static native int cStep(long set, int count, double[] out, double[] ready);

    static {
        System.load(System.getProperty("conflux.bench.jni"));
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            throw new IllegalArgumentException("usage: GradientStep WORKLOAD.tsv [steps] [blocks]");
        }
        List<String> names = new ArrayList<>();
        List<long[]> shapes = new ArrayList<>();
        read(args[0], names, shapes);
        int steps = args.length > 1 ? Integer.parseInt(args[1]) : 40;
        int blocks = args.length > 2 ? Integer.parseInt(args[2]) : 4;
        int per = Math.max(1, steps / blocks);
        try (Conflux cfx = Conflux.init();
             GradientSet gs = new GradientSet(cfx, "bench.lang.java", new GradientSet.Options().op(ReduceOp.SUM))) {
            int n = names.size();
            for (int i = 0; i < n; i++) {
                gs.add(names.get(i), shapes.get(i), DType.FLOAT32);
            }
            gs.commit();
            Field setField = GradientSet.class.getDeclaredField("set");
            setField.setAccessible(true);
            long set = (Long) setField.get(gs);
            Runnable c = () -> {
                try {
                    cSteps(set, n, new double[1], new double[1]);
                } catch (Exception e) {
                    throw new IllegalStateException(e);
                }
            };
            checkOnce(cfx, gs, n, "java-gradset", () -> {
                ready(gs, n);
                gs.await();
            });
            checkOnce(cfx, gs, n, "c-gradset-in-java", c);
            double[] tc = new double[per * blocks];
            double[] tj = new double[per * blocks];
            double[] rc = new double[per * blocks];
            double[] rj = new double[per * blocks];
            double[] block = new double[per];
            double[] blockReady = new double[per];
            // block -1 warms up (JIT) and is not counted; odd blocks run the C steps last, so that
            // neither path always follows the other
            for (int k = -1; k < blocks; k++) {
                if (k % 2 == 0 || k < 0) {
                    cSteps(set, n, block, blockReady);
                }
                for (int i = 0; i < per; i++) {
                    long t0 = System.nanoTime();
                    ready(gs, n);
                    long tr = System.nanoTime();
                    gs.await();
                    long t1 = System.nanoTime();
                    if (k >= 0) {
                        tj[k * per + i] = (t1 - t0) / 1e3;
                        rj[k * per + i] = (tr - t0) / 1e3;
                    }
                }
                if (k % 2 != 0 && k >= 0) {
                    cSteps(set, n, block, blockReady);
                }
                if (k >= 0) {
                    System.arraycopy(block, 0, tc, k * per, per);
                    System.arraycopy(blockReady, 0, rc, k * per, per);
                }
            }
            if (cfx.rank() == 0) {
                print("c-gradset-in-java", tc);
                print("java-gradset", tj);
                print("c-ready-in-java", rc);
                print("java-ready", rj);
            }
        }
    }

    /** block.length steps through the JNI helper (their times and those of their ready calls). */
    static void cSteps(long set, int n, double[] block, double[] blockReady) {
        int st = cStep(set, n, block, blockReady);
        if (st != 0) {
            throw new IllegalStateException("C step failed: status " + st);
        }
    }

    /** The step being measured is this, every gradient ready in reverse registration order, then await. */
    static void ready(GradientSet gs, int n) {
        for (int i = n - 1; i >= 0; i--) {
            gs.ready(i);
        }
    }

    /**
     * Fills every gradient with rank-dependent values, runs one step and checks the sums against
     * what every rank put in; then zeroes the storage for the timed steps (as bench/conflux_bench.c).
     */
    static void checkOnce(Conflux cfx, GradientSet gs, int n, String what, Runnable step) {
        int rank = cfx.rank();
        int size = cfx.size();
        for (int g = 0; g < n; g++) {
            FloatBuffer b = gs.buffer(g).asFloatBuffer();
            for (int i = 0; i < b.capacity(); i++) {
                b.put(i, (rank + 1) * ((i + g) % 7 + 1));
            }
        }
        step.run();
        for (int g = 0; g < n; g++) {
            FloatBuffer b = gs.buffer(g).asFloatBuffer();
            for (int i = 0; i < b.capacity(); i++) {
                float want = size * (size + 1) / 2 * ((i + g) % 7 + 1);
                if (b.get(i) != want) {
                    throw new IllegalStateException(what + ": gradient " + g + " element " + i + " is "
                            + b.get(i) + ", not " + want);
                }
                b.put(i, 0f);
            }
        }
    }

    static void read(String path, List<String> names, List<long[]> shapes) throws IOException {
        for (String line : Files.readAllLines(Paths.get(path))) {
            if (line.isEmpty() || line.startsWith("#")) {
                continue;
            }
            String[] f = line.split("\t");
            String[] d = f[1].split("x");
            long[] shape = new long[d.length];
            for (int i = 0; i < d.length; i++) {
                shape[i] = Long.parseLong(d[i]);
            }
            names.add(f[0]);
            shapes.add(shape);
        }
    }

    static void print(String what, double[] t) {
        Arrays.sort(t);
        System.out.printf("%s %.2f %.2f %.2f %.2f%n", what, t[t.length / 2], t[t.length / 10],
                t[t.length * 9 / 10], t[0]);
    }
}
