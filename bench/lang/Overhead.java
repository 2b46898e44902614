/*
 * Overhead.java - per-call cost of a 1-element allreduce (enqueue + wait) through org.conflux, on a
 * float[] (copied) and on a direct FloatBuffer (zero-copy), interleaved in blocks with the same call
 * made from C in this process (a JNI helper reached by reflection: it is not public API), so that
 * all three see the same conditions. Each Java path first runs WARM_CALLS untimed calls, so that
 * the timed ones run the JIT's compiled code. See run.sh.
 * Usage: java -cp conflux.jar Overhead.java [iterations] [blocks]
 * Rank 0 prints "<path> <median_us> <p10> <p90>" for c-in-java, java-array and java-buffer.
 */
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.Arrays;
import org.conflux.Conflux;
import org.conflux.ReduceOp;

public final class Overhead {
    /** bench/lang's C loop (loops.c, through loops_jni.c): -Dconflux.bench.jni names the library. */
    private static native int cLoop(long ctx, double[] out);

    static {
        System.load(System.getProperty("conflux.bench.jni"));
    }

    static final int WARM_CALLS = 20_000;

    public static void main(String[] args) throws Exception {
        int iters = args.length > 0 ? Integer.parseInt(args[0]) : 5000;
        int blocks = args.length > 1 ? Integer.parseInt(args[1]) : 10;
        int per = iters / blocks;
        try (Conflux cfx = Conflux.init()) {
            Method ptr = Conflux.class.getDeclaredMethod("ptr");
            ptr.setAccessible(true);
            long ctx = (Long) ptr.invoke(cfx);
            float[] a = {1f};
            FloatBuffer b = ByteBuffer.allocateDirect(4).order(ByteOrder.nativeOrder()).asFloatBuffer();
            double[] tc = new double[per * blocks];
            double[] ta = new double[per * blocks];
            double[] tb = new double[per * blocks];
            double[] block = new double[per];
            // Steady state, not the JIT's warm-up: HotSpot compiles a method fully (C2) after about
            // 10,000 calls, on compiler threads that would share the 2 cores with the timed calls.
            for (int i = 0; i < WARM_CALLS; i++) {
                cfx.allreduce("ovh", a, ReduceOp.SUM);
                cfx.allreduce("ovh", b, ReduceOp.SUM);
            }
            Thread.sleep(200);  // let the compiler threads finish
            for (int k = -1; k < blocks; k++) {     // block -1 warms up the C loop and is not counted
                int st = cLoop(ctx, block);
                if (st != 0) {
                    throw new IllegalStateException("C loop failed: status " + st);
                }
                for (int i = 0; i < per; i++) {
                    a[0] = 1f;
                    long t0 = System.nanoTime();
                    cfx.allreduce("ovh", a, ReduceOp.SUM);
                    long t1 = System.nanoTime();
                    if (k >= 0) {
                        ta[k * per + i] = (t1 - t0) / 1e3;
                    }
                }
                for (int i = 0; i < per; i++) {
                    b.put(0, 1f);
                    long t0 = System.nanoTime();
                    cfx.allreduce("ovh", b, ReduceOp.SUM);
                    long t1 = System.nanoTime();
                    if (k >= 0) {
                        tb[k * per + i] = (t1 - t0) / 1e3;
                    }
                }
                if (k >= 0) {
                    System.arraycopy(block, 0, tc, k * per, per);
                }
            }
            if (cfx.rank() == 0) {
                print("c-in-java", tc);
                print("java-array", ta);
                print("java-buffer", tb);
            }
        }
    }

    static void print(String what, double[] t) {
        Arrays.sort(t);
        System.out.printf("%s %.2f %.2f %.2f%n", what, t[t.length / 2], t[t.length / 10], t[t.length * 9 / 10]);
    }
}
