/*
 * SparkLinearRegression.java - a JVM trainer inside a Spark barrier stage: linear regression by
 * SGD in plain Java arrays, one data shard per task, the gradients averaged through an
 * org.conflux.GradientSet and the initial weights broadcast from rank 0 (docs/spark.md).
 *
 * Each task of the stage (RDD.barrier().mapPartitions) is a rank: its rank and the stage's size
 * come from BarrierTaskContext, rank 0's task serves the rendezvous store (TcpStore.serve) and
 * BarrierTaskContext.allGather tells the others its port; every task then joins with
 * Conflux.initGroup. Run it with spark-submit, shipping the binding like any dependency:
 *
 *   spark-submit --master spark://HOST:7077 --conf spark.executor.cores=1 \
 *       --jars build/java/conflux.jar --files build/java/libconflux_jni.so,build/capi/libconflux.so.1 \
 *       --conf spark.executor.extraLibraryPath=. \
 *       --class SparkLinearRegression build/java/conflux_spark_examples.jar --tasks 4
 *
 * (or --jars with the Maven jar alone, which carries the native libraries). The driver prints one
 * line per rank, in rank order: "rank R of N on HOST: weights W (hex) loss L0 -> L1". With
 * --local N the same steps run in this one process over the N shards (no Spark, no Conflux):
 * "local N shards: weights W"; the test compares the two bit for bit.
 *
 * Bitwise equality across a different order of summation: each shard's gradient is rounded to a
 * multiple of 2^-30 before it is summed, so every partial sum of up to 2^22 of them is exact in a
 * double and the sum does not depend on the order the engine adds them in.
 */
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;
import java.util.stream.Collectors;
import java.util.stream.IntStream;

import org.apache.spark.BarrierTaskContext;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.rdd.RDD;
import org.conflux.Conflux;
import org.conflux.DType;
import org.conflux.GradientSet;
import org.conflux.ReduceOp;
import org.conflux.TcpStore;

import scala.collection.Iterator;
import scala.jdk.javaapi.CollectionConverters;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractFunction1;

public final class SparkLinearRegression {
    static final int FEATURES = 4;
    static final int SAMPLES_PER_SHARD = 64;
    static final double LEARNING_RATE = 0.1;
    static final double QUANTUM = 0x1p-30;
    static final double[] TRUE_WEIGHTS = {0.5, -1.25, 2.0, 0.75};
    static final double TRUE_BIAS = 0.3;

    /** Shard `shard`'s samples: x in [-1, 1]^FEATURES, y a noisy linear function of x. */
    static double[][] shard(int shard, double[] y) {
        SplittableRandom rng = new SplittableRandom(1000 + shard);
        double[][] x = new double[SAMPLES_PER_SHARD][FEATURES];
        for (int n = 0; n < SAMPLES_PER_SHARD; n++) {
            double t = TRUE_BIAS;
            for (int j = 0; j < FEATURES; j++) {
                x[n][j] = rng.nextDouble(-1.0, 1.0);
                t += TRUE_WEIGHTS[j] * x[n][j];
            }
            y[n] = t + 0.01 * rng.nextDouble(-1.0, 1.0);
        }
        return x;
    }

    /** The initial weights (rank 0 draws them; the others get them by broadcast). */
    static double[] initialWeights() {
        SplittableRandom rng = new SplittableRandom(7);
        double[] w = new double[FEATURES + 1];
        for (int j = 0; j < w.length; j++) {
            w[j] = rng.nextDouble(-1.0, 1.0);
        }
        return w;
    }

    /**
     * This shard's gradient of the mean squared error at weights w (bias last) into g, each
     * element rounded to a multiple of QUANTUM; returns the shard's loss.
     */
    static double gradient(double[][] x, double[] y, double[] w, double[] g) {
        java.util.Arrays.fill(g, 0.0);
        double loss = 0;
        for (int n = 0; n < x.length; n++) {
            double err = w[FEATURES] - y[n];
            for (int j = 0; j < FEATURES; j++) {
                err += w[j] * x[n][j];
            }
            loss += err * err;
            for (int j = 0; j < FEATURES; j++) {
                g[j] += 2 * err * x[n][j];
            }
            g[FEATURES] += 2 * err;
        }
        for (int j = 0; j < g.length; j++) {
            g[j] = Math.rint(g[j] / x.length / QUANTUM) * QUANTUM;
        }
        return loss / x.length;
    }

    static String hex(double[] w) {
        return java.util.Arrays.stream(w).mapToObj(Double::toHexString).collect(Collectors.joining(","));
    }

    /** One barrier task: rank, size and the store's address from BarrierTaskContext, then SGD. */
    static final class Train extends AbstractFunction1<Iterator<Integer>, Iterator<String>>
            implements Serializable {
        private static final long serialVersionUID = 1L;
        private final int steps;

        Train(int steps) {
            this.steps = steps;
        }

        @Override
        public Iterator<String> apply(Iterator<Integer> partition) {
            BarrierTaskContext ctx = BarrierTaskContext.get();
            int rank = ctx.partitionId();
            int size = ctx.getTaskInfos().length;
            String address = ctx.getTaskInfos()[0].address();           // rank 0's executor, host:port
            String host0 = address.substring(0, address.lastIndexOf(':'));
            String line;
            try (TcpStore.Server server = rank == 0 ? TcpStore.serve(0) : null) {
                String[] ports = ctx.allGather(server != null ? Integer.toString(server.port()) : "");
                try (TcpStore store = new TcpStore(host0, Integer.parseInt(ports[0]));
                     Conflux cfx = Conflux.initGroup(store, rank, size)) {
                    line = train(cfx, ctx.getTaskInfos()[rank].address());
                }
                ctx.barrier();  // every rank closed its context before rank 0 stops serving
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
            return CollectionConverters.asScala(List.of(line).iterator());
        }

        private String train(Conflux cfx, String where) {
            double[] y = new double[SAMPLES_PER_SHARD];
            double[][] x = shard(cfx.rank(), y);
            double[] w = cfx.rank() == 0 ? initialWeights() : new double[FEATURES + 1];
            cfx.broadcast("init.weights", w, 0);
            double[] g = new double[FEATURES + 1];
            double first = 0;
            double last = 0;
            try (GradientSet gs = new GradientSet(cfx, "linear",
                    new GradientSet.Options().op(ReduceOp.SUM))) {
                int wi = gs.add("weight", new long[] {FEATURES}, DType.FLOAT64);
                int bi = gs.add("bias", new long[] {1}, DType.FLOAT64);
                gs.commit();
                DoubleBuffer gw = gs.buffer(wi).order(ByteOrder.nativeOrder()).asDoubleBuffer();
                DoubleBuffer gb = gs.buffer(bi).order(ByteOrder.nativeOrder()).asDoubleBuffer();
                for (int step = 0; step < steps; step++) {
                    double loss = gradient(x, y, w, g);
                    gw.put(0, g, 0, FEATURES);
                    gs.ready(wi);
                    gb.put(0, g[FEATURES]);
                    gs.ready(bi);
                    gs.await();                      // the sums over every rank's shard
                    for (int j = 0; j < FEATURES; j++) {
                        w[j] -= LEARNING_RATE * (gw.get(j) / cfx.size());
                    }
                    w[FEATURES] -= LEARNING_RATE * (gb.get(0) / cfx.size());
                    double[] l = {loss};
                    cfx.allreduce("loss", l, ReduceOp.AVERAGE);
                    if (step == 0) {
                        first = l[0];
                    }
                    last = l[0];
                }
            }
            return String.format("rank %d of %d on %s: weights %s loss %.6g -> %.6g", cfx.rank(),
                    cfx.size(), where, hex(w), first, last);
        }
    }

    /** The same steps in one process over `shards` shards (the reference). */
    static double[] local(int shards, int steps) {
        double[][] ys = new double[shards][SAMPLES_PER_SHARD];
        double[][][] xs = new double[shards][][];
        for (int s = 0; s < shards; s++) {
            xs[s] = shard(s, ys[s]);
        }
        double[] w = initialWeights();
        double[] g = new double[FEATURES + 1];
        for (int step = 0; step < steps; step++) {
            double[] sum = new double[FEATURES + 1];
            for (int s = 0; s < shards; s++) {
                gradient(xs[s], ys[s], w, g);
                for (int j = 0; j < sum.length; j++) {
                    sum[j] += g[j];
                }
            }
            for (int j = 0; j < w.length; j++) {
                w[j] -= LEARNING_RATE * (sum[j] / shards);
            }
        }
        return w;
    }

    public static void main(String[] args) {
        int tasks = 2;
        int steps = 40;
        Integer localShards = null;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--tasks" -> tasks = Integer.parseInt(args[++i]);
                case "--steps" -> steps = Integer.parseInt(args[++i]);
                case "--local" -> localShards = Integer.parseInt(args[++i]);
                default -> throw new IllegalArgumentException("unknown argument " + args[i]
                        + " (--tasks N, --steps S, --local N)");
            }
        }
        if (localShards != null) {
            System.out.println("local " + localShards + " shards: weights " + hex(local(localShards, steps)));
            return;
        }
        SparkConf conf = new SparkConf().setAppName("conflux SparkLinearRegression");
        try (JavaSparkContext jsc = new JavaSparkContext(conf)) {
            List<Integer> shards = IntStream.range(0, tasks).boxed().collect(Collectors.toList());
            RDD<Integer> rdd = jsc.parallelize(shards, tasks).rdd();
            RDD<String> out = rdd.barrier().mapPartitions(new Train(steps), false,
                    ClassTag$.MODULE$.apply(String.class));
            List<String> lines = new ArrayList<>(out.toJavaRDD().collect());  // partition (rank) order
            lines.forEach(System.out::println);
        }
    }
}
