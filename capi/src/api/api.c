/*
 * api - the ABI entry points: argument checks with messages that name the call, the tensor and the
 * bad value; building queue entries; handle calls; init and shutdown; version and features.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/config.h"
#include "base/clock.h"
#include "engine/context.h"
#include "engine/subset.h"
#include "base/dtype.h"
#include "kernels/dot.h"
#include "base/error.h"
#include "protocol/queue.h"
#include "exec/shared_pool.h"
#include "kernels/compress.h"
#include "engine/world.h"
#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

#define NAME_MAX_LEN 4096

/* ---- version, features -------------------------------------------------------------------- */

int cfx_version(void) { return CFX_VERSION_NUMBER; }

/* From the header's macros, so the string cannot drift from CFX_VERSION_NUMBER. */
#define CX_VERSION_TEXT_(x) #x
#define CX_VERSION_TEXT(x) CX_VERSION_TEXT_(x)
const char *cfx_version_string(void)
{
    return CX_VERSION_TEXT(CFX_VERSION_MAJOR) "." CX_VERSION_TEXT(CFX_VERSION_MINOR) "." CX_VERSION_TEXT(
        CFX_VERSION_PATCH);
}

uint32_t cfx_features(void)
{
    uint32_t f = CFX_FEATURE_LOCAL;
#if CFX_HAVE_MPI
    f |= CFX_FEATURE_MPI;
#endif
#if CFX_HAVE_GLOO
    f |= CFX_FEATURE_GLOO;
#endif
#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
    f |= CFX_FEATURE_CUDA;
    if (cx_cuda_device_count() > 0)
        f |= CFX_FEATURE_CUDA_DEVICE;
#endif
#if defined(CFX_HAVE_NCCL) && CFX_HAVE_NCCL
    f |= CFX_FEATURE_NCCL;
#endif
    return f;
}

/* ---- init options, init, shutdown --------------------------------------------------------- */

cfx_status cfx_init_options_init(cfx_init_options *opts, uint32_t version)
{
    if (!opts)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_options_init: opts is NULL");
    if (version != CFX_INIT_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "cfx_init_options_init: version %u is unknown to this "
                       "library (it knows %d)", version, CFX_INIT_OPTIONS_VERSION);
    memset(opts, 0, sizeof *opts);
    opts->version = version;
    opts->transport = -1;
    opts->fusion_threshold_bytes = -1;
    opts->cycle_time_ms = -1;
    opts->cache_capacity = -1;
    opts->log_level = -1;
    opts->deterministic = -1;
    opts->stall_warning_s = -1;
    opts->stall_timeout_s = -1;
    opts->chunk_bytes = -1;
    return CFX_OK;
}

static cfx_status init_over(const cfx_init_options *opts, const cfx_store_callbacks *store,
                            cfx_context **out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init: out is NULL");
    *out = NULL;
    cx_config cfg;
    cfx_status st = cx_config_load(&cfg, opts);
    if (st)
        return st;
    cx_transport *t;
    if ((st = cx_world_create_transport(&cfg, store, &t)))
        return st;
    return cx_context_create(t, &cfg, out);
}

cfx_status cfx_init(const cfx_init_options *opts, cfx_context **out)
{
    return init_over(opts, NULL, out);
}

cfx_status cfx_init_with_store(const cfx_init_options *opts, const cfx_store_callbacks *store,
                               cfx_context **out)
{
    if (!store)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_with_store: store is NULL");
    return init_over(opts, store, out);
}

/* ---- elastic worlds (engine/membership.h) ------------------------------------------------- */

static cfx_status reform_options(const char *fn, const cfx_reform_options *given,
                                 cfx_reform_options *out)
{
    if (!given)
        return cfx_reform_options_init(out, CFX_REFORM_OPTIONS_VERSION);
    if (given->version != CFX_REFORM_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "%s: reform options version %u is unknown to this library "
                       "(it knows %d)", fn, given->version, CFX_REFORM_OPTIONS_VERSION);
    *out = *given;
    return CFX_OK;
}

cfx_status cfx_elastic_init(const cfx_init_options *opts, const cfx_reform_options *ropts,
                            cfx_context **out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_elastic_init: out is NULL");
    *out = NULL;
    cfx_reform_options o;
    cx_config cfg;
    cfx_status st = reform_options("cfx_elastic_init", ropts, &o);
    if (!st)
        st = cx_config_load(&cfg, opts);
    if (!st && cfg.transport != CFX_TRANSPORT_AUTO && cfg.transport != CFX_TRANSPORT_GLOO)
        st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_elastic_init: an elastic world runs over the "
                     "Gloo transport, but transport %d was asked for (an MPI world cannot shrink)",
                     cfg.transport);
    cx_membership *m = NULL;
    if (!st)
        st = cx_membership_open(&cfg, &m);
    if (!st)
        st = cx_context_create_elastic(m, &cfg, &o, out);
    return st;
}

cfx_status cfx_context_reform(cfx_context *ctx, const cfx_reform_options *opts)
{
    if (!ctx)
        return cx_fail(CFX_ERR_NOT_INITIALIZED, "cfx_context_reform: context is NULL");
    cfx_reform_options o;
    cfx_status st = reform_options("cfx_context_reform", opts, &o);
    return st ? st : cx_context_reform(ctx, &o);
}

static const cx_membership *membership_of(const char *fn, const cfx_context *ctx)
{
    if (!ctx || !ctx->membership)
        cx_fail(ctx ? CFX_ERR_UNSUPPORTED : CFX_ERR_NOT_INITIALIZED, "%s: %s", fn,
                ctx ? "the context is not elastic (made by cfx_elastic_init)" : "context is NULL");
    return ctx ? ctx->membership : NULL;
}

int cfx_membership_round(const cfx_context *ctx)
{
    const cx_membership *m = membership_of("cfx_membership_round", ctx);
    return m ? cx_membership_round(m) : -1;
}

int cfx_member_id(const cfx_context *ctx)
{
    const cx_membership *m = membership_of("cfx_member_id", ctx);
    return m ? cx_membership_id(m) : -1;
}

cfx_status cfx_membership_pending(cfx_context *ctx, int *out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_membership_pending: out is NULL");
    *out = 0;
    if (!membership_of("cfx_membership_pending", ctx))
        return ctx ? CFX_ERR_UNSUPPORTED : CFX_ERR_NOT_INITIALIZED;
    return cx_membership_pending(ctx->membership, out);
}

cfx_status cfx_shutdown(cfx_context *ctx)
{
    if (!ctx)
        return cx_fail(CFX_ERR_NOT_INITIALIZED, "cfx_shutdown: context is NULL");
    return cx_context_shutdown(ctx);
}

void cfx_context_free(cfx_context *ctx) { cx_context_free(ctx); }

int cfx_is_running(const cfx_context *ctx)
{
    return ctx ? atomic_load(&((cfx_context *)ctx)->running) : 0;
}

#define TOPOLOGY_GETTER(fn, field)                                                          \
    int fn(const cfx_context *ctx)                                                          \
    {                                                                                       \
        if (!ctx) {                                                                         \
            cx_fail(CFX_ERR_NOT_INITIALIZED, #fn ": context is NULL (call cfx_init first)"); \
            return -1;                                                                      \
        }                                                                                   \
        return ctx->field;                                                                  \
    }
TOPOLOGY_GETTER(cfx_rank, rank)
TOPOLOGY_GETTER(cfx_size, size)
TOPOLOGY_GETTER(cfx_local_rank, local_rank)
TOPOLOGY_GETTER(cfx_local_size, local_size)
TOPOLOGY_GETTER(cfx_cross_rank, cross_rank)
TOPOLOGY_GETTER(cfx_cross_size, cross_size)

/* ---- argument checks ---------------------------------------------------------------------- */

static cfx_status check_context(const char *fn, cfx_context *ctx, const void *out)
{
    if (!ctx)
        return cx_fail(CFX_ERR_NOT_INITIALIZED, "%s: context is NULL (call cfx_init first)", fn);
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!atomic_load(&ctx->running))
        return cx_fail(CFX_ERR_SHUT_DOWN, "%s: the context has been shut down", fn);
    return CFX_OK;
}

static cfx_status check_name(const char *fn, const char *name)
{
    if (name && (name[0] == '\0' || strlen(name) > NAME_MAX_LEN))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: tensor name must have 1..%d characters "
                       "(or be NULL for a generated one)", fn, NAME_MAX_LEN);
    return CFX_OK;
}

/* A device tensor: in a CUDA build the ordinal must name a usable device, and every device tensor
 * of this rank must use the same one (the context's engine stream and NCCL communicator live on
 * one device; the first device tensor binds it). Without CUDA the build refuses device tensors. */
static cfx_status check_device(cfx_context *ctx, const char *fn, const char *what,
                               const cfx_tensor *t)
{
    if (t->device < 0)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: device %d is neither CFX_DEVICE_CPU "
                       "(-1) nor a CUDA ordinal", fn, what, t->device);
#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
    int count = cx_cuda_device_count();
    if (count <= 0) {
        cx_cuda_probe(); /* the CUDA runtime's reason, for the message */
        char why[CX_ERROR_MAX];
        snprintf(why, sizeof why, "%s", cx_error_message());
        return cx_fail(CFX_ERR_CUDA, "%s: %s: CUDA device %d requested on rank %d, but no CUDA "
                       "device is usable on this machine (%s)", fn, what, t->device, ctx->rank,
                       why[0] ? why : "cudaGetDeviceCount found none");
    }
    if (t->device >= count)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: CUDA device %d does not exist on rank %d: "
                       "it has %d CUDA device%s (ordinals 0..%d)", fn, what, t->device, ctx->rank,
                       count, count == 1 ? "" : "s", count - 1);
    int expected = 0;
    if (atomic_compare_exchange_strong(&ctx->cuda_device_bound, &expected, t->device + 1)) {
        /* From here on no waiting thread runs cycles (cx_context_drive): after the fence, none
         * that started before can meet this tensor. */
        cx_loop_fence(ctx->loop);
        return CFX_OK;
    }
    if (expected != t->device + 1)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: CUDA device %d, but rank %d already "
                       "submitted device tensors on CUDA device %d (one device per rank)", fn, what,
                       t->device, ctx->rank, expected - 1);
    return CFX_OK;
#else
    (void)ctx;
    return cx_fail(CFX_ERR_UNSUPPORTED, "%s: %s: device tensors (CUDA device %d) need a build "
                   "with CUDA (see docs/gpu.md)", fn, what, t->device);
#endif
}

/* Checks a tensor description; *bytes gets its size. `what` names it in messages. */
static cfx_status check_tensor(cfx_context *ctx, const char *fn, const char *what,
                               const cfx_tensor *t, size_t *bytes)
{
    if (!t)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: tensor is NULL", fn, what);
    if (!cx_dtype_valid(t->dtype))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: dtype %d is not a cfx_dtype (0..%d)",
                       fn, what, t->dtype, CFX_DTYPE_COUNT - 1);
    if (t->ndim < 0 || t->ndim > CFX_MAX_NDIM)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: ndim %d is outside 0..%d", fn, what,
                       t->ndim, CFX_MAX_NDIM);
    if (t->ndim > 0 && !t->shape)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: shape is NULL but ndim is %d", fn, what,
                       t->ndim);
    size_t n = cfx_dtype_size((cfx_dtype)t->dtype);
    for (int32_t i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0)
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: dimension %d is negative (%lld)", fn,
                           what, i, (long long)t->shape[i]);
        if (__builtin_mul_overflow(n, (size_t)t->shape[i], &n) || n > (size_t)INT64_MAX)
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: the shape's size in bytes overflows",
                           fn, what);
    }
    if (t->device != CFX_DEVICE_CPU) {
        cfx_status st = check_device(ctx, fn, what, t);
        if (st)
            return st;
    }
    if (n > 0 && !t->data)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: data is NULL for %zu bytes", fn, what, n);
    *bytes = n;
    return CFX_OK;
}

static cfx_status check_reduction(const char *fn, const char *what, const cfx_tensor *t,
                                  cfx_reduce_op op, double prescale, double postscale)
{
    if (!cx_op_valid((int32_t)op))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: op %d is not a cfx_reduce_op (0..%d)", fn,
                       what, (int)op, CFX_OP_COUNT - 1);
    if (t->dtype == CFX_BOOL && op == CFX_OP_AVERAGE)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: average is not defined for bool tensors "
                       "(use sum, min, max or product)", fn, what);
    if (!isfinite(prescale) || !isfinite(postscale))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: scale factors must be finite (prescale "
                       "%g, postscale %g)", fn, what, prescale, postscale);
    return CFX_OK;
}

/* Adasum (exec/adasum.h): float host tensors, allreduce only. */
static cfx_status check_adasum(const char *fn, const char *what, const cfx_tensor *t, int coll)
{
    if (coll != CX_ALLREDUCE)
        return cx_fail(CFX_ERR_UNSUPPORTED, "%s: %s: Adasum is an allreduce op (use sum or average "
                       "here)", fn, what);
    if (!cx_dot_dtype_ok((cfx_dtype)t->dtype))
        return cx_fail(CFX_ERR_UNSUPPORTED, "%s: %s: Adasum reduces float16, bfloat16, float32 and "
                       "float64 tensors, not %s", fn, what, cfx_dtype_name((cfx_dtype)t->dtype));
    if (t->device != CFX_DEVICE_CPU)
        return cx_fail(CFX_ERR_UNSUPPORTED, "%s: %s: Adasum reduces host tensors only (this one "
                       "is on CUDA device %d)", fn, what, t->device);
    return CFX_OK;
}

/* A name for the tensor: the caller's, or "<kind>.noname.<n>". */
static char *make_name(cfx_context *ctx, int coll, const char *prefix, const char *name)
{
    char buf[64];
    if (!name) {
        unsigned long n = atomic_fetch_add(&ctx->noname_counter[coll], 1);
        snprintf(buf, sizeof buf, "%s.noname.%lu", prefix, n);
        name = buf;
    }
    return strdup(name);
}

static cx_entry *new_entry(int coll, char *name, const cfx_tensor *t, size_t bytes, void *output)
{
    cx_entry *e = calloc(1, sizeof *e);
    if (!e) {
        free(name);
        return NULL;
    }
    e->req.name = name;
    e->req.coll = (uint8_t)coll;
    e->req.device = CFX_DEVICE_CPU;
    e->req.prescale = e->req.postscale = 1.0;
    e->req.root = -1;
    e->enqueue_time = cx_now_s();
    if (t) {
        e->req.dtype = (uint8_t)t->dtype;
        e->req.device = t->device;
        e->req.ndim = t->ndim;
        if (t->ndim)
            memcpy(e->req.shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        e->input = t->data;
        e->stream = t->device == CFX_DEVICE_CPU ? NULL : t->stream; /* CPU: ignored (ABI) */
        e->bytes = bytes;
        e->output = output ? output : t->data;
    }
    return e;
}

static void free_entries(cx_entry **entries, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cx_entry_free(entries[i]);
}

/* Creates the handle, pushes the entries and returns the handle; on failure frees everything. */
/* Device tensors: each one's ready point is recorded on its stream here, on the caller's thread
 * (docs/gpu.md), so Conflux's stream later waits for exactly the work queued before the call,
 * not for what the caller queues after it, and a per-thread default stream means the caller's. */
static cfx_status record_ready_events(cx_entry **entries, size_t n)
{
#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
    for (size_t i = 0; i < n; i++) {
        cx_entry *e = entries[i];
        if (e->req.device == CFX_DEVICE_CPU || e->ready_event)
            continue;
        cfx_status st = cx_cuda_record_ready(e->req.device, e->stream, &e->ready_event);
        if (st) {
            char why[CX_ERROR_MAX];
            snprintf(why, sizeof why, "%s", cx_error_message());
            return cx_fail(st, "tensor '%s': %s", e->req.name, why);
        }
    }
#else
    (void)entries, (void)n;
#endif
    return CFX_OK;
}

static cfx_status submit(cfx_context *ctx, cx_entry **entries, size_t n, size_t noutputs,
                         cfx_handle *out)
{
    cfx_handle h;
    cfx_status st = record_ready_events(entries, n);
    if (!st)
        st = cx_handles_create(&ctx->handles, n, noutputs, &h);
    if (st) {
        free_entries(entries, n);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        entries[i]->handle = h;
        entries[i]->part = i;
    }
    if ((st = cx_queue_push(&ctx->queue, entries, n))) {
        cx_handles_discard(&ctx->handles, h);
        free_entries(entries, n);
        return st;
    }
    *out = h;
    return CFX_OK;
}

/* ---- subset contexts ------------------------------------------------------------------------ */

cfx_status cfx_context_create_subset(cfx_context *ctx, const int *ranks, size_t n,
                                     cfx_context **out)
{
    const char *fn = "cfx_context_create_subset";
    cfx_status st = check_context(fn, ctx, out);
    if (st)
        return st;
    *out = NULL;
    /* Every rank's list goes to every rank first, so a bad list fails everywhere alike
     * (engine/subset.h). */
    int size = ctx->size;
    size_t row = cx_subset_row(size);
    int32_t *mine = calloc(row, sizeof *mine), *all = calloc(row * (size_t)size, sizeof *all);
    int *sorted = calloc(row * 2, sizeof *sorted);
    if (!mine || !all || !sorted) {
        free(mine), free(all), free(sorted);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    cx_subset_encode(ranks, n, size, mine);
    int64_t shape[2] = {1, (int64_t)row};
    cfx_tensor t = {mine, shape, 2, CFX_INT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    st = cfx_allgather_async(ctx, "cfx.subset", &t, &h);
    if (!st)
        st = cfx_wait(ctx, h, -1.0);
    if (!st)
        st = cfx_handle_output_copy(ctx, h, 0, all, row * (size_t)size * sizeof *all);
    if (h)
        cfx_handle_release(ctx, h);
    size_t n0 = 0;
    if (!st)
        st = cx_subset_decide(fn, all, size, sorted, &n0);
    if (!st)
        st = cx_context_create_subset(ctx, sorted, n0, out);
    free(mine), free(all), free(sorted);
    return st;
}

/* ---- collectives -------------------------------------------------------------------------- */

/* Shared by the single-tensor and grouped forms of allreduce, allgather and reducescatter. */
typedef struct group_args {
    const char *fn;
    int coll;
    const char *prefix;
    const char *name;
    size_t count;
    const cfx_tensor *inputs;
    void *const *outputs;
    cfx_reduce_op op;
    double prescale, postscale;
    bool grouped;
    uint8_t compression; /* cfx_compression, as it goes on the wire */
} group_args;

/* Every local check of one tensor of a group_args call; `what` labels it in messages. */
static cfx_status check_group_tensor(cfx_context *ctx, const group_args *a, const cfx_tensor *t,
                                     const char *what, size_t *bytes)
{
    cfx_status st = check_tensor(ctx, a->fn, what, t, bytes);
    if (!st && (a->coll == CX_ALLREDUCE || a->coll == CX_REDUCESCATTER))
        st = check_reduction(a->fn, what, t, a->op, a->prescale, a->postscale);
    if (!st && a->op == CFX_OP_ADASUM && (a->coll == CX_ALLREDUCE || a->coll == CX_REDUCESCATTER))
        st = check_adasum(a->fn, what, t, a->coll);
    if (!st && a->compression)
        st = cx_compression_check(a->fn, what, (cfx_dtype)t->dtype, a->op, t->device,
                                  a->compression);
    if (!st && a->coll != CX_ALLREDUCE && t->ndim == 0)
        st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: a scalar (ndim 0) has no first "
                     "dimension to %s along", a->fn, what,
                     a->coll == CX_ALLGATHER ? "concatenate" : "scatter");
    return st;
}

static cfx_status submit_group(cfx_context *ctx, const group_args *a, cfx_handle *out)
{
    cfx_status st = check_context(a->fn, ctx, out);
    if (!st)
        st = check_name(a->fn, a->name);
    if (st)
        return st;
    if (a->count == 0 || !a->inputs)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s", a->fn,
                       a->count == 0 ? "count is 0" : "inputs is NULL");
    if (a->count > (1u << 24))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: count %zu is too large", a->fn, a->count);
    char *group = a->grouped ? make_name(ctx, a->coll, a->prefix, a->name) : NULL;
    if (a->grouped && !group)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", a->fn);
    cx_entry *stack[8];
    cx_entry **entries = a->count <= 8 ? stack : calloc(a->count, sizeof *entries);
    if (!entries) {
        free(group);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu tensors", a->fn, a->count);
    }
    size_t made = 0;
    for (size_t i = 0; i < a->count && !st; i++) {
        const cfx_tensor *t = &a->inputs[i];
        char *name = NULL;
        if (a->grouped) {
            size_t len = strlen(group) + 24;
            if ((name = malloc(len)))
                snprintf(name, len, "%s.%zu", group, i);
        } else {
            name = make_name(ctx, a->coll, a->prefix, a->name);
        }
        if (!name) {
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", a->fn);
            break;
        }
        size_t bytes = 0;
        /* The tensor's label only appears in error messages: checking with an empty one first
         * keeps the formatting off the enqueue path; a failure is checked again, labelled. */
        st = check_group_tensor(ctx, a, t, "", &bytes);
        if (st) {
            char what[NAME_MAX_LEN + 64];
            if (a->grouped)
                snprintf(what, sizeof what, "tensor %zu of group '%s'", i, group);
            else
                snprintf(what, sizeof what, "tensor '%s'", name);
            st = check_group_tensor(ctx, a, t, what, &bytes);
        }
        if (st) {
            free(name);
            break;
        }
        void *output = a->outputs ? a->outputs[i] : NULL;
        cx_entry *e = new_entry(a->coll, name, t, bytes, output);
        if (!e) {
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", a->fn);
            break;
        }
        e->req.op = (uint8_t)a->op;
        e->req.prescale = a->prescale;
        e->req.postscale = a->postscale;
        e->req.compression = a->compression;
        if (a->grouped) {
            e->req.group = strdup(group);
            e->req.group_size = (uint32_t)a->count;
            if (!e->req.group)
                st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", a->fn);
        }
        entries[made++] = e;
    }
    free(group);
    size_t noutputs = a->coll == CX_ALLREDUCE ? 0 : a->count;
    if (st)
        free_entries(entries, made);
    else
        st = submit(ctx, entries, made, noutputs, out);
    if (entries != stack)
        free(entries);
    return st;
}

cfx_status cfx_allreduce_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                               void *output, cfx_reduce_op op, double prescale, double postscale,
                               cfx_handle *out)
{
    void *outputs[1] = {output};
    group_args a = {"cfx_allreduce_async", CX_ALLREDUCE, "allreduce", name, 1, input, outputs, op,
                    prescale, postscale, false, 0};
    return submit_group(ctx, &a, out);
}

cfx_status cfx_allreduce_options_init(cfx_allreduce_options *opts, uint32_t version)
{
    if (!opts)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_allreduce_options_init: opts is NULL");
    if (version != CFX_ALLREDUCE_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "cfx_allreduce_options_init: options version %u is not "
                       "known to this library (it knows %d)", version,
                       CFX_ALLREDUCE_OPTIONS_VERSION);
    memset(opts, 0, sizeof *opts);
    opts->version = version;
    opts->op = CFX_OP_SUM;
    opts->prescale = opts->postscale = 1.0;
    opts->compression = CFX_COMPRESSION_NONE;
    return CFX_OK;
}

cfx_status cfx_allreduce_async_opts(cfx_context *ctx, const char *name, const cfx_tensor *input,
                                    void *output, const cfx_allreduce_options *opts,
                                    cfx_handle *out)
{
    const char *fn = "cfx_allreduce_async_opts";
    cfx_allreduce_options defaults;
    cfx_allreduce_options_init(&defaults, CFX_ALLREDUCE_OPTIONS_VERSION);
    const cfx_allreduce_options *o = opts ? opts : &defaults;
    if (o->version != CFX_ALLREDUCE_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "%s: options version %u is not known to this library "
                       "(fill them with cfx_allreduce_options_init)", fn, o->version);
    uint8_t wire;
    cfx_status st = cx_compression_wire(fn, o->compression, ctx && ctx->cfg.compression_everywhere, &wire);
    if (st)
        return st;
    void *outputs[1] = {output};
    group_args a = {fn, CX_ALLREDUCE, "allreduce", name, 1, input, outputs, (cfx_reduce_op)o->op,
                    o->prescale, o->postscale, false, wire};
    return submit_group(ctx, &a, out);
}

cfx_status cfx_grouped_allreduce_async(cfx_context *ctx, const char *name, size_t count,
                                       const cfx_tensor *inputs, void *const *outputs,
                                       cfx_reduce_op op, double prescale, double postscale,
                                       cfx_handle *out)
{
    group_args a = {"cfx_grouped_allreduce_async", CX_ALLREDUCE, "grouped_allreduce", name, count,
                    inputs, outputs, op, prescale, postscale, true, 0};
    return submit_group(ctx, &a, out);
}

cfx_status cfx_allgather_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                               cfx_handle *out)
{
    group_args a = {"cfx_allgather_async", CX_ALLGATHER, "allgather", name, 1, input, NULL,
                    CFX_OP_SUM, 1.0, 1.0, false, 0};
    return submit_group(ctx, &a, out);
}

cfx_status cfx_grouped_allgather_async(cfx_context *ctx, const char *name, size_t count,
                                       const cfx_tensor *inputs, cfx_handle *out)
{
    group_args a = {"cfx_grouped_allgather_async", CX_ALLGATHER, "grouped_allgather", name, count,
                    inputs, NULL, CFX_OP_SUM, 1.0, 1.0, true, 0};
    return submit_group(ctx, &a, out);
}

cfx_status cfx_reducescatter_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                                   cfx_reduce_op op, double prescale, double postscale,
                                   cfx_handle *out)
{
    group_args a = {"cfx_reducescatter_async", CX_REDUCESCATTER, "reducescatter", name, 1, input,
                    NULL, op, prescale, postscale, false, 0};
    return submit_group(ctx, &a, out);
}

cfx_status cfx_grouped_reducescatter_async(cfx_context *ctx, const char *name, size_t count,
                                           const cfx_tensor *inputs, cfx_reduce_op op,
                                           double prescale, double postscale, cfx_handle *out)
{
    group_args a = {"cfx_grouped_reducescatter_async", CX_REDUCESCATTER, "grouped_reducescatter",
                    name, count, inputs, NULL, op, prescale, postscale, true, 0};
    return submit_group(ctx, &a, out);
}

cfx_status cfx_broadcast_async(cfx_context *ctx, const char *name, const cfx_tensor *tensor,
                               int root_rank, cfx_handle *out)
{
    const char *fn = "cfx_broadcast_async";
    cfx_status st = check_context(fn, ctx, out);
    if (!st)
        st = check_name(fn, name);
    if (st)
        return st;
    char *tname = make_name(ctx, CX_BROADCAST, "broadcast", name);
    if (!tname)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    char what[NAME_MAX_LEN + 16];
    snprintf(what, sizeof what, "tensor '%s'", tname);
    size_t bytes = 0;
    st = check_tensor(ctx, fn, what, tensor, &bytes);
    if (!st && (root_rank < 0 || root_rank >= ctx->size))
        st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: root rank %d is outside 0..%d", fn, what,
                     root_rank, ctx->size - 1);
    if (st) {
        free(tname);
        return st;
    }
    cx_entry *e = new_entry(CX_BROADCAST, tname, tensor, bytes, NULL);
    if (!e)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    e->req.root = root_rank;
    return submit(ctx, &e, 1, 0, out);
}

cfx_status cfx_alltoall_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                              const int64_t *splits, size_t nsplits, cfx_handle *out)
{
    const char *fn = "cfx_alltoall_async";
    cfx_status st = check_context(fn, ctx, out);
    if (!st)
        st = check_name(fn, name);
    if (st)
        return st;
    char *tname = make_name(ctx, CX_ALLTOALL, "alltoall", name);
    if (!tname)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    char what[NAME_MAX_LEN + 16];
    snprintf(what, sizeof what, "tensor '%s'", tname);
    size_t bytes = 0;
    st = check_tensor(ctx, fn, what, input, &bytes);
    if (!st && input->ndim == 0)
        st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: a scalar (ndim 0) cannot be split", fn, what);
    int size = ctx->size;
    int64_t *own = NULL;
    if (!st && !(own = malloc(sizeof(int64_t) * (size_t)size)))
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (!st) {
        int64_t d0 = input->shape[0];
        if (!splits) {
            if (d0 % size != 0)
                st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: dimension 0 (%lld) does not divide "
                             "by the %d ranks; pass splits", fn, what, (long long)d0, size);
            for (int j = 0; j < size; j++)
                own[j] = d0 / size;
        } else if (nsplits != (size_t)size) {
            st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: %zu splits given, one per rank (%d) "
                         "needed", fn, what, nsplits, size);
        } else {
            int64_t sum = 0;
            for (int j = 0; j < size && !st; j++) {
                if (splits[j] < 0)
                    st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: split %d is negative (%lld)", fn,
                                 what, j, (long long)splits[j]);
                own[j] = splits[j];
                sum += splits[j];
            }
            if (!st && sum != d0)
                st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: splits sum to %lld but dimension 0 "
                             "is %lld", fn, what, (long long)sum, (long long)d0);
        }
    }
    if (st) {
        free(own);
        free(tname);
        return st;
    }
    cx_entry *e = new_entry(CX_ALLTOALL, tname, input, bytes, NULL);
    if (!e) {
        free(own);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    e->splits = own;
    return submit(ctx, &e, 1, 1, out);
}

static cfx_status submit_control(const char *fn, cfx_context *ctx, int coll, char *name,
                                 cfx_handle *out)
{
    if (!name)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    cx_entry *e = new_entry(coll, name, NULL, 0, NULL);
    if (!e)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return submit(ctx, &e, 1, 0, out);
}

cfx_status cfx_barrier_async(cfx_context *ctx, cfx_handle *out)
{
    cfx_status st = check_context("cfx_barrier_async", ctx, out);
    if (st)
        return st;
    /* Barriers are counted per context, so the n-th barrier of every rank meets the others'. */
    return submit_control("cfx_barrier_async", ctx, CX_BARRIER,
                          make_name(ctx, CX_BARRIER, "barrier", NULL), out);
}

cfx_status cfx_join_async(cfx_context *ctx, cfx_handle *out)
{
    cfx_status st = check_context("cfx_join_async", ctx, out);
    if (st)
        return st;
    return submit_control("cfx_join_async", ctx, CX_JOIN, strdup("join"), out);
}

/* ---- handles ------------------------------------------------------------------------------ */

#define HANDLE_CALL(fn, expr)                                                                \
    do {                                                                                     \
        if (!ctx)                                                                            \
            return cx_fail(CFX_ERR_NOT_INITIALIZED, fn ": context is NULL");                 \
        return (expr);                                                                       \
    } while (0)

cfx_status cfx_poll(cfx_context *ctx, cfx_handle handle, int *out)
{
    if (ctx && !out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_poll: out is NULL");
    if (ctx)
        cx_queue_pay_wake(&ctx->queue); /* a poller leaves the work to the background thread */
    HANDLE_CALL("cfx_poll", cx_handles_poll(&ctx->handles, handle, out));
}

cfx_status cfx_wait(cfx_context *ctx, cfx_handle handle, double timeout_s)
{
    if (isnan(timeout_s))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_wait: timeout is NaN");
    HANDLE_CALL("cfx_wait", cx_context_wait(ctx, handle, timeout_s));
}

cfx_status cfx_handle_status(cfx_context *ctx, cfx_handle handle)
{
    HANDLE_CALL("cfx_handle_status", cx_handles_status(&ctx->handles, handle));
}

const char *cfx_handle_message(cfx_context *ctx, cfx_handle handle)
{
    if (!ctx) {
        cx_fail(CFX_ERR_NOT_INITIALIZED, "cfx_handle_message: context is NULL");
        return NULL;
    }
    return cx_handles_message(&ctx->handles, handle);
}

cfx_status cfx_handle_release(cfx_context *ctx, cfx_handle handle)
{
    HANDLE_CALL("cfx_handle_release", cx_handles_release(&ctx->handles, handle));
}

cfx_status cfx_handle_output_count(cfx_context *ctx, cfx_handle handle, size_t *out)
{
    if (ctx && !out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_handle_output_count: out is NULL");
    HANDLE_CALL("cfx_handle_output_count", cx_handles_output_count(&ctx->handles, handle, out));
}

cfx_status cfx_handle_output(cfx_context *ctx, cfx_handle handle, size_t index, cfx_tensor *out)
{
    if (ctx && !out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_handle_output: out is NULL");
    HANDLE_CALL("cfx_handle_output", cx_handles_output(&ctx->handles, handle, index, out));
}

cfx_status cfx_handle_output_copy(cfx_context *ctx, cfx_handle handle, size_t index, void *dst,
                                  size_t dst_bytes)
{
    HANDLE_CALL("cfx_handle_output_copy",
                cx_handles_output_copy(&ctx->handles, handle, index, dst, dst_bytes));
}

cfx_status cfx_handle_splits(cfx_context *ctx, cfx_handle handle, size_t index, const int64_t **out)
{
    if (ctx && !out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_handle_splits: out is NULL");
    HANDLE_CALL("cfx_handle_splits", cx_handles_splits(&ctx->handles, handle, index, out));
}

cfx_status cfx_handle_join_rank(cfx_context *ctx, cfx_handle handle, int *out)
{
    if (ctx && !out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_handle_join_rank: out is NULL");
    HANDLE_CALL("cfx_handle_join_rank", cx_handles_join_rank(&ctx->handles, handle, out));
}

/* ---- observability ------------------------------------------------------------------------- */

cfx_status cfx_timeline_start(cfx_context *ctx, const char *path, int mark_cycles)
{
    if (!ctx)
        return cx_fail(CFX_ERR_NOT_INITIALIZED, "cfx_timeline_start: context is NULL");
    if (!path || !*path)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_timeline_start: path is %s",
                       path ? "empty" : "NULL");
    if (strlen(path) >= CX_PATH_MAX)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_timeline_start: path longer than %d bytes",
                       CX_PATH_MAX - 1);
    return cx_context_set_timeline(ctx, path, mark_cycles != 0);
}

cfx_status cfx_timeline_stop(cfx_context *ctx)
{
    if (!ctx)
        return cx_fail(CFX_ERR_NOT_INITIALIZED, "cfx_timeline_stop: context is NULL");
    if (!ctx->thread_started)
        return CFX_OK; /* shutdown already closed it */
    return cx_context_set_timeline(ctx, NULL, false);
}

/* ---- shared tensor memory ------------------------------------------------------------------ */

cfx_status cfx_alloc(size_t bytes, void **out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_alloc: out is NULL");
    return cx_pool_alloc(bytes, out);
}

cfx_status cfx_free(void *ptr)
{
    return cx_pool_free(ptr);
}

int cfx_is_shared(const void *ptr, size_t bytes)
{
    uint64_t off;
    return ptr && cx_pool_offset(ptr, bytes, &off);
}
