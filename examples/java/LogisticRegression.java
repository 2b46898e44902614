/*
 * LogisticRegression.java - a small data-parallel trainer over Conflux.
 *
 * Every rank generates its own shard of a synthetic binary classification problem (fixed seeds),
 * computes the full-batch gradient of the logistic loss on it, and averages the gradient across ranks
 * with one allreduce per step; rank 0 prints the (global) loss. At the end every rank must hold
 * bit-identical weights: allreduce MIN and MAX of the weights equal the local weights bit for bit.
 * Exits 1 if the loss did not fall or the weights differ.
 *
 *   mpirun -np 3 java -cp conflux.jar:conflux_examples.jar LogisticRegression [steps]
 *   cfxrun -np 3 java -cp build/java/conflux.jar:build/java/conflux_examples.jar LogisticRegression
 */
import java.util.Random;
import org.conflux.Conflux;
import org.conflux.ReduceOp;

public final class LogisticRegression {
    static final int DIM = 16;
    static final int SAMPLES_PER_RANK = 2000;

    private LogisticRegression() {
    }

    public static void main(String[] args) {
        int steps = args.length > 0 ? Integer.parseInt(args[0]) : 60;
        int status;
        try (Conflux cfx = Conflux.init()) {
            status = train(cfx, steps);
        }
        System.exit(status);
    }

    static int train(Conflux cfx, int steps) {
        int rank = cfx.rank();
        // the true model: the same on every rank
        Random truth = new Random(42);
        float[] wTrue = new float[DIM + 1];
        for (int j = 0; j <= DIM; j++) {
            wTrue[j] = (float) truth.nextGaussian();
        }
        // this rank's shard
        Random rng = new Random(1000 + rank);
        float[][] x = new float[SAMPLES_PER_RANK][DIM];
        float[] y = new float[SAMPLES_PER_RANK];
        for (int n = 0; n < SAMPLES_PER_RANK; n++) {
            double z = wTrue[DIM];
            for (int j = 0; j < DIM; j++) {
                x[n][j] = (float) rng.nextGaussian();
                z += wTrue[j] * x[n][j];
            }
            y[n] = rng.nextDouble() < sigmoid(z) ? 1f : 0f;
        }

        float[] w = new float[DIM + 1];  // weights + bias, all zero on every rank
        float lr = 0.5f;
        double first = Double.NaN;
        double last = Double.NaN;
        for (int step = 0; step < steps; step++) {
            // gradient (DIM + 1) and loss sum in one buffer: one allreduce per step
            float[] g = new float[DIM + 2];
            double loss = 0;
            for (int n = 0; n < SAMPLES_PER_RANK; n++) {
                double z = w[DIM];
                for (int j = 0; j < DIM; j++) {
                    z += w[j] * x[n][j];
                }
                double p = sigmoid(z);
                loss -= y[n] > 0 ? Math.log(p + 1e-12) : Math.log(1 - p + 1e-12);
                float err = (float) (p - y[n]);
                for (int j = 0; j < DIM; j++) {
                    g[j] += err * x[n][j];
                }
                g[DIM] += err;
            }
            for (int j = 0; j <= DIM; j++) {
                g[j] /= SAMPLES_PER_RANK;
            }
            g[DIM + 1] = (float) (loss / SAMPLES_PER_RANK);
            cfx.allreduce("grad", g, ReduceOp.AVERAGE);
            for (int j = 0; j <= DIM; j++) {
                w[j] -= lr * g[j];
            }
            if (step == 0) {
                first = g[DIM + 1];
            }
            last = g[DIM + 1];
            if (rank == 0 && (step % 10 == 0 || step == steps - 1)) {
                System.out.printf("step %3d  loss %.6f%n", step, g[DIM + 1]);
            }
        }

        float[] lo = w.clone();
        float[] hi = w.clone();
        cfx.allreduce("weights.min", lo, ReduceOp.MIN);
        cfx.allreduce("weights.max", hi, ReduceOp.MAX);
        boolean same = true;
        for (int j = 0; j <= DIM; j++) {
            int bits = Float.floatToRawIntBits(w[j]);
            same &= bits == Float.floatToRawIntBits(lo[j]) && bits == Float.floatToRawIntBits(hi[j]);
        }
        int[] ok = {same ? 1 : 0};
        cfx.allreduce("weights.same", ok, ReduceOp.MIN);
        boolean falling = last < first * 0.9;
        if (rank == 0) {
            System.out.printf("loss %.6f -> %.6f (%s); weights %s on all %d ranks%n", first, last,
                    falling ? "falling" : "NOT falling", ok[0] == 1 ? "bit-identical" : "DIFFER", cfx.size());
        }
        if (!same) {
            System.err.println("rank " + rank + ": weights differ from another rank's");
        }
        return falling && ok[0] == 1 ? 0 : 1;
    }

    static double sigmoid(double z) {
        return 1.0 / (1.0 + Math.exp(-z));
    }
}
