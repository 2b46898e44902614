package org.conflux;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * A set of gradients registered once and reduced together every step (the C ABI's cfx_gradset).
 *
 * <pre>{@code
 * try (GradientSet gs = new GradientSet(cfx, "model", new GradientSet.Options())) {
 *     int w = gs.add("fc.weight", new long[] {256, 128}, DType.FLOAT32);  // this rank's order
 *     int b = gs.add("fc.bias", new long[] {128}, DType.FLOAT32);
 *     gs.commit();                               // collective: names, dtypes, shapes checked
 *     FloatBuffer wb = gs.buffer(w).asFloatBuffer();   // the gradient's storage, zeroed
 *     for (...) { ...; gs.ready(w); gs.ready(b); gs.await(); }  // results in place
 * }
 * }</pre>
 *
 * <p>The storage is Conflux's own (shared tensor memory laid out by bucket), so every step takes
 * the direct path without copies; {@link #buffer(int)} gives a direct buffer over it after
 * {@link #commit()}. Those buffers must not be used after {@link #close()}. {@code ready} may be
 * called from any thread; the other methods belong to one thread at a time. Engine failures are
 * {@link ConfluxException}s (a {@link MismatchException} at commit names the gradient), bad local
 * arguments {@link IllegalArgumentException}s, a closed set or context
 * {@link IllegalStateException}s.
 */
public final class GradientSet implements AutoCloseable {
    /** Options of a gradient set; the defaults are the C ABI's. */
    public static final class Options {
        ReduceOp op = ReduceOp.AVERAGE;
        long bucketBytes = 0;
        int accumulateSteps = 1;
        double prescale = 1.0;
        double postscale = 1.0;
        Compression compression = Compression.NONE;
        boolean errorFeedback = false;

        /** The reduction (default AVERAGE). */
        public Options op(ReduceOp op) {
            if (op == null) {
                throw new IllegalArgumentException("GradientSet.Options.op: null");
            }
            this.op = op;
            return this;
        }

        /** Bucket size in bytes (default 0: chosen by Conflux, CFX_GRADSET_BUCKET_BYTES). */
        public Options bucketBytes(long bytes) {
            this.bucketBytes = bytes;
            return this;
        }

        /** Local passes the caller sums into the buffers before one reduction (default 1). */
        public Options accumulateSteps(int steps) {
            this.accumulateSteps = steps;
            return this;
        }

        /** Applied to each rank's gradients before the reduction (default 1). */
        public Options prescale(double factor) {
            this.prescale = factor;
            return this;
        }

        /** Applied to the result (default 1; AVERAGE divides by the size as well). */
        public Options postscale(double factor) {
            this.postscale = factor;
            return this;
        }

        /**
         * How the buckets travel (default NONE; docs/c-api.md "Compression"): float32 and float64
         * gradients only, the same on every rank (a {@link MismatchException} at commit otherwise).
         */
        public Options compression(Compression c) {
            if (c == null) {
                throw new IllegalArgumentException("GradientSet.Options.compression: null");
            }
            this.compression = c;
            return this;
        }

        /**
         * Error feedback (default off; needs a compression): each rank keeps what the rounding took
         * from the values it packed and adds it to the next step's, so small gradients still move
         * the parameters over the steps. Buckets then go out one by one.
         */
        public Options errorFeedback(boolean on) {
            this.errorFeedback = on;
            return this;
        }
    }

    private final Conflux cfx;
    private final String name;
    private long set;  // the cfx_gradset, 0 once closed
    private boolean committed;
    private final Map<String, Integer> indexOf = new HashMap<>();
    private final List<Long> bytesOf = new ArrayList<>();  // per index
    private final List<ByteBuffer> buffers = new ArrayList<>();

    /** Creates an empty set on {@code cfx} (not collective); every rank uses the same name. */
    public GradientSet(Conflux cfx, String name, Options options) {
        if (cfx == null || name == null || options == null) {
            throw new IllegalArgumentException("GradientSet: the context, name and options must not be null");
        }
        this.cfx = cfx;
        this.name = name;
        long s = ConfluxNative.cfxj_gradset_create(cfx.ptr(), name, options.op.code, options.bucketBytes,
                options.accumulateSteps, options.prescale, options.postscale, 1, options.compression.code,
                options.errorFeedback ? 1 : 0);
        if (s == 0) {
            throw Conflux.lastError();
        }
        this.set = s;
    }

    /** The set's name. */
    public String name() {
        return name;
    }

    /** The number of gradients added. */
    public int size() {
        return bytesOf.size();
    }

    /**
     * Registers a gradient (before {@link #commit()}) and returns its index, this rank's order of
     * adds; ranks may add in different orders.
     */
    public int add(String gradient, long[] shape, DType dtype) {
        long s = live();
        if (gradient == null || shape == null || dtype == null) {
            throw new IllegalArgumentException("GradientSet.add: the name, shape and dtype must not be null");
        }
        if (committed) {
            throw new IllegalStateException("gradient set '" + name + "' is committed; add comes before commit");
        }
        long n = 1;
        for (long d : shape) {
            if (d < 0) {
                throw new IllegalArgumentException("gradient '" + gradient + "': negative dimension " + d);
            }
            n = Math.multiplyExact(n, d);
        }
        long bytes = Math.multiplyExact(n, (long) dtype.size);
        if (bytes > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("gradient '" + gradient + "': " + bytes
                    + " bytes is more than a ByteBuffer holds");
        }
        int index = ConfluxNative.cfxj_gradset_add(s, gradient, dtype.code, shape, 0);
        if (index < 0) {
            throw Conflux.lastError();
        }
        indexOf.put(gradient, index);
        while (bytesOf.size() <= index) {
            bytesOf.add(0L);
            buffers.add(null);
        }
        bytesOf.set(index, bytes);
        return index;
    }

    /** The index of a gradient by name. */
    public int indexOf(String gradient) {
        Integer i = indexOf.get(gradient);
        if (i == null) {
            throw new IllegalArgumentException("gradient set '" + name + "' has no gradient '" + gradient + "'");
        }
        return i;
    }

    /**
     * Collective: checks every rank's registration ({@link MismatchException} on every rank, naming
     * the first differing gradient, the ranks and both values) and plans the buckets; the storage
     * starts zeroed.
     */
    public void commit() {
        long s = live();
        check(ConfluxNative.cfxj_gradset_commit(s));
        committed = true;
    }

    /** The gradient's storage as a direct buffer in native byte order (after {@link #commit()}). */
    public ByteBuffer buffer(int index) {
        long s = live();
        checkIndex(index);
        if (!committed) {
            throw new IllegalStateException("gradient set '" + name + "' is not committed; its storage exists after commit");
        }
        ByteBuffer b = buffers.get(index);
        if (b == null) {
            long bytes = bytesOf.get(index);
            if (bytes == 0) {
                b = ByteBuffer.allocateDirect(0);
            } else {
                b = (ByteBuffer) ConfluxNative.cfxj_gradset_buffer(s, index, bytes);
                if (b == null) {
                    throw Conflux.lastError();
                }
            }
            b.order(ByteOrder.nativeOrder());
            buffers.set(index, b);
        }
        return b.duplicate().order(ByteOrder.nativeOrder());
    }

    /** The gradient was produced for this pass; any thread, any order. */
    public void ready(int index) {
        long s = live();
        checkIndex(index);
        check(ConfluxNative.cfxj_gradset_ready(s, index));
    }

    /** {@link #ready(int)} by name. */
    public void ready(String gradient) {
        ready(indexOf(gradient));
    }

    /** Ends the step: gradients never marked ready are reduced as they are; the results are in place. */
    public void await() {
        await(-1);
    }

    /**
     * {@link #await()} with a deadline; {@link TimeoutException} when it passes (the step stays
     * pending: call again).
     */
    public void await(double timeoutSeconds) {
        check(ConfluxNative.cfxj_gradset_wait(live(), timeoutSeconds));
    }

    /**
     * Frees the set and its storage on this rank (every rank must); idempotent. A set of a context
     * already closed is left alone (the context took it down).
     */
    @Override
    public void close() {
        long s = set;
        set = 0;
        buffers.clear();
        if (s != 0 && contextOpen()) {
            ConfluxNative.cfxj_gradset_free(s);
        }
    }

    @Override
    public String toString() {
        return "GradientSet('" + name + "', " + size() + " gradients"
                + (set == 0 ? ", closed)" : committed ? ", committed)" : ")");
    }

    private long live() {
        if (set == 0) {
            throw new IllegalStateException("gradient set '" + name + "' is closed");
        }
        cfx.ptr();  // IllegalStateException once the context is closed
        return set;
    }

    private boolean contextOpen() {
        try {
            cfx.ptr();
            return true;
        } catch (IllegalStateException closed) {
            return false;
        }
    }

    private void checkIndex(int index) {
        if (index < 0 || index >= bytesOf.size()) {
            throw new IllegalArgumentException("gradient set '" + name + "' has " + bytesOf.size()
                    + " gradients; index " + index + " is out of range");
        }
    }

    private static void check(int status) {
        if (status != cfx_status.CFX_OK) {
            throw ConfluxException.of(status, ConfluxNative.cfx_last_error());
        }
    }
}
