/*
 * MlpGradientSet.java - a small data-parallel MLP trainer whose optimizer step goes through
 * org.conflux.GradientSet.
 *
 * Every rank generates its own shard of a synthetic problem that no linear model solves (is a point
 * inside a circle?), runs a 2-16-1 tanh/sigmoid network forward and backward on it, writes each
 * layer's gradients straight into the set's buffers as backward produces them (output layer first)
 * and marks them ready; await() leaves the average over ranks in those buffers, and every rank takes
 * the same SGD step. The first step's averages are checked against an allreduce AVERAGE of copies of
 * this rank's gradients. At the end every rank must hold bit-identical weights (allreduce MIN and MAX
 * equal the local weights bit for bit), the global loss must have fallen to under half its start and
 * the global accuracy must exceed 90%. Exits 1 otherwise.
 *
 *   mpirun -np 3 java -cp conflux.jar:conflux_examples.jar MlpGradientSet [steps]
 *   cfxrun -np 3 java -cp build/java/conflux.jar:build/java/conflux_examples.jar MlpGradientSet
 */
import java.nio.FloatBuffer;
import java.util.Random;
import org.conflux.Conflux;
import org.conflux.DType;
import org.conflux.GradientSet;
import org.conflux.ReduceOp;

public final class MlpGradientSet {
    static final int IN = 2;
    static final int HIDDEN = 16;
    static final int SAMPLES_PER_RANK = 1000;
    /** Parameters in registration order (the order of the forward pass). */
    static final String[] NAMES = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
    static final long[][] SHAPES = {{HIDDEN, IN}, {HIDDEN}, {1, HIDDEN}, {1}};

    private final Conflux cfx;
    private final GradientSet gs;
    private final int[] index = new int[NAMES.length];
    /** The set's storage: backward writes this rank's gradients there, await leaves the averages. */
    private final FloatBuffer[] grad = new FloatBuffer[NAMES.length];
    private final float[][] p = new float[NAMES.length][];
    private final float[][] x = new float[SAMPLES_PER_RANK][IN];
    private final float[] y = new float[SAMPLES_PER_RANK];

    public static void main(String[] args) {
        int steps = args.length > 0 ? Integer.parseInt(args[0]) : 400;
        boolean ok;
        try (Conflux cfx = Conflux.init();
             GradientSet gs = new GradientSet(cfx, "mlp", new GradientSet.Options().op(ReduceOp.AVERAGE))) {
            ok = new MlpGradientSet(cfx, gs).train(steps);
        }
        System.exit(ok ? 0 : 1);
    }

    MlpGradientSet(Conflux cfx, GradientSet gs) {
        this.cfx = cfx;
        this.gs = gs;
        // this rank's shard: points in [-1, 1]^2, label 1 inside the circle of area 1/2
        Random rng = new Random(1000 + cfx.rank());
        double r2 = 2.0 / Math.PI;
        for (int n = 0; n < SAMPLES_PER_RANK; n++) {
            x[n][0] = 2 * rng.nextFloat() - 1;
            x[n][1] = 2 * rng.nextFloat() - 1;
            y[n] = x[n][0] * x[n][0] + x[n][1] * x[n][1] < r2 ? 1f : 0f;
        }
        // the parameters: the same initial values on every rank (one seed); biases start at zero
        Random init = new Random(7);
        for (int k = 0; k < NAMES.length; k++) {
            p[k] = new float[(int) (SHAPES[k][0] * (SHAPES[k].length > 1 ? SHAPES[k][1] : 1))];
            for (int i = 0; k % 2 == 0 && i < p[k].length; i++) {
                p[k][i] = (float) (init.nextGaussian() * (k == 0 ? 1.0 : 0.5));
            }
        }
        for (int k = 0; k < NAMES.length; k++) {
            index[k] = gs.add(NAMES[k], SHAPES[k], DType.FLOAT32);
        }
        gs.commit();  // collective: every rank registered the same names, dtypes and shapes
        for (int k = 0; k < NAMES.length; k++) {
            grad[k] = gs.buffer(index[k]).asFloatBuffer();
        }
    }

    boolean train(int steps) {
        int rank = cfx.rank();
        boolean ok = true;
        float lr = 1.0f;
        double first = Double.NaN;
        double last = Double.NaN;
        for (int step = 0; step < steps; step++) {
            float[][] mine = step == 0 ? new float[NAMES.length][] : null;
            double loss = backward(mine);
            gs.await();  // grad[k] now holds the average over ranks
            if (mine != null) {
                ok &= matchesAllreduce(mine);
            }
            for (int k = 0; k < NAMES.length; k++) {
                for (int i = 0; i < p[k].length; i++) {
                    p[k][i] -= lr * grad[k].get(i);
                }
            }
            if (step == 0 || step == steps - 1 || step % 50 == 0) {
                double global = average("loss", loss);
                if (step == 0) {
                    first = global;
                }
                last = global;
                if (rank == 0) {
                    System.out.printf("step %3d  loss %.6f%n", step, global);
                }
            }
        }
        double accuracy = average("accuracy", accuracy());
        boolean same = identical();
        boolean falling = last < 0.5 * first;
        boolean accurate = accuracy > 0.9;
        if (rank == 0) {
            System.out.printf("loss %.6f -> %.6f (%s), accuracy %.3f (%s); weights %s on all %d ranks%n",
                    first, last, falling ? "falling" : "NOT falling", accuracy,
                    accurate ? "ok" : "NOT over 0.9", same ? "bit-identical" : "DIFFER", cfx.size());
        }
        return ok && falling && accurate && same;
    }

    /**
     * Forward and backward over this rank's shard (mean binary cross-entropy): writes each
     * gradient into its buffer and marks it ready as soon as it is complete, output layer first
     * (with {@code keep}, a copy of it goes there first: once ready, the buffer may be reduced in
     * place at any moment). Returns this rank's mean loss.
     */
    double backward(float[][] keep) {
        float[] w1 = p[0];
        float[] b1 = p[1];
        float[] w2 = p[2];
        float[][] h = new float[x.length][HIDDEN];
        float[] delta = new float[x.length];
        double loss = 0;
        for (int n = 0; n < x.length; n++) {
            double z = p[3][0];
            for (int j = 0; j < HIDDEN; j++) {
                h[n][j] = (float) Math.tanh(w1[j * IN] * x[n][0] + w1[j * IN + 1] * x[n][1] + b1[j]);
                z += w2[j] * h[n][j];
            }
            double out = 1.0 / (1.0 + Math.exp(-z));
            loss -= y[n] > 0 ? Math.log(out + 1e-12) : Math.log(1 - out + 1e-12);
            delta[n] = (float) ((out - y[n]) / x.length);  // d loss / d z
        }
        // output layer: its gradients are complete first
        float gb2 = 0;
        for (int j = 0; j < HIDDEN; j++) {
            float g = 0;
            for (int n = 0; n < x.length; n++) {
                g += delta[n] * h[n][j];
            }
            grad[2].put(j, g);
        }
        for (int n = 0; n < x.length; n++) {
            gb2 += delta[n];
        }
        grad[3].put(0, gb2);
        ready(3, keep);
        ready(2, keep);
        // hidden layer
        for (int j = 0; j < HIDDEN; j++) {
            float gw0 = 0;
            float gw1 = 0;
            float gb = 0;
            for (int n = 0; n < x.length; n++) {
                float d = delta[n] * w2[j] * (1 - h[n][j] * h[n][j]);
                gw0 += d * x[n][0];
                gw1 += d * x[n][1];
                gb += d;
            }
            grad[0].put(j * IN, gw0);
            grad[0].put(j * IN + 1, gw1);
            grad[1].put(j, gb);
        }
        ready(1, keep);
        ready(0, keep);
        return loss / x.length;
    }

    void ready(int k, float[][] keep) {
        if (keep != null) {
            keep[k] = new float[grad[k].capacity()];
            grad[k].get(0, keep[k]);
        }
        gs.ready(index[k]);
    }

    double accuracy() {
        int right = 0;
        for (int n = 0; n < x.length; n++) {
            double z = p[3][0];
            for (int j = 0; j < HIDDEN; j++) {
                z += p[2][j] * Math.tanh(p[0][j * IN] * x[n][0] + p[0][j * IN + 1] * x[n][1] + p[1][j]);
            }
            right += (z > 0) == (y[n] > 0) ? 1 : 0;
        }
        return (double) right / x.length;
    }

    /** The set's averages equal an allreduce AVERAGE of every rank's own gradients (to rounding). */
    boolean matchesAllreduce(float[][] mine) {
        for (int k = 0; k < mine.length; k++) {
            float[] want = cfx.allreduce("check." + NAMES[k], mine[k], ReduceOp.AVERAGE);
            for (int i = 0; i < want.length; i++) {
                if (Math.abs(grad[k].get(i) - want[i]) > 1e-6f * (1 + Math.abs(want[i]))) {
                    System.err.printf("rank %d: %s[%d] is %g after await, the allreduce gives %g%n",
                            cfx.rank(), NAMES[k], i, grad[k].get(i), want[i]);
                    return false;
                }
            }
        }
        return true;
    }

    double average(String name, double v) {
        return cfx.allreduce(name, new double[] {v}, ReduceOp.AVERAGE)[0];
    }

    /** Every rank's parameters equal this rank's bit for bit (allreduce MIN and MAX). */
    boolean identical() {
        boolean same = true;
        for (int k = 0; k < p.length; k++) {
            float[] lo = cfx.allreduce("min." + NAMES[k], p[k].clone(), ReduceOp.MIN);
            float[] hi = cfx.allreduce("max." + NAMES[k], p[k].clone(), ReduceOp.MAX);
            for (int i = 0; i < p[k].length; i++) {
                int bits = Float.floatToRawIntBits(p[k][i]);
                same &= bits == Float.floatToRawIntBits(lo[i]) && bits == Float.floatToRawIntBits(hi[i]);
            }
        }
        int[] ok = {same ? 1 : 0};
        cfx.allreduce("weights.same", ok, ReduceOp.MIN);
        return ok[0] == 1;
    }
}
