package org.example;

import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.Optional;
import org.conflux.Conflux;
import org.conflux.ReduceOp;

/**
 * A project that only depends on org.conflux:conflux. Run under mpirun with the job size as its
 * argument: every rank contributes (rank + 1) * (i + 1) at element i, and the allreduce must give
 * the sum over the ranks, computed here from that formula. Prints where the JNI library was mapped
 * from (/proc/self/maps), so that a caller can tell an extracted copy from an installed one.
 */
public final class Consumer {
    private Consumer() {
    }

    public static void main(String[] args) throws Exception {
        int want = Integer.parseInt(args[0]);
        try (Conflux cfx = Conflux.init(new Conflux.Options())) {
            int rank = cfx.rank();
            int size = cfx.size();
            if (size != want) {
                throw new AssertionError("rank " + rank + " sees a job of " + size + " ranks, not " + want);
            }
            double[] x = new double[1000];
            for (int i = 0; i < x.length; i++) {
                x[i] = (rank + 1) * (i + 1);
            }
            cfx.allreduce("packaging.check", x, ReduceOp.SUM);
            double ranksSum = size * (size + 1) / 2.0;
            for (int i = 0; i < x.length; i++) {
                if (x[i] != ranksSum * (i + 1)) {
                    throw new AssertionError("rank " + rank + ": element " + i + " is " + x[i]
                            + ", the ranks' sum is " + ranksSum * (i + 1));
                }
            }
            Optional<String> jni = Files.readAllLines(Paths.get("/proc/self/maps")).stream()
                    .filter(l -> l.contains("libconflux_jni.so")).map(l -> l.substring(l.indexOf('/')))
                    .findFirst();
            System.out.println("rank " + rank + " of " + size + ": allreduce ok, conflux " + Conflux.version()
                    + ", JNI library " + jni.orElse("(not mapped)"));
        }
    }
}
