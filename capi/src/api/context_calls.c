/*
 * context_calls (api) - the entry points of the library and of a context's life: version and
 * features; init options, init (plain, with a store, elastic) and shutdown; elastic reform and
 * membership; topology; subset contexts; the timeline; shared tensor memory. The collectives are
 * in collective_calls.c, the calls on a handle in handle_calls.c.
 */
#include <stdlib.h>
#include <string.h>

#include "api/submit.h"
#include "base/config.h"
#include "base/error.h"
#include "base/launch_env.h"
#include "engine/context.h"
#include "engine/subset.h"
#include "engine/world.h"
#include "transport/registry.h"
#include "exec/shared_pool.h"
#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

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
    uint32_t f = cx_transport_features(); /* the transports this build has (transport/registry.h) */
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

/* A context over the world the configuration (read once, here) finds. */
static cfx_status init_over(const cx_config *cfg, const cfx_store_callbacks *store, cfx_context **out)
{
    cx_transport *t;
    cfx_status st = cx_world_create_transport(cfg, store, &t);
    return st ? st : cx_context_create(t, cfg, out);
}

static cfx_status elastic_over(const cx_config *cfg, const cfx_reform_options *ropts,
                               cfx_context **out);

cfx_status cfx_init(const cfx_init_options *opts, cfx_context **out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init: out is NULL");
    *out = NULL;
    cx_config cfg;
    cfx_status st = cx_config_load(&cfg, opts);
    if (st)
        return st;
    /* A worker of cfxrun --elastic (CFX_ELASTIC=1) joins the elastic job whatever the binding,
     * with the job's reform defaults (CFX_ELASTIC_MIN_SIZE, ...). */
    if (!cfg.launch_status && cfg.launch.elastic)
        return elastic_over(&cfg, NULL, out);
    return init_over(&cfg, NULL, out);
}

cfx_status cfx_init_with_store(const cfx_init_options *opts, const cfx_store_callbacks *store,
                               cfx_context **out)
{
    if (!store)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_with_store: store is NULL");
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init: out is NULL");
    *out = NULL;
    cx_config cfg;
    cfx_status st = cx_config_load(&cfg, opts);
    return st ? st : init_over(&cfg, store, out);
}

/* A group's members alone meet (torch's new_group calls its backend on members only), so neither
 * the launcher nor a parent context may be asked: rank and size are the caller's. */
cfx_status cfx_init_group(const cfx_init_options *opts, const cfx_store_callbacks *store, int rank,
                          int size, cfx_context **out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_group: out is NULL");
    *out = NULL;
    if (!store)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_group: store is NULL");
    if (size < 1 || rank < 0 || rank >= size)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_group: rank %d of size %d: the size "
                       "must be at least 1 and the rank in [0, size)", rank, size);
    cx_config cfg;
    cfx_status st = cx_config_load(&cfg, opts);
    if (st)
        return st;
    cx_transport *t;
    if ((st = cx_world_join_group(&cfg, store, rank, size, &t)))
        return st;
    return cx_context_create(t, &cfg, out);
}

/* ---- elastic worlds (engine/membership.h) ------------------------------------------------- */

static cfx_reform_options reform_defaults(const cx_elastic_defaults *d)
{
    return (cfx_reform_options){.version = CFX_REFORM_OPTIONS_VERSION, .min_size = d->min_size,
                                .max_size = d->max_size, .timeout_s = d->timeout_s,
                                .settle_s = d->settle_s};
}

cfx_status cfx_reform_options_init(cfx_reform_options *opts, uint32_t version)
{
    if (!opts)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_reform_options_init: opts is NULL");
    if (version != CFX_REFORM_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "cfx_reform_options_init: version %u is unknown to this "
                       "library (it knows %d)", version, CFX_REFORM_OPTIONS_VERSION);
    /* Outside any init: this entry point reads the job's defaults itself. */
    cx_elastic_defaults d;
    cfx_status st = cx_launch_elastic_defaults(cx_config_environment, NULL, &d);
    if (st)
        return st;
    *opts = reform_defaults(&d);
    return CFX_OK;
}

/* The options given, or the defaults read at init. */
static cfx_status reform_options(const char *fn, const cfx_reform_options *given,
                                 const cx_config *cfg, cfx_reform_options *out)
{
    if (!given) {
        *out = reform_defaults(&cfg->elastic);
        return CFX_OK;
    }
    if (given->version != CFX_REFORM_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "%s: reform options version %u is unknown to this library "
                       "(it knows %d)", fn, given->version, CFX_REFORM_OPTIONS_VERSION);
    *out = *given;
    return CFX_OK;
}

static cfx_status elastic_over(const cx_config *cfg, const cfx_reform_options *ropts,
                               cfx_context **out)
{
    cfx_reform_options o;
    cfx_status st = reform_options("cfx_elastic_init", ropts, cfg, &o);
    cx_membership *m = NULL;
    if (!st)
        st = cx_membership_open(cfg, &m);
    if (!st)
        st = cx_context_create_elastic(m, cfg, &o, out);
    return st;
}

cfx_status cfx_elastic_init(const cfx_init_options *opts, const cfx_reform_options *ropts,
                            cfx_context **out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_elastic_init: out is NULL");
    *out = NULL;
    cx_config cfg;
    cfx_status st = cx_config_load(&cfg, opts);
    return st ? st : elastic_over(&cfg, ropts, out);
}

cfx_status cfx_context_reform(cfx_context *ctx, const cfx_reform_options *opts)
{
    if (!ctx)
        return cx_fail(CFX_ERR_NOT_INITIALIZED, "cfx_context_reform: context is NULL");
    cfx_reform_options o;
    cfx_status st = reform_options("cfx_context_reform", opts, &ctx->cfg, &o);
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

/* The transport's name is its registry entry's (transport.h: ops->name), kept by every layer over
 * it (the shared-memory layer, a subset's split). */
const char *cfx_transport_name(const cfx_context *ctx)
{
    if (!ctx) {
        cx_fail(CFX_ERR_NOT_INITIALIZED, "cfx_transport_name: context is NULL (call cfx_init first)");
        return NULL;
    }
    return ctx->transport_name;
}

/* ---- subset contexts ------------------------------------------------------------------------ */

cfx_status cfx_context_create_subset(cfx_context *ctx, const int *ranks, size_t n,
                                     cfx_context **out)
{
    const char *fn = "cfx_context_create_subset";
    cfx_status st = cx_api_check_context(fn, ctx, out);
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
    /* The pool belongs to the process and may be made before any context: this entry point reads
     * its size (used when the call makes the pool). */
    int64_t pool_bytes;
    cfx_status st = cx_config_shared_pool_bytes(cx_config_environment, NULL, &pool_bytes);
    return st ? st : cx_pool_alloc(bytes, pool_bytes, out);
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
