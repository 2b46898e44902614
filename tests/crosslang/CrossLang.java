/*
 * CrossLang.java - the Java side of the cross-language test (see crosslang.c): the same input and
 * collectives through org.conflux, run as a single-file program:
 *   java -cp conflux.jar CrossLang.java OUT_PREFIX
 */
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import org.conflux.Conflux;
import org.conflux.ReduceOp;

public final class CrossLang {
    static final int N = 1000;

    public static void main(String[] args) throws IOException {
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
