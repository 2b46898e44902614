/*
 * CrossLang.java - the Java side of the cross-language test (see crosslang.c): the same input and
 * collectives through org.conflux, run as a single-file program:
 *   java -cp conflux.jar CrossLang.java [gradset] OUT_PREFIX
 * (gradset: the mixed job's gradient set, see crosslang.c; registered here in canonical order
 * rotated by 1 + rank, ready in the order k = 3, 2, ...)
 */
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import org.conflux.Conflux;
import org.conflux.DType;
import org.conflux.GradientSet;
import org.conflux.ReduceOp;

public final class CrossLang {
    static final int N = 1000;

    static final String[] XG_NAME = {"xg.w", "xg.b", "xg.n", "xg.v"};
    static final DType[] XG_DTYPE = {DType.FLOAT32, DType.FLOAT64, DType.INT32, DType.FLOAT32};
    static final long[][] XG_SHAPE = {{3, 4}, {5}, {6}, {2, 3, 2}};
    static final int[] XG_COUNT = {12, 5, 6, 12};

    static void gradset(String prefix) throws IOException {
        try (Conflux cfx = Conflux.init()) {
            int rank = cfx.rank();
            int size = cfx.size();
            int ranksum = size * (size + 1) / 2;
            int[] index = new int[4];
            ByteBuffer[] buf = new ByteBuffer[4];
            ByteBuffer out = ByteBuffer.allocate(3 * 160).order(ByteOrder.nativeOrder());
            try (GradientSet gs = new GradientSet(cfx, "xl.gs",
                    new GradientSet.Options().op(ReduceOp.SUM).bucketBytes(64))) {
                for (int j = 0; j < 4; j++) {
                    int k = (j + 1 + rank) % 4;
                    index[k] = gs.add(XG_NAME[k], XG_SHAPE[k], XG_DTYPE[k]);
                }
                gs.commit();
                for (int k = 0; k < 4; k++) {
                    buf[k] = gs.buffer(index[k]).order(ByteOrder.nativeOrder());
                }
                for (int s = 0; s < 3; s++) {
                    for (int k = 0; k < 4; k++) {
                        for (int i = 0; i < XG_COUNT[k]; i++) {
                            int v = (rank + 1) * (k + 1) + 3 * i + 7 * s - 20;
                            switch (XG_DTYPE[k]) {
                                case FLOAT32 -> buf[k].putFloat(4 * i, v / 4.0f);
                                case FLOAT64 -> buf[k].putDouble(8 * i, v / 4.0);
                                default -> buf[k].putInt(4 * i, v);
                            }
                        }
                    }
                    for (int k = 3; k >= 0; k--) {
                        if (k != s) {
                            gs.ready(index[k]);
                        }
                    }
                    gs.await(60.0);
                    for (int k = 0; k < 4; k++) {
                        for (int i = 0; i < XG_COUNT[k]; i++) {
                            int want = ranksum * (k + 1) + size * (3 * i + 7 * s - 20);
                            double got = switch (XG_DTYPE[k]) {
                                case FLOAT32 -> buf[k].getFloat(4 * i) * 4.0;
                                case FLOAT64 -> buf[k].getDouble(8 * i) * 4.0;
                                default -> buf[k].getInt(4 * i);
                            };
                            if (got != want) {
                                throw new AssertionError("CrossLang: rank " + rank + " step " + s + " "
                                        + XG_NAME[k] + "[" + i + "] = " + got + " (x4 for floats), expected " + want);
                            }
                        }
                        ByteBuffer b = buf[k].duplicate();
                        b.clear().limit(XG_COUNT[k] * XG_DTYPE[k].size);
                        out.put(b);
                    }
                }
            }
            out.flip();
            try (FileChannel ch = FileChannel.open(Paths.get(prefix + "." + rank + ".bin"),
                    StandardOpenOption.CREATE, StandardOpenOption.WRITE, StandardOpenOption.TRUNCATE_EXISTING)) {
                ch.write(out);
            }
        }
    }

    public static void main(String[] args) throws IOException {
        if (args.length == 2 && args[0].equals("gradset")) {
            gradset(args[1]);
            return;
        }
        try (Conflux cfx = Conflux.init()) {
            int rank = cfx.rank();
            float[] x = new float[N];
            for (int i = 0; i < N; i++) {
                x[i] = (float) StrictMath.sin(i * 0.1 + rank);
            }
            float[] sum = cfx.allreduce("xl.sum", x.clone(), ReduceOp.SUM);       // array path (copy)
            ByteBuffer bb = ByteBuffer.allocateDirect(4 * N).order(ByteOrder.nativeOrder());
            FloatBuffer avg = bb.asFloatBuffer().put(x).flip();
            cfx.allreduce("xl.avg", avg, ReduceOp.AVERAGE);                      // direct buffer path
            ByteBuffer out = ByteBuffer.allocate(3 * 4 * N).order(ByteOrder.nativeOrder());
            out.asFloatBuffer().put(x).put(sum).put(avg);
            try (FileChannel ch = FileChannel.open(Paths.get(args[0] + "." + rank + ".bin"),
                    StandardOpenOption.CREATE, StandardOpenOption.WRITE, StandardOpenOption.TRUNCATE_EXISTING)) {
                ch.write(out);
            }
        }
    }
}
