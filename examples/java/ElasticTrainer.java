/*
 * ElasticTrainer.java - an elastic trainer over Conflux: it goes on when a worker is lost.
 *
 * Logistic regression with SGD over EPOCHS x BATCHES global batches of ROWS rows each, generated
 * from (epoch, batch) seeds (splitmix64, so Lua's example and the test's reference draw the same
 * numbers). Each rank takes the rows i with i % size == rank and adds its share of the batch's mean
 * gradient; one allreduce SUM gives the full mean. So the weights depend only on which batches were
 * applied, never on the world's size.
 *
 * The state (epoch, next batch, weights) is committed in memory every COMMIT_EVERY batches. When a
 * collective fails because the world changed (a peer lost: ConfluxException.worldChanged()), every
 * survivor rolls back to its last commit, forms the world again (Conflux.reform), and syncs: the
 * newest commit among the members (an allreduce MAX of the commit counts) is broadcast from the
 * lowest rank holding it, so a newcomer never overwrites the survivors. Training then goes on.
 * Newcomers (a host the driver's discovery script added) are let in at a commit: when any rank sees
 * one waiting (Conflux.membershipPending, agreed by an allreduce MAX), all re-form together and
 * sync, the newcomer receiving the state.
 *
 *   cfxrun --elastic -np 3 --min-np 2 -H localhost:2,127.0.0.1:1 \
 *       java -cp build/java/conflux.jar:build/java/conflux_examples.jar ElasticTrainer
 *
 * Knobs (environment): ELASTIC_KILL="rank:epoch:batch": that rank of the first world SIGKILLs
 * itself at the start of that batch (writing the time to $ELASTIC_OUT.lost first);
 * ELASTIC_GROW="hosts-file:line": in the first world rank 0 appends `line` to the discovery
 * script's hosts file at epoch 1, batch 0, and at the commit after batch 1 the ranks wait (up to
 * 120 s, agreeing every 0.2 s) for the newcomer the driver starts there (training would otherwise
 * end before a JVM starts); ELASTIC_OUT: each rank that finishes writes its result to
 * $ELASTIC_OUT.<member id> (size, round, the time it trained again after the last loss, the
 * weights). Exits 1 when the job cannot go on (fewer than the
 * minimum) or the ranks' final weights differ.
 */
import java.io.IOException;
import java.io.PrintWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import org.conflux.Conflux;
import org.conflux.ConfluxException;
import org.conflux.ReduceOp;

public final class ElasticTrainer {
    static final int EPOCHS = 3;
    static final int BATCHES = 8;
    static final int ROWS = 12;
    static final int DIM = 4;
    static final double LR = 0.5;
    static final int COMMIT_EVERY = 2;
    /** The rule behind the labels: y = 1 when x . TRUE_W + NOISE * e > 0 (e uniform in -1..1). */
    static final double[] TRUE_W = {1, -2, 3, -4};
    static final double NOISE = 0.5;

    private ElasticTrainer() {
    }

    /** What training carries from batch to batch, and what a commit saves. */
    static final class State {
        int epoch;
        int batch;          // the next batch to run
        long commits;       // how many commits led here: the newest state has the most
        double[] w = new double[DIM + 1];  // weights, then the bias

        State copy() {
            State s = new State();
            s.epoch = epoch;
            s.batch = batch;
            s.commits = commits;
            s.w = w.clone();
            return s;
        }

        double[] pack() {
            double[] p = new double[DIM + 4];
            p[0] = epoch;
            p[1] = batch;
            p[2] = commits;
            System.arraycopy(w, 0, p, 3, DIM + 1);
            return p;
        }

        void unpack(double[] p) {
            epoch = (int) p[0];
            batch = (int) p[1];
            commits = (long) p[2];
            System.arraycopy(p, 3, w, 0, DIM + 1);
        }
    }

    /** splitmix64: the same stream in Java, Lua and the test's Python. */
    static final class Rng {
        private long s;

        Rng(long seed) {
            s = seed;
        }

        /** A uniform double in [0, 1) with 53 random bits: exact in every language. */
        double next() {
            s += 0x9E3779B97F4A7C15L;
            long z = s;
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            z ^= z >>> 31;
            return (z >>> 11) * 0x1.0p-53;
        }
    }

    /** Global batch (epoch, b): ROWS rows of DIM features in x, their labels in y. */
    static void batch(int epoch, int b, double[][] x, double[] y) {
        Rng r = new Rng(1000L * epoch + b);
        for (int i = 0; i < ROWS; i++) {
            double z = 0;
            for (int j = 0; j < DIM; j++) {
                x[i][j] = 2 * r.next() - 1;
                z += x[i][j] * TRUE_W[j];
            }
            z += NOISE * (2 * r.next() - 1);
            y[i] = z > 0 ? 1 : 0;
        }
    }

    static final String[] KILL = System.getenv().getOrDefault("ELASTIC_KILL", "").split(":");
    static final String[] GROW = System.getenv().getOrDefault("ELASTIC_GROW", "").split(":", 2);
    static final String OUT = System.getenv("ELASTIC_OUT");

    public static void main(String[] args) throws IOException, InterruptedException {
        Conflux cfx = Conflux.elasticInit();  // min/max size and deadlines from cfxrun --elastic
        State live = new State();
        State committed = live.copy();
        long resumedAt = 0;
        while (true) {
            try {
                sync(cfx, live);
                committed = live.copy();
                train(cfx, live, committed);
                break;
            } catch (ConfluxException e) {
                if (!e.worldChanged()) {
                    throw e;
                }
                // Roll back to the last commit and form the world again; below the minimum this
                // throws a MembershipChangedException naming who is missing, and the job ends.
                System.err.printf("member %d: %s: %s; back to epoch %d batch %d%n", cfx.memberId(),
                        e.status(), e.getMessage(), committed.epoch, committed.batch);
                live = committed.copy();
                cfx.reform();
                resumedAt = System.currentTimeMillis();
                System.err.printf("member %d: round %d, rank %d of %d%n", cfx.memberId(),
                        cfx.membershipRound(), cfx.rank(), cfx.size());
            }
        }
        int status = finish(cfx, live, resumedAt);
        cfx.close();
        System.exit(status);
    }

    /** Every member takes the newest commit among them, from the lowest rank that holds it. */
    static void sync(Conflux cfx, State live) {
        long[] newest = {live.commits};
        cfx.allreduce("sync.commits", newest, ReduceOp.MAX);
        int[] root = {live.commits == newest[0] ? cfx.rank() : cfx.size()};
        cfx.allreduce("sync.root", root, ReduceOp.MIN);
        double[] packed = cfx.broadcast("sync.state", live.pack(), root[0]);
        live.unpack(packed);
    }

    /** Runs the remaining batches; commits into {@code committed} every COMMIT_EVERY batches. */
    static void train(Conflux cfx, State live, State committed) throws IOException, InterruptedException {
        double[][] x = new double[ROWS][DIM];
        double[] y = new double[ROWS];
        for (; live.epoch < EPOCHS; live.epoch++, live.batch = 0) {
            while (live.batch < BATCHES) {
                maybeDie(cfx, live.epoch, live.batch);
                maybeAddHost(cfx, live.epoch, live.batch);
                batch(live.epoch, live.batch, x, y);
                double[] g = new double[DIM + 1];
                for (int i = cfx.rank(); i < ROWS; i += cfx.size()) {
                    double z = live.w[DIM];
                    for (int j = 0; j < DIM; j++) {
                        z += live.w[j] * x[i][j];
                    }
                    double err = 1.0 / (1.0 + Math.exp(-z)) - y[i];
                    for (int j = 0; j < DIM; j++) {
                        g[j] += err * x[i][j] / ROWS;
                    }
                    g[DIM] += err / ROWS;
                }
                cfx.allreduce("grad", g, ReduceOp.SUM);
                for (int j = 0; j <= DIM; j++) {
                    live.w[j] -= LR * g[j];
                }
                live.batch++;
                if (live.batch % COMMIT_EVERY == 0) {
                    live.commits++;
                    copyInto(live, committed);  // (epoch, BATCHES) restores to the next epoch's start
                    if (newcomersWaiting(cfx, live)) {
                        cfx.reform();  // every rank together: the newcomers join this round
                        System.err.printf("member %d: newcomers let in: round %d, rank %d of %d%n",
                                cfx.memberId(), cfx.membershipRound(), cfx.rank(), cfx.size());
                        sync(cfx, live);  // they get the state just committed
                    }
                }
            }
        }
    }

    static void copyInto(State from, State to) {
        to.epoch = from.epoch;
        to.batch = from.batch;
        to.commits = from.commits;
        to.w = from.w.clone();
    }

    /**
     * Whether newcomers wait to join: what any rank saw, so all ranks decide alike. With the
     * ELASTIC_GROW knob the ranks wait for theirs at the commit after epoch 1, batch 1.
     */
    static boolean newcomersWaiting(Conflux cfx, State live) throws InterruptedException {
        boolean pace = GROW.length == 2 && cfx.membershipRound() == 1 && live.epoch == 1 && live.batch == 2;
        long deadline = System.nanoTime() + 120_000_000_000L;
        while (true) {
            int[] seen = {cfx.membershipPending()};
            cfx.allreduce("commit.newcomers", seen, ReduceOp.MAX);
            if (seen[0] > 0 || !pace || System.nanoTime() > deadline) {
                return seen[0] > 0;
            }
            Thread.sleep(200);
        }
    }

    /** The test's new host: ELASTIC_GROW's line goes into the hosts file, once, from rank 0. */
    static void maybeAddHost(Conflux cfx, int epoch, int b) throws IOException {
        if (GROW.length == 2 && cfx.membershipRound() == 1 && cfx.rank() == 0 && epoch == 1 && b == 0) {
            Files.write(Paths.get(GROW[0]), (GROW[1] + "\n").getBytes(StandardCharsets.UTF_8),
                    StandardOpenOption.APPEND);
        }
    }

    /** The test's failure: ELASTIC_KILL's rank SIGKILLs itself at its batch, in the first world only. */
    static void maybeDie(Conflux cfx, int epoch, int b) throws IOException, InterruptedException {
        if (KILL.length != 3 || cfx.membershipRound() != 1 || cfx.rank() != Integer.parseInt(KILL[0])
                || epoch != Integer.parseInt(KILL[1]) || b != Integer.parseInt(KILL[2])) {
            return;
        }
        if (OUT != null) {
            Files.write(Paths.get(OUT + ".lost"),
                    Long.toString(System.currentTimeMillis()).getBytes(StandardCharsets.UTF_8));
        }
        System.err.printf("member %d: killing myself (SIGKILL) at epoch %d batch %d%n", cfx.memberId(), epoch, b);
        new ProcessBuilder("kill", "-KILL", Long.toString(ProcessHandle.current().pid())).inheritIO().start().waitFor();
        Thread.sleep(60_000);  // the signal ends the process before this does
    }

    /** Checks that every rank holds the same weights; writes this rank's result for the test. */
    static int finish(Conflux cfx, State live, long resumedAt) throws IOException {
        double[] lo = cfx.allreduce("final.min", live.w.clone(), ReduceOp.MIN);
        double[] hi = cfx.allreduce("final.max", live.w.clone(), ReduceOp.MAX);
        boolean same = Arrays.equals(lo, live.w) && Arrays.equals(hi, live.w);
        if (OUT != null) {
            try (PrintWriter p = new PrintWriter(Files.newBufferedWriter(Paths.get(OUT + "." + cfx.memberId())))) {
                p.printf("size %d%nround %d%nresumed %d%nweights", cfx.size(), cfx.membershipRound(), resumedAt);
                for (double v : live.w) {
                    p.print(" " + v);  // Double.toString: the shortest text that reads back exactly
                }
                p.println();
            }
        }
        if (cfx.rank() == 0) {
            System.out.printf("trained %d epochs on %d ranks (round %d); weights %s%n", EPOCHS, cfx.size(),
                    cfx.membershipRound(), same ? "identical on every rank" : "DIFFER between ranks");
        }
        return same ? 0 : 1;
    }
}
