/*
 * conflux.h - the public C ABI of Conflux, a data-parallel training communication library.
 *
 * This is the only header a user includes. It owns the stable, versioned ABI: status codes, dtypes,
 * reduction ops, the tensor description, init options, the opaque context, asynchronous collectives
 * and their handles, and the rendezvous store a launcher serves. Nothing internal leaks into it.
 *
 * Conventions (docs/c-api.md has the full text):
 * - Every fallible call returns a cfx_status; CFX_OK is 0. On failure cfx_last_error() holds a
 *   message for this thread. Errors that happen later, on the background thread, belong to the
 *   handle they concern: cfx_handle_status() / cfx_handle_message().
 * - Out-parameters come last and are named `out`.
 * - Tensors are described, never owned: the caller keeps `data` alive (and unmodified, for inputs)
 *   until the handle completes. Outputs whose size is only known after negotiation (allgather,
 *   alltoall, reducescatter) are allocated by Conflux and borrowed from the handle until it is released.
 * - Threads: cfx_init, cfx_shutdown and cfx_context_free are called from one thread; every other
 *   function is safe from any thread.
 * - Enum values are pinned: they are never renumbered, only appended to.
 */
#ifndef CONFLUX_CONFLUX_H
#define CONFLUX_CONFLUX_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define CFX_API
#elif defined(__GNUC__) || defined(__clang__)
#define CFX_API __attribute__((visibility("default")))
#else
#define CFX_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Versions --------------------------------------------------------------------------------- */

#define CFX_VERSION_MAJOR 1
#define CFX_VERSION_MINOR 4
#define CFX_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH, written out (no expressions in public macros). The minor
 * version is that of the newest symbol-version node of capi/conflux.map (CONFLUX_1.4). */
#define CFX_VERSION_NUMBER 10400
/* The ABI major: the soname is libconflux.so.<CFX_ABI_VERSION>. */
#define CFX_ABI_VERSION 1

/* The library's CFX_VERSION_NUMBER (compare with the header's to detect a mismatched install). */
CFX_API int cfx_version(void);
/* "1.4.0"; static storage. */
CFX_API const char *cfx_version_string(void);

/* Bits of cfx_features(). */
typedef enum cfx_feature {
    CFX_FEATURE_MPI = 1,         /* built with the MPI transport */
    CFX_FEATURE_CUDA = 2,        /* built with CUDA kernels */
    CFX_FEATURE_NCCL = 4,        /* built with the NCCL data path */
    CFX_FEATURE_CUDA_DEVICE = 8, /* a CUDA device is usable at run time */
    CFX_FEATURE_LOCAL = 16,      /* the in-process transport (always built) */
    CFX_FEATURE_GLOO = 32        /* built with the Gloo transport (jobs not started by mpirun) */
} cfx_feature;

/* What this build supports and what this machine offers, as cfx_feature bits. */
CFX_API uint32_t cfx_features(void);

/* ---- Status ----------------------------------------------------------------------------------- */

/* Every status once: X(symbol, name, value, description). The enum, cfx_status_string() and
 * cfx_status_name() are generated from this list, and the bindings derive their error classes from
 * cfx_status_name() at load time, so a status added here reaches every language. Values are pinned;
 * append only. `name` is the symbol without its CFX_ / CFX_ERR_ prefix ("MISMATCH"). */
#define CFX_STATUS_LIST(X)                                                                        \
    X(CFX_OK, OK, 0, "ok")                                                                        \
    /* bad local argument: NULL, unknown enum, bad size, ... */                                   \
    X(CFX_ERR_INVALID_ARGUMENT, INVALID_ARGUMENT, 1, "invalid argument")                          \
    /* no context (NULL): call cfx_init first */                                                  \
    X(CFX_ERR_NOT_INITIALIZED, NOT_INITIALIZED, 2, "not initialized")                             \
    /* the context was shut down (locally or by another rank) */                                  \
    X(CFX_ERR_SHUT_DOWN, SHUT_DOWN, 3, "shut down")                                               \
    /* a tensor of that name is already in flight */                                              \
    X(CFX_ERR_DUPLICATE_NAME, DUPLICATE_NAME, 4, "duplicate tensor name in flight")               \
    /* ranks disagree on a tensor (dtype, shape, op, root, ...) */                                \
    X(CFX_ERR_MISMATCH, MISMATCH, 5, "mismatch across ranks")                                     \
    /* a valid request this build or this op does not support */                                  \
    X(CFX_ERR_UNSUPPORTED, UNSUPPORTED, 6, "unsupported")                                         \
    X(CFX_ERR_OUT_OF_MEMORY, OUT_OF_MEMORY, 7, "out of memory")                                   \
    /* the transport (MPI) reported an error */                                                   \
    X(CFX_ERR_TRANSPORT, TRANSPORT, 8, "transport error")                                         \
    /* cfx_wait's deadline passed; the handle is still pending */                                 \
    X(CFX_ERR_TIMEOUT, TIMEOUT, 9, "timed out")                                                   \
    /* the handle has not completed yet */                                                        \
    X(CFX_ERR_IN_PROGRESS, IN_PROGRESS, 10, "in progress")                                        \
    /* the handle was released or never existed */                                                \
    X(CFX_ERR_STALE_HANDLE, STALE_HANDLE, 11, "stale or unknown handle")                          \
    /* some ranks never submitted the tensor before the deadline */                               \
    X(CFX_ERR_STALL, STALL, 12, "stalled: some ranks never submitted the tensor")                 \
    /* a peer rank exited or stopped answering */                                                 \
    X(CFX_ERR_PEER_LOST, PEER_LOST, 13, "peer rank lost")                                         \
    /* a malformed CFX_* variable or option value */                                              \
    X(CFX_ERR_CONFIG, CONFIG, 14, "invalid configuration")                                        \
    /* an unknown options version, or ranks whose versions cannot talk */                         \
    X(CFX_ERR_VERSION, VERSION, 15,                                                               \
      "incompatible version (options struct, or ranks that cannot talk)")                         \
    /* the collective cannot run while some ranks have joined */                                  \
    X(CFX_ERR_JOINED, JOINED, 16, "not supported while ranks have joined")                        \
    X(CFX_ERR_INTERNAL, INTERNAL, 17, "internal error")                                           \
    X(CFX_ERR_CUDA, CUDA, 18, "CUDA error")                                                       \
    X(CFX_ERR_NCCL, NCCL, 19, "NCCL error")                                                       \
    /* an elastic world was formed again (or could not be): see cfx_context_reform (since 1.2) */ \
    X(CFX_ERR_MEMBERSHIP_CHANGED, MEMBERSHIP_CHANGED, 20, "the elastic world's membership changed")

#define CFX_STATUS_ENUMERATOR_(symbol, name, value, description) symbol = value,
typedef enum cfx_status { CFX_STATUS_LIST(CFX_STATUS_ENUMERATOR_) } cfx_status;
#undef CFX_STATUS_ENUMERATOR_

/* The number of statuses: every value in [0, CFX_STATUS_COUNT) is one of the list. */
#define CFX_STATUS_COUNT 21

/* A short static description of a status ("mismatch across ranks"); never NULL. */
CFX_API const char *cfx_status_string(cfx_status status);
/* The status's name: its symbol without the CFX_ / CFX_ERR_ prefix ("OK", "MISMATCH",
 * "PEER_LOST"), static storage; NULL for a value that is no status, so a binding can enumerate
 * the statuses by counting up from 0 (since 1.1, version node CONFLUX_1.1). */
CFX_API const char *cfx_status_name(cfx_status status);
/* The message of this thread's last failed call ("" before any failure). Successful calls leave
 * it alone, so read it right after a call returned an error. Valid until this thread's next
 * failing Conflux call. Never NULL. */
CFX_API const char *cfx_last_error(void);

/* ---- Data types and reduction ops ------------------------------------------------------------- */

typedef enum cfx_dtype {
    CFX_UINT8 = 0,
    CFX_INT8 = 1,
    CFX_UINT16 = 2,
    CFX_INT16 = 3,
    CFX_INT32 = 4,
    CFX_INT64 = 5,
    CFX_FLOAT16 = 6,  /* IEEE 754 binary16; reduced in float32, rounded to nearest even */
    CFX_BFLOAT16 = 7, /* bfloat16; reduced in float32, rounded to nearest even */
    CFX_FLOAT32 = 8,
    CFX_FLOAT64 = 9,
    CFX_BOOL = 10     /* one byte, 0 or 1; sum/max = or, min/product = and */
} cfx_dtype;

#define CFX_DTYPE_COUNT 11

/* "float32", ...; "unknown" for a value out of range. */
CFX_API const char *cfx_dtype_name(cfx_dtype dtype);
/* Bytes per element; 0 for a value out of range. */
CFX_API size_t cfx_dtype_size(cfx_dtype dtype);

typedef enum cfx_reduce_op {
    CFX_OP_SUM = 0,
    CFX_OP_AVERAGE = 1, /* sum, then postscale / size (see docs/c-api.md for integers and join) */
    CFX_OP_MIN = 2,
    CFX_OP_MAX = 3,
    CFX_OP_PRODUCT = 4,
    /* Adaptive summation (since 1.1): pairs of vectors combine as
     * (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b, per tensor; float16, bfloat16, float32 and
     * float64 host tensors, allreduce only (see docs/c-api.md) */
    CFX_OP_ADASUM = 5
} cfx_reduce_op;

#define CFX_OP_COUNT 6

/* "sum", "average", ...; "unknown" for a value out of range. */
CFX_API const char *cfx_op_name(cfx_reduce_op op);

/* ---- Tensors ---------------------------------------------------------------------------------- */

#define CFX_DEVICE_CPU (-1)
#define CFX_MAX_NDIM 32

/* A tensor description. Conflux copies the description (shape included) at enqueue; the data
 * itself is borrowed until the handle completes. Dense, C-contiguous. */
typedef struct cfx_tensor {
    void *data;           /* may be NULL only when the tensor has zero elements */
    const int64_t *shape; /* ndim extents, each >= 0; may be NULL when ndim == 0 (a scalar) */
    int32_t ndim;         /* 0 .. CFX_MAX_NDIM */
    int32_t dtype;        /* a cfx_dtype */
    int32_t device;       /* CFX_DEVICE_CPU or a CUDA device ordinal */
    void *stream;         /* CUDA stream the producer used (NULL: default stream); CPU: ignored */
} cfx_tensor;

/* ---- Context ---------------------------------------------------------------------------------- */

typedef struct cfx_context cfx_context;

typedef enum cfx_transport_kind {
    CFX_TRANSPORT_AUTO = 0,  /* MPI where mpirun started the job (and MPI is built); Gloo where
                              * another launcher did (cfxrun --transport gloo, torchrun, srun,
                              * Horovod's); the single-process local transport without a launcher */
    CFX_TRANSPORT_MPI = 1,
    CFX_TRANSPORT_LOCAL = 2, /* one process, size 1, no MPI */
    CFX_TRANSPORT_GLOO = 3   /* Gloo over TCP; the world from the launcher (docs/launching.md) */
} cfx_transport_kind;

#define CFX_INIT_OPTIONS_VERSION 1

/* Options for cfx_init. Fill with cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION), then set
 * fields. A negative value means "unset": the CFX_* environment variable or the default applies.
 * Precedence: default < environment < a field set here. Fields are only ever appended. */
typedef struct cfx_init_options {
    uint32_t version;               /* CFX_INIT_OPTIONS_VERSION the caller was built with */
    int32_t transport;              /* a cfx_transport_kind */
    int64_t fusion_threshold_bytes; /* CFX_FUSION_THRESHOLD; 0 disables fusion */
    double cycle_time_ms;           /* CFX_CYCLE_TIME: idle wake-up period of the background thread */
    int64_t cache_capacity;         /* CFX_CACHE_CAPACITY; 0 disables the response cache */
    int32_t log_level;              /* CFX_LOG_LEVEL: 0 trace, 1 debug, 2 info, 3 warning, 4 error, 5 off */
    int32_t deterministic;          /* CFX_DETERMINISTIC: 1 = bitwise reproducible reductions */
    double stall_warning_s;         /* CFX_STALL_WARNING_S */
    double stall_timeout_s;         /* CFX_STALL_TIMEOUT_S; 0 = never */
    int64_t chunk_bytes;            /* CFX_CHUNK_BYTES: pipeline chunk of large reductions */
} cfx_init_options;

/* Fills `opts` with "unset" values for the given struct version. CFX_ERR_VERSION for a version
 * this library does not know. */
CFX_API cfx_status cfx_init_options_init(cfx_init_options *opts, uint32_t version);

/* Creates a context: joins the job, starts the background thread. `opts` may be NULL (all unset).
 * Collective across ranks. The world comes from, in this order: CFX_RANK/CFX_SIZE (with
 * CFX_RENDEZVOUS_ADDR or CFX_RENDEZVOUS_DIR), Open MPI's mpirun (MPI_COMM_WORLD duplicated),
 * torchrun, Slurm's srun, Horovod's Gloo launcher (docs/launching.md); jobs not started by mpirun
 * run over Gloo. A process that sees a launcher's world of more than one rank and cannot join it
 * fails with CFX_ERR_CONFIG naming the launcher and what is missing; no launcher at all gives a
 * world of one. */
CFX_API cfx_status cfx_init(const cfx_init_options *opts, cfx_context **out);

/* A rendezvous store handed in by the caller (e.g. torch.distributed's Store through Python): the
 * ranks meet through it instead of a TCP or file store. Every callback returns 0 on success. */
#define CFX_STORE_CALLBACKS_VERSION 1
typedef struct cfx_store_callbacks {
    uint32_t version; /* CFX_STORE_CALLBACKS_VERSION */
    void *user;       /* passed to every callback; must stay valid while the context lives */
    /* Sets `key` to `len` bytes. */
    int (*set)(void *user, const char *key, const void *data, size_t len);
    /* Copies the value of `key` (already set: Conflux waits first) into buf (cap bytes) and stores
     * its full length in *len; when *len > cap Conflux calls again with a larger buffer. */
    int (*get)(void *user, const char *key, void *buf, size_t cap, size_t *len);
    /* Waits until every key is set: 0 when they are, 1 when timeout_s passed first. */
    int (*wait)(void *user, const char *const *keys, size_t n, double timeout_s);
} cfx_store_callbacks;

/* cfx_init with the ranks meeting through `store` (rank and size still come from the launcher's or
 * the CFX_* variables); the transport is Gloo. CFX_ERR_UNSUPPORTED in a build without Gloo. */
CFX_API cfx_status cfx_init_with_store(const cfx_init_options *opts, const cfx_store_callbacks *store,
                                       cfx_context **out);

/* Creates the context of a group whose members alone call it (since 1.3; e.g. torch's backend
 * creator for dist.new_group, which torch calls on the members only): this process is `rank` of
 * `size`, as the caller says (not the launcher), and the members meet over Gloo through `store`,
 * whose keys must be the group's own (a store shared by several groups: prefix it per group).
 * Processes outside the group take no part and are not waited for. Collective across the members;
 * a group of one meets nobody. CFX_ERR_INVALID_ARGUMENT for a NULL store or out, a size below 1 or
 * a rank outside [0, size), or a transport other than Gloo asked for; CFX_ERR_UNSUPPORTED in a build
 * without Gloo. The callbacks are called from Conflux's threads while the context lives. */
CFX_API cfx_status cfx_init_group(const cfx_init_options *opts, const cfx_store_callbacks *store,
                                  int rank, int size, cfx_context **out);

/* Stops the background thread after telling the other ranks; pending handles complete with
 * CFX_ERR_SHUT_DOWN. The context stays valid for queries (later collectives return
 * CFX_ERR_SHUT_DOWN) until cfx_context_free. Idempotent. MPI is not finalized (re-init works). */
CFX_API cfx_status cfx_shutdown(cfx_context *ctx);

/* Shuts down if needed and frees the context. Accepts NULL. Handles of this context become invalid. */
CFX_API void cfx_context_free(cfx_context *ctx);

/* 1 while the context accepts work, 0 after shutdown (local, or started by another rank) or NULL. */
CFX_API int cfx_is_running(const cfx_context *ctx);

/* Topology. Each returns -1 (and sets cfx_last_error) for a NULL context. Local = ranks on this
 * host; cross = one rank per host with the same local rank. */
CFX_API int cfx_rank(const cfx_context *ctx);
CFX_API int cfx_size(const cfx_context *ctx);
CFX_API int cfx_local_rank(const cfx_context *ctx);
CFX_API int cfx_local_size(const cfx_context *ctx);
CFX_API int cfx_cross_rank(const cfx_context *ctx);
CFX_API int cfx_cross_size(const cfx_context *ctx);

/* The transport the context runs over, by the name CFX_TRANSPORT gives it: "mpi", "gloo", "local",
 * or another transport this build registers (cfx_features has its bit); since 1.4, so that a
 * binding asks the engine rather than guessing from the environment. Static storage. NULL (and
 * cfx_last_error) for a NULL context. */
CFX_API const char *cfx_transport_name(const cfx_context *ctx);

/* ---- Handles ---------------------------------------------------------------------------------- */

/* Identifies one submitted collective. 0 is never a valid handle. A released or unknown handle
 * makes every call below return CFX_ERR_STALE_HANDLE; it never crashes. */
typedef uint64_t cfx_handle;

/* `*out` = 1 when the handle has completed (successfully or not), else 0. */
CFX_API cfx_status cfx_poll(cfx_context *ctx, cfx_handle handle, int *out);

/* Waits for completion, at most timeout_s seconds (negative: no limit). Returns the collective's
 * status, or CFX_ERR_TIMEOUT when the deadline passed first (the handle stays pending). While no
 * other thread does, the waiting thread runs the negotiation itself (no hand-off to the background
 * thread and back; CFX_WAIT_RUNS_CYCLES=0 turns that off). An async collective that nobody waits
 * for starts at the latest after CFX_CYCLE_TIME, or at this thread's next call into Conflux. */
CFX_API cfx_status cfx_wait(cfx_context *ctx, cfx_handle handle, double timeout_s);

/* The collective's status: CFX_ERR_IN_PROGRESS while pending. */
CFX_API cfx_status cfx_handle_status(cfx_context *ctx, cfx_handle handle);

/* The collective's message ("" when it succeeded or is pending); borrowed until release. NULL for a
 * stale handle. */
CFX_API const char *cfx_handle_message(cfx_context *ctx, cfx_handle handle);

/* Releases a handle and its outputs. A pending handle is detached: the collective still runs and
 * its buffers must stay alive until it would have completed. */
CFX_API cfx_status cfx_handle_release(cfx_context *ctx, cfx_handle handle);

/* Number of outputs Conflux allocated for a completed handle (allgather, alltoall, reducescatter:
 * one per input tensor; 0 for the others). */
CFX_API cfx_status cfx_handle_output_count(cfx_context *ctx, cfx_handle handle, size_t *out);

/* Describes output `index` of a completed handle; `out->data` and `out->shape` are borrowed until
 * the handle is released. */
CFX_API cfx_status cfx_handle_output(cfx_context *ctx, cfx_handle handle, size_t index,
                                     cfx_tensor *out);

/* Copies output `index` into `dst` (dst_bytes must be at least the output's size in bytes). */
CFX_API cfx_status cfx_handle_output_copy(cfx_context *ctx, cfx_handle handle, size_t index,
                                          void *dst, size_t dst_bytes);

/* Per-rank row counts of output `index`: for allgather the dim-0 extent each rank contributed, for
 * alltoall the rows received from each rank. `*out` borrows `size` entries until release. */
CFX_API cfx_status cfx_handle_splits(cfx_context *ctx, cfx_handle handle, size_t index,
                                     const int64_t **out);

/* For a completed join: the rank that joined last. */
CFX_API cfx_status cfx_handle_join_rank(cfx_context *ctx, cfx_handle handle, int *out);

/* ---- Collectives ------------------------------------------------------------------------------ */
/*
 * Every collective is asynchronous: it validates its arguments locally, queues the work and returns
 * a handle at once. Ranks may submit tensors in any order; a tensor runs once every rank submitted
 * it under the same name. `name` identifies the tensor across ranks; NULL asks for a generated name
 * ("<op>.noname.<n>", counted per context, so ranks must then submit in the same order). A name may
 * be reused once its previous collective completed.
 */

/* Reduces `input` across ranks. `output` receives the result (same dtype and shape); NULL or
 * input->data means in place. Result = postscale * op(prescale * x_r over ranks r); AVERAGE
 * divides by the number of ranks in addition. */
CFX_API cfx_status cfx_allreduce_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                                       void *output, cfx_reduce_op op, double prescale,
                                       double postscale, cfx_handle *out);

/* Gradient compression on the wire (since 1.1): float32 and float64 tensors travel as 16-bit
 * floats where bytes are expensive, the cross-host leg of the hierarchical path; each rank's
 * values are rounded once when packed, combined in float32, the combination rounded once
 * (whatever the number of hosts) and unpacked to the tensor's dtype (docs/c-api.md "Compression"). The _EVERYWHERE values compress every leg that
 * goes over the transport; CFX_COMPRESSION_EVERYWHERE=1 in the environment makes FP16 and BF16
 * mean them. */
typedef enum cfx_compression {
    CFX_COMPRESSION_NONE = 0,
    CFX_COMPRESSION_FP16 = 1, /* IEEE binary16: 11 significant bits, range +-65504 */
    CFX_COMPRESSION_BF16 = 2, /* bfloat16: 8 significant bits, float32's range */
    CFX_COMPRESSION_FP16_EVERYWHERE = 3,
    CFX_COMPRESSION_BF16_EVERYWHERE = 4
} cfx_compression;

#define CFX_COMPRESSION_COUNT 5

/* Per-call options of cfx_allreduce_async_opts (since 1.1). Version first, only appended to. */
#define CFX_ALLREDUCE_OPTIONS_VERSION 1
typedef struct cfx_allreduce_options {
    uint32_t version;    /* CFX_ALLREDUCE_OPTIONS_VERSION */
    int32_t op;          /* cfx_reduce_op; default CFX_OP_SUM */
    double prescale;     /* default 1.0 */
    double postscale;    /* default 1.0 */
    int32_t compression; /* cfx_compression; default CFX_COMPRESSION_NONE */
    /* appended later, never reordered */
} cfx_allreduce_options;

/* Fills `opts` with the defaults for the given struct version (CFX_ERR_VERSION if unknown). */
CFX_API cfx_status cfx_allreduce_options_init(cfx_allreduce_options *opts, uint32_t version);

/* cfx_allreduce_async with its parameters in `opts` (NULL: the defaults). Every rank must give a
 * tensor the same compression (else CFX_ERR_MISMATCH naming it); compression other than NONE
 * takes float32 and float64 tensors (CFX_ERR_INVALID_ARGUMENT naming the tensor otherwise). */
CFX_API cfx_status cfx_allreduce_async_opts(cfx_context *ctx, const char *name,
                                            const cfx_tensor *input, void *output,
                                            const cfx_allreduce_options *opts, cfx_handle *out);

/* Reduces `count` tensors negotiated and completed together under one handle. Tensor i is named
 * "<name>.<i>". `outputs` may be NULL (all in place) or hold `count` pointers (NULL entries in place). */
CFX_API cfx_status cfx_grouped_allreduce_async(cfx_context *ctx, const char *name, size_t count,
                                               const cfx_tensor *inputs, void *const *outputs,
                                               cfx_reduce_op op, double prescale, double postscale,
                                               cfx_handle *out);

/* Concatenates every rank's `input` along dim 0 (dim 0 may differ per rank, the other dims must
 * match). Output 0 of the handle holds the result; cfx_handle_splits gives each rank's rows. */
CFX_API cfx_status cfx_allgather_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                                       cfx_handle *out);

CFX_API cfx_status cfx_grouped_allgather_async(cfx_context *ctx, const char *name, size_t count,
                                               const cfx_tensor *inputs, cfx_handle *out);

/* Copies root_rank's tensor into `tensor` on every rank, in place. */
CFX_API cfx_status cfx_broadcast_async(cfx_context *ctx, const char *name, const cfx_tensor *tensor,
                                       int root_rank, cfx_handle *out);

/* Sends splits[j] rows of `input` (dim 0, in order) to rank j. `splits` = NULL splits dim 0 equally
 * (it must divide by size); else `nsplits` must equal size. Output 0 holds the received rows;
 * cfx_handle_splits gives the rows received from each rank. */
CFX_API cfx_status cfx_alltoall_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                                      const int64_t *splits, size_t nsplits, cfx_handle *out);

/* Reduces `input` across ranks and leaves rank r the r-th block of dim 0: with d0 rows and n ranks,
 * the first d0 % n ranks get d0 / n + 1 rows, the others d0 / n. Output 0 holds this rank's block. */
CFX_API cfx_status cfx_reducescatter_async(cfx_context *ctx, const char *name,
                                           const cfx_tensor *input, cfx_reduce_op op,
                                           double prescale, double postscale, cfx_handle *out);

CFX_API cfx_status cfx_grouped_reducescatter_async(cfx_context *ctx, const char *name, size_t count,
                                                   const cfx_tensor *inputs, cfx_reduce_op op,
                                                   double prescale, double postscale,
                                                   cfx_handle *out);

/* Completes once every rank reached it. */
CFX_API cfx_status cfx_barrier_async(cfx_context *ctx, cfx_handle *out);

/* Declares that this rank has no more data. Until every rank joined, it takes part in the other
 * ranks' allreduces with the identity of the op; completes when all ranks joined
 * (cfx_handle_join_rank gives the last one). */
CFX_API cfx_status cfx_join_async(cfx_context *ctx, cfx_handle *out);

/* ---- observability (since 1.0) --------------------------------------------------------------
 * The timeline: a Chrome trace-event JSON file per rank of every tensor's phases (queued,
 * negotiate, pack, the collective, unpack), for Perfetto or chrome://tracing and tools/cfx-timeline
 * (docs/timeline.md). CFX_TIMELINE=path starts one at init; these start and stop it at run time.
 * Safe from any thread; not collective (each rank records its own file). */

/* Starts writing this rank's timeline to `path` with the rank inserted: "%r" in `path` is replaced
 * by the rank, otherwise ".rank<r>" goes before the extension ("tl.json" -> "tl.rank0.json").
 * Truncates the file. A running timeline is stopped first. mark_cycles != 0 adds a lane of the
 * background thread's working cycles. Returns once the background thread records into it. */
CFX_API cfx_status cfx_timeline_start(cfx_context *ctx, const char *path, int mark_cycles);

/* Stops the timeline and completes its file (closing bracket) before returning; CFX_OK when none
 * runs or after cfx_shutdown (which completes it). CFX_ERR_SHUT_DOWN when the job stopped on its
 * own (another rank shut down, a transport error): cfx_shutdown then completes the file. */
CFX_API cfx_status cfx_timeline_stop(cfx_context *ctx);

/* ---- Shared tensor memory --------------------------------------------------------------------
 * Memory that the other ranks on this host can read and write directly, like MPI_Alloc_mem. A CPU
 * allreduce whose tensors (input and output) lie in this memory on every rank of a host skips the
 * copies into and out of the shared-memory slots: each local rank reduces its share of the
 * batch straight from every rank's tensors and writes the result straight into every rank's
 * output, about half the memory traffic of tensors in private memory (docs/architecture.md).
 * Tensors anywhere else work as before; ranks may mix.
 * The pool is per process, not per context: memory may be allocated before cfx_init and outlive
 * cfx_shutdown. Its size is reserved address space (CFX_SHARED_POOL_BYTES, default the machine's
 * RAM); pages are taken as they are first touched and given back on cfx_free of large blocks.
 * Safe from any thread. A forked child starts an empty pool of its own. */

/* Allocates `bytes` (0 gives a minimal block) of shared tensor memory, 64-byte aligned; the
 * contents are undefined, as with malloc. CFX_ERR_OUT_OF_MEMORY when the pool has no room (the
 * message gives its use and size); CFX_ERR_CONFIG for a malformed CFX_SHARED_POOL_BYTES. */
CFX_API cfx_status cfx_alloc(size_t bytes, void **out);

/* Returns memory from cfx_alloc; NULL is a no-op. CFX_ERR_INVALID_ARGUMENT for a pointer that
 * cfx_alloc did not return or that was already freed (nothing is changed then). The memory must
 * not be in flight in a collective. */
CFX_API cfx_status cfx_free(void *ptr);

/* 1 when [ptr, ptr + bytes) lies in this process's shared tensor memory, else 0: whether a tensor
 * there can take the direct path (e.g. to give an out-of-place result the same placement). */
CFX_API int cfx_is_shared(const void *ptr, size_t bytes);


/* ---- Gradient sets (since 1.1, version node CONFLUX_1.1) --------------------------------------
 * A framework registers its gradients once and then, every step, only signals which are ready and
 * waits for the averages (docs/c-api.md "Gradient sets", docs/architecture.md). Registration is
 * collective and validated; buckets are planned identically on every rank; with owned storage
 * (the default) each bucket is one contiguous block of shared tensor memory that the framework
 * uses as its gradient buffers, so every step takes the direct path without copies. Per step the
 * engine does O(buckets) work and allocates nothing. */
typedef struct cfx_gradset cfx_gradset;

#define CFX_GRADSET_OPTIONS_VERSION 2 /* 1: without compression (still accepted) */
typedef struct cfx_gradset_options {
    uint32_t version;         /* CFX_GRADSET_OPTIONS_VERSION */
    int32_t op;               /* default CFX_OP_AVERAGE */
    double prescale;          /* default 1.0: applied to each rank's gradients before the sum */
    double postscale;         /* default 1.0: applied to the result (AVERAGE divides as well) */
    int64_t bucket_bytes;     /* default 0: chosen by Conflux (CFX_GRADSET_BUCKET_BYTES) */
    int32_t owned;            /* default 1: Conflux allocates every gradient in shared memory */
    int32_t accumulate_steps; /* default 1: local passes summed before one reduction */
    int32_t compression;      /* since version 2: cfx_compression, default NONE */
    int32_t error_feedback;   /* since version 2, default 0; 1 (with compression): each rank keeps
                               * what rounding took from the values it packed and adds it to the
                               * next step's (buckets then go out one by one) */
    /* appended later, never reordered */
} cfx_gradset_options;

/* Fills `opts` with the defaults for the given struct version (CFX_ERR_VERSION if unknown). */
CFX_API cfx_status cfx_gradset_options_init(cfx_gradset_options *opts, uint32_t version);

/* Creates an empty gradient set on `ctx` (not collective). `name` identifies the set across ranks
 * (every rank uses the same); opts NULL means the defaults. */
CFX_API cfx_status cfx_gradset_create(cfx_context *ctx, const char *name,
                                      const cfx_gradset_options *opts, cfx_gradset **out);

/* Describes one gradient (name, dtype, shape, device). Owned sets: grad->data must be NULL (the
 * storage comes from cfx_gradset_data after commit); borrowed sets (owned = 0): the caller's
 * buffer, which must stay valid until cfx_gradset_free. *out gets the gradient's index in this
 * rank's order of adds (the index ready and data take). Names are unique within a set. */
CFX_API cfx_status cfx_gradset_add(cfx_gradset *set, const char *name, const cfx_tensor *grad,
                                   int32_t *out);

/* Collective over the context's ranks: checks that every rank added the same names with the same
 * dtypes, shapes and kinds of device (in any order; a mismatch fails on every rank with
 * CFX_ERR_MISMATCH naming the first differing gradient, the ranks and both values), plans the
 * buckets identically everywhere and, for owned sets, allocates their storage (zeroed). */
CFX_API cfx_status cfx_gradset_commit(cfx_gradset *set);

/* Owned sets, after commit: the gradient's storage (its bucket's block, at the gradient's offset;
 * the framework's gradient buffer). CFX_ERR_INVALID_ARGUMENT for a borrowed set. */
CFX_API cfx_status cfx_gradset_data(cfx_gradset *set, int32_t index, void **out);

/* The gradient `index` was produced for this pass. Any thread, any order; lock-free except for
 * the call that completes a bucket, which wakes the background thread to send it. With
 * accumulate_steps = k, the first k - 1 passes only count. CFX_ERR_INVALID_ARGUMENT when the
 * gradient is marked more often than accumulate_steps times in one step. */
CFX_API cfx_status cfx_gradset_ready(cfx_gradset *set, int32_t index);

/* Ends the step: gradients never marked ready (unused parameters) are reduced as they are, and
 * it returns once every bucket is reduced (the results are in place). timeout_s < 0 waits without
 * limit; CFX_ERR_TIMEOUT (the step stays pending; call again) names the buckets still missing.
 * Shutdown, a lost peer or a transport error fail it with their status and message. */
CFX_API cfx_status cfx_gradset_wait(cfx_gradset *set, double timeout_s);

/* ---- Subset contexts (since 1.1) --------------------------------------------------------------
 * A context over some of another context's ranks (Horovod's process sets, NCCL's ncclCommSplit):
 * every collective and gradient set works on it unchanged, with its own negotiation, response
 * cache, background thread and data path (shared memory among its ranks on one host). */

/* Collective over ctx's ranks: every rank passes the same list (any order, no duplicates, each in
 * 0 .. size - 1). Members get a new context in *out, whose ranks are numbered in ascending order of
 * their rank in ctx; ranks not listed get *out = NULL and CFX_OK. A bad or disagreeing list fails on
 * every rank with CFX_ERR_INVALID_ARGUMENT naming the rank and the value. Subsets of subsets work.
 * Shutting ctx down shuts its subsets down (their calls then fail with CFX_ERR_SHUT_DOWN); each
 * subset is freed with cfx_context_free, before or after ctx. Create subsets in the same order on
 * every rank, from one thread. */
CFX_API cfx_status cfx_context_create_subset(cfx_context *ctx, const int *ranks, size_t n,
                                             cfx_context **out);

/* Frees the set and its owned storage; NULL is a no-op. Call it on every rank; a step must not be
 * pending. The set's slot in the protocol ends once every rank freed it. */
CFX_API void cfx_gradset_free(cfx_gradset *set);

/* ---- Elastic worlds (since 1.2) ---------------------------------------------------------------
 * A world formed again without restarting the processes still in it: survivors plus newcomers,
 * between a minimum and a maximum size, within a deadline (docs/elastic.md). Gloo transport only
 * (an MPI world cannot shrink). The ranks meet in rounds through a store that outlives every
 * worker: the one cfxrun --elastic serves (CFX_RENDEZVOUS_ADDR with CFX_RENDEZVOUS_EXTERNAL=1) or
 * a file store (CFX_RENDEZVOUS_DIR). Each process has a member id (CFX_ELASTIC_ID, default its
 * launcher rank; the first world's processes have 0..size-1, newcomers larger ones). */

#define CFX_REFORM_OPTIONS_VERSION 1

typedef struct cfx_reform_options {
    uint32_t version;  /* CFX_REFORM_OPTIONS_VERSION */
    int32_t min_size;  /* fewest ranks (default CFX_ELASTIC_MIN_SIZE, else 1) */
    int32_t max_size;  /* most ranks (default CFX_ELASTIC_MAX_SIZE, else 0: no limit) */
    /* The deadline of a round, seconds (default CFX_ELASTIC_TIMEOUT_S, else 60): fewer than
     * min_size by then fails with CFX_ERR_MEMBERSHIP_CHANGED naming who is missing. */
    double timeout_s;
    /* How long a round waits for a member of the previous world that has neither come nor been
     * reported gone by the launcher (default CFX_ELASTIC_SETTLE_S, else 10). */
    double settle_s;
} cfx_reform_options;

/* Fills `opts` with the defaults (CFX_ERR_VERSION for an unknown version). */
CFX_API cfx_status cfx_reform_options_init(cfx_reform_options *opts, uint32_t version);

/* cfx_init for an elastic job: this process joins the first membership round that has not been
 * decided (the first world, or the running job as a newcomer at its next round). `ropts` may be
 * NULL (defaults). */
CFX_API cfx_status cfx_elastic_init(const cfx_init_options *opts, const cfx_reform_options *ropts,
                                    cfx_context **out);

/* Forms ctx's world again, in place (ctx stays valid; its rank and size may change). Every
 * operation still pending fails first with CFX_ERR_MEMBERSHIP_CHANGED (or the CFX_ERR_PEER_LOST
 * that ended the old world), naming what happened; the old world's transport, shared memory,
 * caches and thread are released. Gradient sets of the old world are left detached: their calls
 * fail with CFX_ERR_MEMBERSHIP_CHANGED; free them and create them again. Call it on every
 * surviving rank (after a failure, or all together to let newcomers in); newcomers call
 * cfx_elastic_init. CFX_ERR_UNSUPPORTED for a context not made by cfx_elastic_init. */
CFX_API cfx_status cfx_context_reform(cfx_context *ctx, const cfx_reform_options *opts);

/* The membership round ctx's world was formed in (>= 1), or -1 (and cfx_last_error) when ctx is
 * NULL or not elastic. */
CFX_API int cfx_membership_round(const cfx_context *ctx);

/* This process's member id (-1 as above). */
CFX_API int cfx_member_id(const cfx_context *ctx);

/* How many newcomers are waiting to join the next round (a local look at the store: ranks may see
 * different counts; agree with a collective before reforming). */
CFX_API cfx_status cfx_membership_pending(cfx_context *ctx, int *out);

/* ---- Rendezvous store (since 1.4) ------------------------------------------------------------
 * The engine's TCP store (the one cfxrun and the ranks meet through) as an object of its own, so
 * that a launcher in any language serves it and its tasks speak to it: conflux.spark's and
 * conflux.ray's drivers serve it (their ranks get CFX_RENDEZVOUS_ADDR=host:port and
 * CFX_RENDEZVOUS_EXTERNAL=1), and watch their tasks through its events. Keys are strings of at most
 * 4096 bytes, values byte strings of at most 256 MiB; setting a key again replaces its value.
 * Every call is safe from any thread but cfx_store_free (no other call on the store may be in
 * flight) and cfx_store_next_event (one thread at a time). */

typedef struct cfx_store cfx_store;

/* Serves the store on `port` (0: a free one the system picks; cfx_store_port says which) of every
 * interface, for every world a job forms there, until cfx_store_free. With `events` 1 the store
 * queues what its clients do for cfx_store_next_event (read them as they come: they queue until
 * read); with 0 it keeps none. CFX_ERR_CONFIG naming the port when it is taken (set
 * CFX_RENDEZVOUS_PORT to a free one); CFX_ERR_INVALID_ARGUMENT for a port outside 0..65535, events
 * other than 0 or 1, or a NULL out. */
CFX_API cfx_status cfx_store_serve(int port, int events, cfx_store **out);

/* Connects to the store served at host:port (by cfx_store_serve, cfxrun or a rank 0), trying
 * until timeout_s passed (the server may start later): CFX_ERR_TIMEOUT naming the address and
 * why; CFX_ERR_CONFIG when something other than a Conflux store answers there;
 * CFX_ERR_INVALID_ARGUMENT for an empty host, a port outside 1..65535, a negative timeout_s or a
 * NULL out. A request the server does not answer within timeout_s fails with CFX_ERR_PEER_LOST. */
CFX_API cfx_status cfx_store_connect(const char *host, int port, double timeout_s, cfx_store **out);

/* The port the store is served on (or, for a client, the one it connected to); -1 (and
 * cfx_last_error) for NULL. */
CFX_API int cfx_store_port(const cfx_store *store);

/* Sets `key` to the `len` bytes at `data` (NULL when len is 0). On a served store the key is set
 * in place, and makes no event. CFX_ERR_PEER_LOST when a client's server is gone. */
CFX_API cfx_status cfx_store_set(cfx_store *store, const char *key, const void *data, size_t len);

/* Looks `key` up once, without waiting: *present = 1 when it is set, with its length in *len and
 * its first min(len, cap) bytes copied to buf (buf may be NULL when cap is 0: ask the length, then
 * call again with a buffer that large, as cfx_store_callbacks.get is called); *present = 0 and
 * *len = 0 while it is not set. */
CFX_API cfx_status cfx_store_get(cfx_store *store, const char *key, void *buf, size_t cap,
                                 size_t *len, int *present);

typedef enum cfx_store_event_kind {
    CFX_STORE_EVENT_NONE = 0,  /* no event (cfx_store_next_event timed out) */
    CFX_STORE_EVENT_SET = 1,   /* a client set `key` to `value` */
    CFX_STORE_EVENT_CLOSED = 2 /* a client's connection ended: the client closed it, or its
                                * process died */
} cfx_store_event_kind;

#define CFX_STORE_EVENT_VERSION 1

/* What happened at a served store. The caller sets `version` (CFX_STORE_EVENT_VERSION); the
 * library fills the rest. Fields are only ever appended. */
typedef struct cfx_store_event {
    uint32_t version;    /* CFX_STORE_EVENT_VERSION the caller was built with */
    int32_t kind;        /* a cfx_store_event_kind */
    uint64_t connection; /* the client connection (numbered from 1 in the order they came) */
    const char *key;     /* SET: the key (NUL-terminated); else NULL */
    const void *value;   /* SET: its value, `len` bytes; else NULL. key and value are borrowed
                          * until the next cfx_store_next_event or cfx_store_free */
    size_t len;
} cfx_store_event;

/* The next event of a served store into *out (its version set by the caller), in the order they
 * happened (a connection's SET events come before its CLOSED), waiting at most timeout_s (>= 0)
 * for one: CFX_ERR_TIMEOUT (out->kind NONE) when none came. Events queue until they are read.
 * CFX_ERR_INVALID_ARGUMENT for a client or a store served without events, a negative timeout_s or
 * a NULL out; CFX_ERR_VERSION for a version this library does not know. */
CFX_API cfx_status cfx_store_next_event(cfx_store *store, double timeout_s, cfx_store_event *out);

/* Stops serving (closing every client's connection) or disconnects, and frees the store. Accepts
 * NULL. */
CFX_API void cfx_store_free(cfx_store *store);

#ifdef __cplusplus
}
#endif

#endif /* CONFLUX_CONFLUX_H */
