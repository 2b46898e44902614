package org.conflux;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * Conflux.subset: membership and numbering, collectives on subsets that overlap and leave ranks
 * out (at the same time), repeated creation, bad lists; results checked against each member's
 * known contribution (TestContext.value), summed here. Every method is collective.
 */
@TestMethodOrder(MethodOrderer.MethodName.class)
class ContextSubsetTest extends OnSharedContext {

    /** 0 .. n-1 without `skip`. */
    static int[] allBut(int skip) {
        int[] out = new int[size - 1];
        for (int r = 0, k = 0; r < size; r++) {
            if (r != skip) {
                out[k++] = r;
            }
        }
        return out;
    }

    static int indexOf(int[] ranks, int r) {
        for (int i = 0; i < ranks.length; i++) {
            if (ranks[i] == r) {
                return i;
            }
        }
        return -1;
    }

    static double sumOver(int[] members, int i) {
        double s = 0;
        for (int r : members) {
            s += TestContext.value(r, i);
        }
        return s;
    }

    @Test
    void a01_membersGetANumberedContextOthersNull() {
        int[] evens = new int[(size + 1) / 2];
        for (int k = 0; k < evens.length; k++) {
            evens[k] = 2 * (evens.length - 1 - k); // listed in descending order: any order works
        }
        try (Conflux sub = cfx.subset(evens)) {
            if (rank % 2 == 1) {
                assertNull(sub);
                return;
            }
            assertNotNull(sub);
            assertEquals(rank / 2, sub.rank());
            assertEquals(evens.length, sub.size());
            double[] x = new double[17];
            for (int i = 0; i < x.length; i++) {
                x[i] = TestContext.value(rank, i);
            }
            sub.allreduce("sub.evens", x, ReduceOp.SUM);
            for (int i = 0; i < x.length; i++) {
                assertEquals(sumOver(evens, i), x[i], "element " + i);
            }
            float[] g = sub.allgather(null, new float[] {rank, rank});
            float[] want = new float[2 * evens.length];
            for (int k = 0; k < evens.length; k++) {
                want[2 * k] = want[2 * k + 1] = 2 * k; // in the order of the members' ranks
            }
            assertArrayEquals(want, g);
            long[] b = {rank};
            sub.broadcast("sub.bcast", b, evens.length - 1); // the subset's last rank
            assertEquals(2L * (evens.length - 1), b[0]);
        }
    }

    @Test
    void a02_overlappingSubsetsAtTheSameTime() {
        int[][] lists = {allBut(size - 1), allBut(0)};
        List<Conflux> subs = new ArrayList<>();
        for (int[] l : lists) {
            subs.add(cfx.subset(l));
        }
        try {
            List<Handle<double[]>> handles = new ArrayList<>();
            List<int[]> of = new ArrayList<>();
            for (int k = 0; k < lists.length; k++) {
                Conflux sub = subs.get(k);
                assertEquals(indexOf(lists[k], rank) >= 0, sub != null);
                if (sub != null) {
                    assertEquals(indexOf(lists[k], rank), sub.rank());
                    double[] x = new double[9];
                    for (int i = 0; i < x.length; i++) {
                        x[i] = TestContext.value(rank, i);
                    }
                    handles.add(sub.allreduceAsync("sub.both", x, ReduceOp.SUM));
                    of.add(lists[k]);
                }
            }
            double[] all = {rank};
            cfx.allreduce("sub.global", all, ReduceOp.SUM);
            assertEquals(size * (size - 1) / 2.0, all[0]);
            for (int k = handles.size() - 1; k >= 0; k--) {
                double[] r = handles.get(k).await();
                for (int i = 0; i < r.length; i++) {
                    assertEquals(sumOver(of.get(k), i), r[i], "element " + i);
                }
            }
        } finally {
            for (Conflux s : subs) {
                if (s != null) {
                    s.close();
                }
            }
        }
    }

    @Test
    void a03_createdAndClosedRepeatedly() {
        for (int round = 0; round < 5; round++) {
            int[] members = allBut(round % size);
            try (Conflux sub = cfx.subset(members)) {
                assertEquals(round % size == rank, sub == null);
                if (sub != null) {
                    int[] x = {rank + 1};
                    sub.allreduce("sub.again", x, ReduceOp.SUM);
                    int want = 0;
                    for (int r : members) {
                        want += r + 1;
                    }
                    assertEquals(want, x[0], "round " + round);
                }
            }
        }
    }

    @Test
    void a04_badListsFailOnEveryRank() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> cfx.subset(0, size + 5));
        assertTrue(e.getMessage().contains(String.valueOf(size + 5)), e.getMessage());
        assertThrows(IllegalArgumentException.class, () -> cfx.subset(0, 0));
        assertThrows(IllegalArgumentException.class, () -> cfx.subset());
        assertThrows(IllegalArgumentException.class, () -> cfx.subset((int[]) null));
        double[] x = {1};
        cfx.allreduce("sub.after.bad", x, ReduceOp.SUM); // the context goes on
        assertEquals(size, x[0]);
    }

    @Test
    void a05_closedSubsetThrows() {
        Conflux sub = cfx.subset(allBut(size - 1));
        if (sub != null) {
            sub.close();
            assertThrows(IllegalStateException.class, () -> sub.allreduce("x", new float[1], ReduceOp.SUM));
        }
        cfx.barrier();
    }
}
