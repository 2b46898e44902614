package org.conflux;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;

/**
 * A Conflux context: this process's membership in a data-parallel job. Create it with
 * {@link #init()} (collective across ranks: every rank calls it), use the collectives from any
 * thread, and {@link #close()} it (collective too) when done:
 *
 * <pre>{@code
 * try (Conflux cfx = Conflux.init()) {
 *     float[] grad = ...;
 *     cfx.allreduce("grad.w", grad, ReduceOp.AVERAGE);   // in place
 * }
 * }</pre>
 *
 * <p>Every collective comes in two forms: {@code allreduce(...)} waits and returns the result,
 * {@code allreduceAsync(...)} returns a {@link Handle} at once. An allreduce's op, scale factors
 * and {@link Compression} can also come in one {@link AllreduceOptions}. Data is a {@code float[]},
 * {@code double[]}, {@code int[]} or {@code long[]} (copied to native memory and back), or a direct
 * {@code java.nio} buffer in native byte order (zero-copy, from its position to its limit; a
 * {@code ByteBuffer} states its {@link DType}). Heap buffers are rejected. Tensors are one-dimensional.
 * {@link #allocateShared(long)} gives direct buffers in shared tensor memory, which CPU allreduces
 * reduce without copies.
 *
 * <p>{@code name} identifies the tensor across ranks: ranks may submit named tensors in any order. A
 * null name lets Conflux generate one, and then every rank must submit in the same order. A name
 * may be reused once its previous collective completed.
 *
 * <p>Failures reported by the engine are {@link ConfluxException}s (see its subclasses) carrying the
 * C message; bad local arguments are {@link IllegalArgumentException}s; a closed context throws
 * {@link IllegalStateException}. {@link #init()} and {@link #close()} belong to one thread; every
 * other method is thread-safe.
 */
public final class Conflux implements AutoCloseable {
    /** Which transport {@link #init(Options)} joins the job over. */
    public enum Transport {
        /** MPI when built, else the single-process local transport. */
        AUTO(cfx_transport_kind.CFX_TRANSPORT_AUTO),
        /** Open MPI (MPI_COMM_WORLD). */
        MPI(cfx_transport_kind.CFX_TRANSPORT_MPI),
        /** One process, size 1, no MPI. */
        LOCAL(cfx_transport_kind.CFX_TRANSPORT_LOCAL);

        final int code;

        Transport(int code) {
            this.code = code;
        }
    }

    /**
     * Options for {@link #init(Options)}. Anything not set comes from the {@code CFX_*} environment
     * variables or the defaults (docs/env-vars.md).
     */
    public static final class Options {
        /** The options set, by their cfx_init_options field names: C sets them by name. */
        final Map<String, Double> byName = new LinkedHashMap<>();

        /**
         * Sets the {@code cfx_init_options} field {@code name} (docs/env-vars.md names each) to
         * {@code value}: a number &gt;= 0, whole except for the fields in ms or s. The typed setters
         * below call this; an unknown name or a bad value throws an IllegalArgumentException from
         * {@link #init(Options)} naming it.
         */
        public Options set(String name, double value) {
            putOption(byName, "init", name, value);
            return this;
        }

        public Options transport(Transport t) {
            return set("transport", t.code);
        }

        /** Fusion buffer size in bytes; 0 disables fusion. */
        public Options fusionThresholdBytes(long v) {
            return set("fusion_threshold_bytes", v);
        }

        /** Idle wake-up period of the background thread. */
        public Options cycleTimeMs(double v) {
            return set("cycle_time_ms", v);
        }

        /** Response cache entries; 0 disables the cache. */
        public Options cacheCapacity(long v) {
            return set("cache_capacity", v);
        }

        /** 0 trace, 1 debug, 2 info, 3 warning, 4 error, 5 off. */
        public Options logLevel(int v) {
            return set("log_level", v);
        }

        /** Bitwise reproducible reductions. */
        public Options deterministic(boolean v) {
            return set("deterministic", v ? 1 : 0);
        }

        public Options stallWarningSeconds(double v) {
            return set("stall_warning_s", v);
        }

        /** After this long a tensor some ranks never submitted fails with a {@link StallException}; 0 = never. */
        public Options stallTimeoutSeconds(double v) {
            return set("stall_timeout_s", v);
        }

        /** Pipeline chunk of large reductions. */
        public Options chunkBytes(long v) {
            return set("chunk_bytes", v);
        }
    }

    /**
     * Per-call options of an allreduce (the C ABI's {@code cfx_allreduce_options}): the reduction,
     * the scale factors and the {@link Compression}. The defaults are AVERAGE (every binding's
     * default op, docs/bindings.md), 1, 1 and {@link Compression#NONE}. An options object holds no state of a call and may be reused and
     * shared between threads once set up.
     *
     * <pre>{@code
     * Conflux.AllreduceOptions half = new Conflux.AllreduceOptions()
     *         .op(ReduceOp.AVERAGE).compression(Compression.FP16);
     * cfx.allreduce("grad.fc1", grad, half);
     * }</pre>
     */
    public static final class AllreduceOptions {
        ReduceOp op = DEFAULT_OP;
        double prescale = 1.0;
        double postscale = 1.0;
        Compression compression = Compression.NONE;

        /** The reduction (default AVERAGE). */
        public AllreduceOptions op(ReduceOp v) {
            if (v == null) {
                throw new IllegalArgumentException("Conflux.AllreduceOptions.op: null");
            }
            op = v;
            return this;
        }

        /** Applied to each rank's values before the reduction (default 1). */
        public AllreduceOptions prescale(double v) {
            prescale = v;
            return this;
        }

        /** Applied to the result (default 1; AVERAGE divides by the size as well). */
        public AllreduceOptions postscale(double v) {
            postscale = v;
            return this;
        }

        /** How the values travel (default NONE): float32 and float64 tensors only. */
        public AllreduceOptions compression(Compression v) {
            if (v == null) {
                throw new IllegalArgumentException("Conflux.AllreduceOptions.compression: null");
            }
            compression = v;
            return this;
        }

        /** {@link #compression(Compression)} by name: "none", "fp16", "bf16", "fp16_everywhere", "bf16_everywhere" (any case). */
        public AllreduceOptions compression(String name) {
            return compression(Compression.of(name));
        }
    }

    /** The op of an allreduce that names none: AVERAGE, as in Python, Lua and Horovod. */
    public static final ReduceOp DEFAULT_OP = ReduceOp.AVERAGE;

    /** How long close() waits for each pending handle after shutdown (they complete at once). */
    private static final double CLOSE_WAIT_SECONDS = 30.0;

    private volatile long ctx;
    /* The world's shape, read at init and again after each reform (an elastic world's changes). */
    private volatile int rank;
    private volatile int size;
    private volatile int localRank;
    private volatile int localSize;
    private volatile int crossRank;
    private volatile int crossSize;
    /** Handles not yet observed complete: they keep their data reachable. */
    private final Set<Handle<?>> pending = ConcurrentHashMap.newKeySet();
    /** Pending handles the user closed: released by the next sweep once complete. */
    private final ConcurrentLinkedQueue<Handle<?>> detached = new ConcurrentLinkedQueue<>();
    /** Blocking calls inside the engine (see run): close() frees the context only once none is. */
    private final AtomicInteger running = new AtomicInteger();

    /** The store callbacks of a group's context (initGroup): freed after the context. */
    private long store;

    private Conflux(long ctx) {
        this.ctx = ctx;
        readWorld(ctx);
    }

    private void readWorld(long p) {
        rank = ConfluxNative.cfx_rank(p);
        size = ConfluxNative.cfx_size(p);
        localRank = ConfluxNative.cfx_local_rank(p);
        localSize = ConfluxNative.cfx_local_size(p);
        crossRank = ConfluxNative.cfx_cross_rank(p);
        crossSize = ConfluxNative.cfx_cross_size(p);
    }

    /** Joins the job with default options (collective across ranks). */
    public static Conflux init() {
        return init(new Options());
    }

    /** Joins the job (collective across ranks). */
    public static Conflux init(Options o) {
        long p = ConfluxNative.cfxj_init(initOptions(o));  // frees them
        if (p == 0) {
            throw lastError();
        }
        return new Conflux(p);
    }

    /** {@link #initGroup(Options, Store, int, int)} with default options. */
    public static Conflux initGroup(Store store, int rank, int size) {
        return initGroup(new Options(), store, rank, size);
    }

    /**
     * Joins a group whose members alone call this ({@code cfx_init_group}): this process is
     * {@code rank} of {@code size} as the caller says, whatever launcher started it, and the
     * members meet over Gloo through {@code store}. For programs that learn their place from
     * something other than a launcher's environment, e.g. a Spark barrier task
     * ({@code BarrierTaskContext.partitionId()}, docs/spark.md), or several groups in one job
     * (give each its own store or {@link Store#withPrefix prefix}). Collective across the
     * members; a group of one meets nobody. The store is used while the context lives and must
     * stay reachable until {@link #close()} returned on every member.
     *
     * @throws IllegalArgumentException for a null store, a size below 1 or a rank outside
     *         [0, size), or a transport other than Gloo asked for
     * @throws TimeoutException when the other members do not come within
     *         {@code CFX_RENDEZVOUS_TIMEOUT_S}; an exception the store threw is attached
     *         (suppressed) to whatever init throws
     */
    public static Conflux initGroup(Options o, Store store, int rank, int size) {
        if (store == null) {
            throw new IllegalArgumentException("Conflux.initGroup: store is null");
        }
        StoreBridge bridge = new StoreBridge(store);
        long s = ConfluxNative.cfxj_store_new(bridge);
        if (s == 0) {
            throw lastError();
        }
        long p;
        try {
            p = ConfluxNative.cfxj_init_group(initOptions(o), s, rank, size);  // frees the options
        } catch (RuntimeException e) {
            ConfluxNative.cfxj_store_free(s);
            throw e;
        }
        if (p == 0) {
            RuntimeException e = lastError();
            ConfluxNative.cfxj_store_free(s);
            if (bridge.failure() != null) {
                e.addSuppressed(bridge.failure());
            }
            throw e;
        }
        Conflux c = new Conflux(p);
        c.store = s;
        return c;
    }

    /** Records option {@code name} of a set of {@code kind} ("init", "reform"); C checks it later. */
    private static void putOption(Map<String, Double> byName, String kind, String name, double value) {
        if (name == null) {
            throw new IllegalArgumentException("Conflux: " + kind + " option name is null");
        }
        byName.put(name, value);
    }

    /** The native setter of one option by name (cfxj_init_option, cfxj_reform_option). */
    private interface OptionSetter {
        int set(long options, String name, double value);
    }

    /** Sets each option of {@code byName} on the native set {@code opts}; frees it on a bad one. */
    private static long setByName(long opts, Map<String, Double> byName, OptionSetter setter) {
        if (opts == 0) {
            throw lastError();
        }
        for (Map.Entry<String, Double> e : byName.entrySet()) {
            int st = setter.set(opts, e.getKey(), e.getValue());
            if (st != cfx_status.CFX_OK) {
                ConfluxNative.cfxj_free(opts);
                throw ConfluxException.of(st, "Conflux: " + ConfluxNative.cfxj_run_message());
            }
        }
        return opts;
    }

    private static long initOptions(Options o) {
        if (o == null) {
            throw new IllegalArgumentException("Conflux: init options are null");
        }
        return setByName(ConfluxNative.cfxj_init_options(), o.byName, ConfluxNative::cfxj_init_option);
    }

    private static long reformOptions(ReformOptions o) {
        if (o == null) {
            throw new IllegalArgumentException("Conflux: reform options are null");
        }
        return setByName(ConfluxNative.cfxj_reform_options(), o.byName, ConfluxNative::cfxj_reform_option);
    }

    // ---- elastic worlds (docs/elastic.md) ------------------------------------------------------------

    /**
     * Options of a membership round ({@code cfx_reform_options}) for {@link #elasticInit} and
     * {@link #reform(ReformOptions)}. Anything not set comes from the {@code CFX_ELASTIC_*}
     * variables that {@code cfxrun --elastic} gives its workers, else the defaults (min 1, no max,
     * a 60 s deadline, 10 s settle time).
     */
    public static final class ReformOptions {
        /** The options set, by their cfx_reform_options field names: C sets them by name. */
        final Map<String, Double> byName = new LinkedHashMap<>();

        /**
         * Sets the {@code cfx_reform_options} field {@code name} ("min_size", "max_size",
         * "timeout_s", "settle_s") to {@code value}, a number &gt;= 0 (whole for the sizes). An
         * unknown name or a bad value throws an IllegalArgumentException naming it from the call
         * that uses the options.
         */
        public ReformOptions set(String name, double value) {
            putOption(byName, "reform", name, value);
            return this;
        }

        /** Fewest ranks the world may have: fewer by the deadline fails the round. */
        public ReformOptions minSize(int v) {
            return set("min_size", v);
        }

        /** Most ranks (0: no limit); newcomers past it wait for a later round. */
        public ReformOptions maxSize(int v) {
            return set("max_size", v);
        }

        /** The deadline of a round. */
        public ReformOptions timeoutSeconds(double v) {
            return set("timeout_s", v);
        }

        /** How long a round waits for a member of the previous world nobody reported gone. */
        public ReformOptions settleSeconds(double v) {
            return set("settle_s", v);
        }
    }

    /** {@link #elasticInit(Options, ReformOptions)} with the defaults. */
    public static Conflux elasticInit() {
        return elasticInit(new Options(), new ReformOptions());
    }

    /** {@link #elasticInit(Options, ReformOptions)} with the default init options. */
    public static Conflux elasticInit(ReformOptions reform) {
        return elasticInit(new Options(), reform);
    }

    /**
     * Joins an elastic job ({@code cfxrun --elastic}; {@code cfx_elastic_init}): the first
     * membership round not yet decided, so a process started late joins the running job at its
     * next round. The world runs over Gloo. {@link #reform(ReformOptions)} forms it again after a
     * rank was lost.
     *
     * @throws ConfluxException with {@link Status#CONFIG} outside an elastic job (no store),
     *         {@link MembershipChangedException} when the round could not gather the minimum
     */
    public static Conflux elasticInit(Options init, ReformOptions reform) {
        long ro = reformOptions(reform);
        long io;
        try {
            io = initOptions(init);
        } catch (RuntimeException e) {
            ConfluxNative.cfxj_free(ro);
            throw e;
        }
        long p = ConfluxNative.cfxj_elastic_init(io, ro);  // frees both
        if (p == 0) {
            throw lastError();
        }
        return new Conflux(p);
    }

    /** {@link #reform(ReformOptions)} with the defaults. */
    public void reform() {
        reform(new ReformOptions());
    }

    /**
     * Forms this elastic context's world again, in place ({@code cfx_context_reform}): call it on
     * every surviving rank after a collective failed with an exception whose
     * {@link ConfluxException#worldChanged()} is true, or on every rank together to let newcomers
     * in ({@link #membershipPending()}). Every collective still pending fails first with
     * {@link MembershipChangedException} (or the {@link PeerLostException} that ended the world);
     * {@link #rank()}, {@link #size()} and the rest give the new world's afterwards. Gradient sets
     * of the old world are left detached: close them and create them again. Like {@link #init()}
     * and {@link #close()} it belongs to one thread, with no other call of this context running.
     *
     * @throws MembershipChangedException when fewer than the minimum came by the deadline (the
     *         message names the members missing): the job cannot go on here
     * @throws ConfluxException with {@link Status#UNSUPPORTED} for a context not made by
     *         {@link #elasticInit}
     */
    public synchronized void reform(ReformOptions options) {
        long p = ptr();
        check(ConfluxNative.cfxj_reform(p, reformOptions(options)));  // frees the options
        readWorld(p);
    }

    /** The membership round this world was formed in (1 for the first world). */
    public int membershipRound() {
        int r = ConfluxNative.cfx_membership_round(ptr());
        if (r < 0) {
            throw ConfluxException.of(cfx_status.CFX_ERR_UNSUPPORTED, ConfluxNative.cfx_last_error());
        }
        return r;
    }

    /** This process's member id in the elastic job ({@code CFX_ELASTIC_ID}): it keeps it across rounds. */
    public int memberId() {
        int id = ConfluxNative.cfx_member_id(ptr());
        if (id < 0) {
            throw ConfluxException.of(cfx_status.CFX_ERR_UNSUPPORTED, ConfluxNative.cfx_last_error());
        }
        return id;
    }

    /**
     * How many newcomers wait to join the next round: a local look at the store, so ranks may see
     * different counts; agree with a collective (an allreduce MAX) before reforming together.
     */
    public int membershipPending() {
        int n = ConfluxNative.cfxj_membership_pending(ptr());
        if (n < 0) {
            throw lastError();
        }
        return n;
    }

    /**
     * A context over some of this context's ranks (Horovod's process sets, NCCL's
     * {@code ncclCommSplit}). Collective over this context's ranks: every rank passes the same
     * ranks (any order, no duplicates), from one thread, in the same order as its other subsets.
     * Members get a new context whose ranks are numbered in ascending order of their rank here;
     * every collective and {@link GradientSet} works on it unchanged, with its own negotiation,
     * response cache, background thread and data path, so subsets that overlap run at the same
     * time. The other ranks get null. {@link #close()} it on every member; closing (or a shutdown
     * of) this context shuts its subsets down, whose calls then throw {@link ShutDownException}.
     *
     * @throws IllegalArgumentException on every rank for a rank outside 0..size()-1, a rank
     *         listed twice, an empty list, or ranks passing different lists (the message names
     *         the rank and the value)
     */
    public Conflux subset(int... ranks) {
        if (ranks == null) {
            throw new IllegalArgumentException("Conflux: subset ranks is null");
        }
        long p = ConfluxNative.cfxj_subset(ptr(), ranks);
        if (p == 0) {
            if (ConfluxNative.cfxj_last_status() == cfx_status.CFX_OK) {
                return null;
            }
            throw lastError();
        }
        return new Conflux(p);
    }

    /** The library version, "1.4.0". */
    public static String version() {
        return ConfluxNative.cfx_version_string();
    }

    /** The library version as MAJOR * 10000 + MINOR * 100 + PATCH. */
    public static int versionNumber() {
        return ConfluxNative.cfx_version();
    }

    /** What this build supports and this machine offers. */
    public static Set<Feature> features() {
        return Feature.fromBits(ConfluxNative.cfx_features());
    }

    public int rank() {
        ptr();
        return rank;
    }

    public int size() {
        ptr();
        return size;
    }

    /** Rank among the processes on this host. */
    public int localRank() {
        ptr();
        return localRank;
    }

    public int localSize() {
        ptr();
        return localSize;
    }

    /** Rank among the hosts (one rank per host with the same local rank). */
    public int crossRank() {
        ptr();
        return crossRank;
    }

    public int crossSize() {
        ptr();
        return crossSize;
    }

    /** True while the context accepts work (false after a local or remote shutdown, or close). */
    public boolean isRunning() {
        long p = ctx;
        return p != 0 && ConfluxNative.cfx_is_running(p) != 0;
    }

    /** Completes once every rank reached it. */
    public void barrier() {
        barrierAsync().await();
    }

    public Handle<Void> barrierAsync() {
        sweep();
        long h = ConfluxNative.cfxj_barrier(ptr());
        if (h == 0) {
            throw lastError();
        }
        return track(new Handle<>(this, Handle.Kind.BARRIER, null, null, h));
    }

    /**
     * Declares that this rank has no more data; until every rank joined it takes part in the other
     * ranks' allreduces with the op's identity. Returns the rank that joined last.
     */
    public int join() {
        return joinAsync().await();
    }

    public Handle<Integer> joinAsync() {
        sweep();
        long h = ConfluxNative.cfxj_join(ptr());
        if (h == 0) {
            throw lastError();
        }
        return track(new Handle<>(this, Handle.Kind.JOIN, null, null, h));
    }

    /** {@link #allreduce(String, float[], ReduceOp)} with scale factors: postscale * op(prescale * x). */
    public <T> T allreduce(String name, T data, ReduceOp op, double prescale, double postscale) {
        return run(Handle.Kind.ALLREDUCE, name, data, null, op, prescale, postscale, 0, Compression.NONE);
    }

    /** Asynchronous {@link #allreduce(String, Object, ReduceOp, double, double)}. */
    public <T> Handle<T> allreduceAsync(String name, T data, ReduceOp op, double prescale, double postscale) {
        return submit(Handle.Kind.ALLREDUCE, name, data, null, op, prescale, postscale, 0, null);
    }

    // ---- allreduce ---------------------------------------------------------------------------------

    /** Averages {@code data} (any array or direct buffer the other forms take) across ranks in place: {@link #DEFAULT_OP}. */
    public <T> T allreduce(String name, T data) {
        return run(Handle.Kind.ALLREDUCE, name, data, null, DEFAULT_OP, 1.0, 1.0, 0, Compression.NONE);
    }

    /** Asynchronous {@link #allreduce(String, Object)}. */
    public <T> Handle<T> allreduceAsync(String name, T data) {
        return submit(Handle.Kind.ALLREDUCE, name, data, null, DEFAULT_OP, 1.0, 1.0, 0, null, Compression.NONE);
    }

    /**
     * Reduces {@code data} (any array or direct buffer the other forms take) across ranks in place
     * as {@code options} say, and returns it.
     */
    public <T> T allreduce(String name, T data, AllreduceOptions options) {
        return run(Handle.Kind.ALLREDUCE, name, data, null, checked(options).op, options.prescale,
                options.postscale, 0, options.compression);
    }

    /** Asynchronous {@link #allreduce(String, Object, AllreduceOptions)}. */
    public <T> Handle<T> allreduceAsync(String name, T data, AllreduceOptions options) {
        return submitAllreduce(name, data, null, options);
    }

    /** {@link #allreduce(String, Object, AllreduceOptions)} on a ByteBuffer holding elements of {@code dtype}. */
    public ByteBuffer allreduce(String name, ByteBuffer data, DType dtype, AllreduceOptions options) {
        return run(Handle.Kind.ALLREDUCE, name, data, dtype, checked(options).op, options.prescale,
                options.postscale, 0, options.compression);
    }

    /** Asynchronous {@link #allreduce(String, ByteBuffer, DType, AllreduceOptions)}. */
    public Handle<ByteBuffer> allreduceAsync(String name, ByteBuffer data, DType dtype, AllreduceOptions options) {
        return submitAllreduce(name, data, dtype, options);
    }

    private <T> Handle<T> submitAllreduce(String name, Object data, DType byteType, AllreduceOptions o) {
        return submit(Handle.Kind.ALLREDUCE, name, data, byteType, checked(o).op, o.prescale, o.postscale, 0,
                null, o.compression);
    }

    private static AllreduceOptions checked(AllreduceOptions o) {
        if (o == null) {
            throw new IllegalArgumentException("Conflux: allreduce options are null");
        }
        return o;
    }


    /** Reduces {@code data} across ranks in place and returns it. */
    public float[] allreduce(String name, float[] data, ReduceOp op) {
        return run(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, Compression.NONE);
    }

    /** Asynchronous {@link #allreduce(String, float[], ReduceOp)}. */
    public Handle<float[]> allreduceAsync(String name, float[] data, ReduceOp op) {
        return submit(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks in place and returns it. */
    public double[] allreduce(String name, double[] data, ReduceOp op) {
        return run(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, Compression.NONE);
    }

    /** Asynchronous {@link #allreduce(String, double[], ReduceOp)}. */
    public Handle<double[]> allreduceAsync(String name, double[] data, ReduceOp op) {
        return submit(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks in place and returns it. */
    public int[] allreduce(String name, int[] data, ReduceOp op) {
        return run(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, Compression.NONE);
    }

    /** Asynchronous {@link #allreduce(String, int[], ReduceOp)}. */
    public Handle<int[]> allreduceAsync(String name, int[] data, ReduceOp op) {
        return submit(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks in place and returns it. */
    public long[] allreduce(String name, long[] data, ReduceOp op) {
        return run(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, Compression.NONE);
    }

    /** Asynchronous {@link #allreduce(String, long[], ReduceOp)}. */
    public Handle<long[]> allreduceAsync(String name, long[] data, ReduceOp op) {
        return submit(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks in place and returns it. Zero-copy on a direct buffer (from its position to its limit; native byte order). */
    public <B extends Buffer> B allreduce(String name, B data, ReduceOp op) {
        return run(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, Compression.NONE);
    }

    /** Asynchronous {@link #allreduce(String, Buffer, ReduceOp)}. */
    public <B extends Buffer> Handle<B> allreduceAsync(String name, B data, ReduceOp op) {
        return submit(Handle.Kind.ALLREDUCE, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks in place and returns it. {@code data} holds elements of {@code dtype}. */
    public ByteBuffer allreduce(String name, ByteBuffer data, DType dtype, ReduceOp op) {
        return run(Handle.Kind.ALLREDUCE, name, data, dtype, op, 1.0, 1.0, 0, Compression.NONE);
    }

    /** Asynchronous {@link #allreduce(String, ByteBuffer, DType, ReduceOp)}. */
    public Handle<ByteBuffer> allreduceAsync(String name, ByteBuffer data, DType dtype, ReduceOp op) {
        return submit(Handle.Kind.ALLREDUCE, name, data, dtype, op, 1.0, 1.0, 0, null);
    }

    // ---- broadcast ---------------------------------------------------------------------------------

    /** Copies {@code rootRank}'s data into {@code data} on every rank, in place, and returns it. */
    public float[] broadcast(String name, float[] data, int rootRank) {
        return run(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, Compression.NONE);
    }

    /** Asynchronous {@link #broadcast(String, float[], int)}. */
    public Handle<float[]> broadcastAsync(String name, float[] data, int rootRank) {
        return submit(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, null);
    }

    /** Copies {@code rootRank}'s data into {@code data} on every rank, in place, and returns it. */
    public double[] broadcast(String name, double[] data, int rootRank) {
        return run(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, Compression.NONE);
    }

    /** Asynchronous {@link #broadcast(String, double[], int)}. */
    public Handle<double[]> broadcastAsync(String name, double[] data, int rootRank) {
        return submit(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, null);
    }

    /** Copies {@code rootRank}'s data into {@code data} on every rank, in place, and returns it. */
    public int[] broadcast(String name, int[] data, int rootRank) {
        return run(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, Compression.NONE);
    }

    /** Asynchronous {@link #broadcast(String, int[], int)}. */
    public Handle<int[]> broadcastAsync(String name, int[] data, int rootRank) {
        return submit(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, null);
    }

    /** Copies {@code rootRank}'s data into {@code data} on every rank, in place, and returns it. */
    public long[] broadcast(String name, long[] data, int rootRank) {
        return run(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, Compression.NONE);
    }

    /** Asynchronous {@link #broadcast(String, long[], int)}. */
    public Handle<long[]> broadcastAsync(String name, long[] data, int rootRank) {
        return submit(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, null);
    }

    /** Copies {@code rootRank}'s data into {@code data} on every rank, in place, and returns it. Zero-copy on a direct buffer (from its position to its limit; native byte order). */
    public <B extends Buffer> B broadcast(String name, B data, int rootRank) {
        return run(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, Compression.NONE);
    }

    /** Asynchronous {@link #broadcast(String, Buffer, int)}. */
    public <B extends Buffer> Handle<B> broadcastAsync(String name, B data, int rootRank) {
        return submit(Handle.Kind.BROADCAST, name, data, null, null, 1.0, 1.0, rootRank, null);
    }

    /** Copies {@code rootRank}'s data into {@code data} on every rank, in place, and returns it. {@code data} holds elements of {@code dtype}. */
    public ByteBuffer broadcast(String name, ByteBuffer data, DType dtype, int rootRank) {
        return run(Handle.Kind.BROADCAST, name, data, dtype, null, 1.0, 1.0, rootRank, Compression.NONE);
    }

    /** Asynchronous {@link #broadcast(String, ByteBuffer, DType, int)}. */
    public Handle<ByteBuffer> broadcastAsync(String name, ByteBuffer data, DType dtype, int rootRank) {
        return submit(Handle.Kind.BROADCAST, name, data, dtype, null, 1.0, 1.0, rootRank, null);
    }

    // ---- allgather ---------------------------------------------------------------------------------

    /** Concatenates every rank's {@code data} (lengths may differ) in rank order into a new array or buffer. */
    public float[] allgather(String name, float[] data) {
        return this.<float[]>submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #allgather(String, float[])}. */
    public Handle<float[]> allgatherAsync(String name, float[] data) {
        return submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null);
    }

    /** Concatenates every rank's {@code data} (lengths may differ) in rank order into a new array or buffer. */
    public double[] allgather(String name, double[] data) {
        return this.<double[]>submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #allgather(String, double[])}. */
    public Handle<double[]> allgatherAsync(String name, double[] data) {
        return submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null);
    }

    /** Concatenates every rank's {@code data} (lengths may differ) in rank order into a new array or buffer. */
    public int[] allgather(String name, int[] data) {
        return this.<int[]>submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #allgather(String, int[])}. */
    public Handle<int[]> allgatherAsync(String name, int[] data) {
        return submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null);
    }

    /** Concatenates every rank's {@code data} (lengths may differ) in rank order into a new array or buffer. */
    public long[] allgather(String name, long[] data) {
        return this.<long[]>submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #allgather(String, long[])}. */
    public Handle<long[]> allgatherAsync(String name, long[] data) {
        return submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null);
    }

    /** Concatenates every rank's {@code data} (lengths may differ) in rank order into a new array or buffer. Zero-copy on a direct buffer (from its position to its limit; native byte order). */
    public <B extends Buffer> B allgather(String name, B data) {
        return this.<B>submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #allgather(String, Buffer)}. */
    public <B extends Buffer> Handle<B> allgatherAsync(String name, B data) {
        return submit(Handle.Kind.ALLGATHER, name, data, null, null, 1.0, 1.0, 0, null);
    }

    /** Concatenates every rank's {@code data} (lengths may differ) in rank order into a new array or buffer. {@code data} holds elements of {@code dtype}. */
    public ByteBuffer allgather(String name, ByteBuffer data, DType dtype) {
        return this.<ByteBuffer>submit(Handle.Kind.ALLGATHER, name, data, dtype, null, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #allgather(String, ByteBuffer, DType)}. */
    public Handle<ByteBuffer> allgatherAsync(String name, ByteBuffer data, DType dtype) {
        return submit(Handle.Kind.ALLGATHER, name, data, dtype, null, 1.0, 1.0, 0, null);
    }

    // ---- alltoall ----------------------------------------------------------------------------------

    /** Sends {@code splits[j]} elements (in order) to rank j; null splits divides equally. Returns the received elements. */
    public float[] alltoall(String name, float[] data, long[] splits) {
        return this.<float[]>submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits).await();
    }

    /** Asynchronous {@link #alltoall(String, float[], long[])}. */
    public Handle<float[]> alltoallAsync(String name, float[] data, long[] splits) {
        return submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits);
    }

    /** Sends {@code splits[j]} elements (in order) to rank j; null splits divides equally. Returns the received elements. */
    public double[] alltoall(String name, double[] data, long[] splits) {
        return this.<double[]>submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits).await();
    }

    /** Asynchronous {@link #alltoall(String, double[], long[])}. */
    public Handle<double[]> alltoallAsync(String name, double[] data, long[] splits) {
        return submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits);
    }

    /** Sends {@code splits[j]} elements (in order) to rank j; null splits divides equally. Returns the received elements. */
    public int[] alltoall(String name, int[] data, long[] splits) {
        return this.<int[]>submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits).await();
    }

    /** Asynchronous {@link #alltoall(String, int[], long[])}. */
    public Handle<int[]> alltoallAsync(String name, int[] data, long[] splits) {
        return submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits);
    }

    /** Sends {@code splits[j]} elements (in order) to rank j; null splits divides equally. Returns the received elements. */
    public long[] alltoall(String name, long[] data, long[] splits) {
        return this.<long[]>submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits).await();
    }

    /** Asynchronous {@link #alltoall(String, long[], long[])}. */
    public Handle<long[]> alltoallAsync(String name, long[] data, long[] splits) {
        return submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits);
    }

    /** Sends {@code splits[j]} elements (in order) to rank j; null splits divides equally. Returns the received elements. Zero-copy on a direct buffer (from its position to its limit; native byte order). */
    public <B extends Buffer> B alltoall(String name, B data, long[] splits) {
        return this.<B>submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits).await();
    }

    /** Asynchronous {@link #alltoall(String, Buffer, long[])}. */
    public <B extends Buffer> Handle<B> alltoallAsync(String name, B data, long[] splits) {
        return submit(Handle.Kind.ALLTOALL, name, data, null, null, 1.0, 1.0, 0, splits);
    }

    /** Sends {@code splits[j]} elements (in order) to rank j; null splits divides equally. Returns the received elements. {@code data} holds elements of {@code dtype}. */
    public ByteBuffer alltoall(String name, ByteBuffer data, DType dtype, long[] splits) {
        return this.<ByteBuffer>submit(Handle.Kind.ALLTOALL, name, data, dtype, null, 1.0, 1.0, 0, splits).await();
    }

    /** Asynchronous {@link #alltoall(String, ByteBuffer, DType, long[])}. */
    public Handle<ByteBuffer> alltoallAsync(String name, ByteBuffer data, DType dtype, long[] splits) {
        return submit(Handle.Kind.ALLTOALL, name, data, dtype, null, 1.0, 1.0, 0, splits);
    }

    // ---- reducescatter -----------------------------------------------------------------------------

    /** Reduces {@code data} across ranks and returns this rank's block (the first n % size ranks get one more element). */
    public float[] reducescatter(String name, float[] data, ReduceOp op) {
        return this.<float[]>submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #reducescatter(String, float[], ReduceOp)}. */
    public Handle<float[]> reducescatterAsync(String name, float[] data, ReduceOp op) {
        return submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks and returns this rank's block (the first n % size ranks get one more element). */
    public double[] reducescatter(String name, double[] data, ReduceOp op) {
        return this.<double[]>submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #reducescatter(String, double[], ReduceOp)}. */
    public Handle<double[]> reducescatterAsync(String name, double[] data, ReduceOp op) {
        return submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks and returns this rank's block (the first n % size ranks get one more element). */
    public int[] reducescatter(String name, int[] data, ReduceOp op) {
        return this.<int[]>submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #reducescatter(String, int[], ReduceOp)}. */
    public Handle<int[]> reducescatterAsync(String name, int[] data, ReduceOp op) {
        return submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks and returns this rank's block (the first n % size ranks get one more element). */
    public long[] reducescatter(String name, long[] data, ReduceOp op) {
        return this.<long[]>submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #reducescatter(String, long[], ReduceOp)}. */
    public Handle<long[]> reducescatterAsync(String name, long[] data, ReduceOp op) {
        return submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks and returns this rank's block (the first n % size ranks get one more element). Zero-copy on a direct buffer (from its position to its limit; native byte order). */
    public <B extends Buffer> B reducescatter(String name, B data, ReduceOp op) {
        return this.<B>submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #reducescatter(String, Buffer, ReduceOp)}. */
    public <B extends Buffer> Handle<B> reducescatterAsync(String name, B data, ReduceOp op) {
        return submit(Handle.Kind.REDUCESCATTER, name, data, null, op, 1.0, 1.0, 0, null);
    }

    /** Reduces {@code data} across ranks and returns this rank's block (the first n % size ranks get one more element). {@code data} holds elements of {@code dtype}. */
    public ByteBuffer reducescatter(String name, ByteBuffer data, DType dtype, ReduceOp op) {
        return this.<ByteBuffer>submit(Handle.Kind.REDUCESCATTER, name, data, dtype, op, 1.0, 1.0, 0, null).await();
    }

    /** Asynchronous {@link #reducescatter(String, ByteBuffer, DType, ReduceOp)}. */
    public Handle<ByteBuffer> reducescatterAsync(String name, ByteBuffer data, DType dtype, ReduceOp op) {
        return submit(Handle.Kind.REDUCESCATTER, name, data, dtype, op, 1.0, 1.0, 0, null);
    }

    // ---- timeline --------------------------------------------------------------------------------

    /**
     * Starts writing this rank's timeline (Chrome trace-event JSON: every tensor's phases) to
     * {@code path} with the rank inserted ("%r" in the path, else ".rank&lt;r&gt;" before the
     * extension). {@code markCycles} adds a lane of the background thread's cycles. Not collective.
     */
    public void startTimeline(String path, boolean markCycles) {
        if (path == null || path.isEmpty()) {
            throw new IllegalArgumentException("Conflux: timeline path is empty");
        }
        check(ConfluxNative.cfx_timeline_start(ptr(), path, markCycles ? 1 : 0));
    }

    /** Stops the timeline and completes its file; a no-op when none runs. */
    public void stopTimeline() {
        check(ConfluxNative.cfx_timeline_stop(ptr()));
    }

    private static void check(int status) {
        if (status != cfx_status.CFX_OK) {
            throw ConfluxException.of(status, ConfluxNative.cfx_last_error());
        }
    }

    // ---- shared tensor memory --------------------------------------------------------------------

    /**
     * A direct buffer of {@code bytes} (native byte order, contents undefined) over shared tensor
     * memory: memory the other ranks on this host map. A CPU allreduce whose data lies in such
     * memory on every local rank is reduced straight from every rank's buffer, without the copies
     * through the engine's shared-memory slots; results are the same either way, and any direct
     * buffer still works with every collective. Views ({@code asFloatBuffer()}, slices) work too.
     *
     * <p>Not tied to a context: the pool is per process, so the buffer may be allocated before
     * {@link #init()} and outlive {@link #close()}. Free it with {@link #freeShared(ByteBuffer)}
     * once no collective uses it; a buffer that becomes unreachable is freed by a Cleaner (safe:
     * a tensor in flight stays reachable from its handle), but the garbage collector does not see
     * the memory, so do not rely on it to keep the pool from filling up. Thread-safe.
     *
     * @throws IllegalArgumentException for {@code bytes} outside 0..Integer.MAX_VALUE
     * @throws ConfluxException with {@link Status#OUT_OF_MEMORY} when the pool has no room (the
     *         message gives its use and size; CFX_SHARED_POOL_BYTES sets it), {@link Status#CONFIG}
     *         for a malformed CFX_SHARED_POOL_BYTES
     */
    public static ByteBuffer allocateShared(long bytes) {
        return SharedMemory.allocate(bytes);
    }

    /**
     * Returns a buffer from {@link #allocateShared(long)} to the pool; a null buffer is a no-op.
     * The buffer, and every view of it, must not be used afterwards (the memory reads as zeros or
     * as another allocation's data; the process does not crash), and it must not be in flight in a
     * collective (await its handle first). Thread-safe.
     *
     * @throws IllegalArgumentException for a buffer allocateShared did not return (a heap buffer,
     *         ByteBuffer.allocateDirect memory, a duplicate or slice) or one already freed; nothing is
     *         freed then
     */
    public static void freeShared(ByteBuffer buffer) {
        SharedMemory.free(buffer);
    }

    // ---- lifetime --------------------------------------------------------------------------------

    /**
     * Stops the background thread after telling the other ranks; pending collectives fail with
     * {@link ShutDownException}, and so do later ones. Queries keep working until {@link #close()}.
     */
    public void shutdown() {
        check(ConfluxNative.cfx_shutdown(ptr()));
    }

    /** Shuts down if needed, completes every pending handle, and frees the context. Idempotent. */
    @Override
    public synchronized void close() {
        long p = ctx;
        if (p == 0) {
            return;
        }
        ConfluxNative.cfx_shutdown(p);
        for (Handle<?> h : new ArrayList<>(pending)) {
            h.finishOnClose(CLOSE_WAIT_SECONDS);
        }
        detached.clear();
        ctx = 0;
        // Blocking calls still inside the engine return at once after the shutdown; should one not,
        // the context is left allocated rather than freed under it.
        long deadline = System.nanoTime() + (long) (CLOSE_WAIT_SECONDS * 1e9);
        while (running.get() > 0) {
            if (System.nanoTime() > deadline) {
                return;
            }
            LockSupport.parkNanos(100_000L);
        }
        ConfluxNative.cfx_context_free(p);
        if (store != 0) {
            ConfluxNative.cfxj_store_free(store);
            store = 0;
        }
    }

    @Override
    public String toString() {
        return ctx == 0 ? "Conflux[closed]" : "Conflux[rank " + rank + " of " + size + "]";
    }

    // ---- internals -------------------------------------------------------------------------------

    long ptr() {
        long p = ctx;
        if (p == 0) {
            throw new IllegalStateException("Conflux: the context is closed");
        }
        return p;
    }

    /** The exception for the calling thread's last failed cfxj_* call. */
    static RuntimeException lastError() {
        return ConfluxException.of(ConfluxNative.cfxj_last_status(), ConfluxNative.cfx_last_error());
    }

    private <T> Handle<T> track(Handle<T> h) {
        pending.add(h);
        return h;
    }

    /** Blocking calls now inside the engine (for tests). */
    int blockingCalls() {
        return running.get();
    }

    void forget(Handle<?> h) {
        pending.remove(h);
    }

    void detach(Handle<?> h) {
        detached.add(h);
    }

    private void sweep() {
        if (!detached.isEmpty()) {
            detached.removeIf(Handle::reapIfDone);
        }
    }

    private <T> Handle<T> submit(Handle.Kind kind, String name, Object data, DType byteType, ReduceOp op,
                                 double prescale, double postscale, int root, long[] splits) {
        return submit(kind, name, data, byteType, op, prescale, postscale, root, splits, Compression.NONE);
    }

    /** Checks a collective's arguments and describes its data; reaps detached handles on the way. */
    private Operand operand(Handle.Kind kind, Object data, DType byteType, ReduceOp op, Compression compression) {
        boolean reduces = kind == Handle.Kind.ALLREDUCE || kind == Handle.Kind.REDUCESCATTER;
        if (reduces && op == null) {
            throw new IllegalArgumentException("Conflux: op is null");
        }
        if (compression == null) {
            throw new IllegalArgumentException("Conflux: compression is null");
        }
        Operand o = Operand.of(data, byteType, kind == Handle.Kind.ALLREDUCE || kind == Handle.Kind.BROADCAST);
        sweep();
        return o;
    }

    /**
     * The blocking form of an allreduce or broadcast: one native call submits, waits, copies an
     * array's result back and releases, so no Handle is made or tracked (cfxj_run). {@link #close()}
     * waits for the calls counted in {@code running} before it frees the context.
     */
    @SuppressWarnings("unchecked")
    private <T> T run(Handle.Kind kind, String name, T data, DType byteType, ReduceOp op, double prescale,
                      double postscale, int root, Compression compression) {
        Operand o = operand(kind, data, byteType, op, compression);
        running.incrementAndGet();
        int st;
        try {
            long p = ptr();  // after the increment: close() either sees this call or this call sees it closed
            st = ConfluxNative.cfxj_run(p, kind == Handle.Kind.BROADCAST ? 1 : 0, name, o.staged ? o.target : null,
                    o.address, o.count, o.dtype.code, kind == Handle.Kind.BROADCAST ? root : op.code, prescale,
                    postscale, compression.code);
        } finally {
            running.decrementAndGet();
        }
        if (st != cfx_status.CFX_OK) {
            throw ConfluxException.of(st, ConfluxNative.cfxj_run_message());
        }
        return data;
    }

    private <T> Handle<T> submit(Handle.Kind kind, String name, Object data, DType byteType, ReduceOp op,
                                 double prescale, double postscale, int root, long[] splits,
                                 Compression compression) {
        long p = ptr();
        Operand o = operand(kind, data, byteType, op, compression);
        o.stage();
        long h;
        int dt = o.dtype.code;
        switch (kind) {
            case ALLREDUCE:
                h = ConfluxNative.cfxj_allreduce(p, name, o.address, o.count, dt, op.code, prescale, postscale,
                        compression.code);
                break;
            case BROADCAST:
                h = ConfluxNative.cfxj_broadcast(p, name, o.address, o.count, dt, root);
                break;
            case ALLGATHER:
                h = ConfluxNative.cfxj_allgather(p, name, o.address, o.count, dt);
                break;
            case ALLTOALL:
                h = ConfluxNative.cfxj_alltoall(p, name, o.address, o.count, dt, splits);
                break;
            case REDUCESCATTER:
                h = ConfluxNative.cfxj_reducescatter(p, name, o.address, o.count, dt, op.code, prescale, postscale);
                break;
            default:
                throw new AssertionError(kind);
        }
        if (h == 0) {
            RuntimeException e = lastError();
            o.free();
            throw e;
        }
        return track(new Handle<>(this, kind, name, o, h));
    }
}
