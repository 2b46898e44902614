/*
 * collective_calls (api) - the collective entry points: allreduce (with its options), allgather
 * and reducescatter in their single and grouped forms, broadcast, alltoall, barrier and join. Each
 * checks what only it knows (reduction op and scales, Adasum, compression, root rank, splits),
 * builds its queue entries and submits them (api/submit.h).
 */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/submit.h"
#include "base/dtype.h"
#include "base/error.h"
#include "kernels/compress.h"
#include "kernels/dot.h"
#include "kernels/reduce.h"

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
    cfx_status st = cx_api_check_tensor(ctx, a->fn, what, t, bytes);
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
    cfx_status st = cx_api_check_context(a->fn, ctx, out);
    if (!st)
        st = cx_api_check_name(a->fn, a->name);
    if (st)
        return st;
    if (a->count == 0 || !a->inputs)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s", a->fn,
                       a->count == 0 ? "count is 0" : "inputs is NULL");
    if (a->count > (1u << 24))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: count %zu is too large", a->fn, a->count);
    char *group = a->grouped ? cx_api_make_name(ctx, a->coll, a->prefix, a->name) : NULL;
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
            name = cx_api_make_name(ctx, a->coll, a->prefix, a->name);
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
            char what[CX_API_NAME_MAX + 64];
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
        cx_entry *e = cx_api_new_entry(a->coll, name, t, bytes, output);
        if (!e) {
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", a->fn);
            break;
        }
        e->req.op = (uint8_t)a->op;
        e->req.prescale = cx_tensor_factor(t->dtype, a->prescale);
        e->req.postscale = cx_tensor_factor(t->dtype, a->postscale);
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
        cx_api_free_entries(entries, made);
    else
        st = cx_api_submit(ctx, entries, made, noutputs, out);
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

/* The start of a one-tensor collective (broadcast, alltoall): the context and name checks, the
 * tensor's name (*tname, malloc'd: the caller frees it on failure), its label in `what`
 * (CX_API_NAME_MAX + 16 bytes) and the tensor's checks (*bytes gets its size). */
static cfx_status begin_single(cfx_context *ctx, const char *fn, int coll, const char *prefix,
                               const char *name, const cfx_tensor *t, cfx_handle *out,
                               char **tname, char *what, size_t *bytes)
{
    cfx_status st = cx_api_check_context(fn, ctx, out);
    if (!st)
        st = cx_api_check_name(fn, name);
    if (st)
        return st;
    if (!(*tname = cx_api_make_name(ctx, coll, prefix, name)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    snprintf(what, CX_API_NAME_MAX + 16, "tensor '%s'", *tname);
    return cx_api_check_tensor(ctx, fn, what, t, bytes);
}

cfx_status cfx_broadcast_async(cfx_context *ctx, const char *name, const cfx_tensor *tensor,
                               int root_rank, cfx_handle *out)
{
    const char *fn = "cfx_broadcast_async";
    char *tname = NULL, what[CX_API_NAME_MAX + 16];
    size_t bytes = 0;
    cfx_status st = begin_single(ctx, fn, CX_BROADCAST, "broadcast", name, tensor, out, &tname,
                                 what, &bytes);
    if (!st && (root_rank < 0 || root_rank >= ctx->size))
        st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: root rank %d is outside 0..%d", fn, what,
                     root_rank, ctx->size - 1);
    if (st) {
        free(tname);
        return st;
    }
    cx_entry *e = cx_api_new_entry(CX_BROADCAST, tname, tensor, bytes, NULL);
    if (!e)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    e->req.root = root_rank;
    return cx_api_submit(ctx, &e, 1, 0, out);
}

cfx_status cfx_alltoall_async(cfx_context *ctx, const char *name, const cfx_tensor *input,
                              const int64_t *splits, size_t nsplits, cfx_handle *out)
{
    const char *fn = "cfx_alltoall_async";
    char *tname = NULL, what[CX_API_NAME_MAX + 16];
    size_t bytes = 0;
    cfx_status st = begin_single(ctx, fn, CX_ALLTOALL, "alltoall", name, input, out, &tname, what,
                                 &bytes);
    if (st) {
        free(tname);
        return st;
    }
    if (input->ndim == 0)
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
    cx_entry *e = cx_api_new_entry(CX_ALLTOALL, tname, input, bytes, NULL);
    if (!e) {
        free(own);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    e->splits = own;
    return cx_api_submit(ctx, &e, 1, 1, out);
}

static cfx_status submit_control(const char *fn, cfx_context *ctx, int coll, char *name,
                                 cfx_handle *out)
{
    if (!name)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    cx_entry *e = cx_api_new_entry(coll, name, NULL, 0, NULL);
    if (!e)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return cx_api_submit(ctx, &e, 1, 0, out);
}

cfx_status cfx_barrier_async(cfx_context *ctx, cfx_handle *out)
{
    cfx_status st = cx_api_check_context("cfx_barrier_async", ctx, out);
    if (st)
        return st;
    /* Barriers are counted per context, so the n-th barrier of every rank meets the others'. */
    return submit_control("cfx_barrier_async", ctx, CX_BARRIER,
                          cx_api_make_name(ctx, CX_BARRIER, "barrier", NULL), out);
}

cfx_status cfx_join_async(cfx_context *ctx, cfx_handle *out)
{
    cfx_status st = cx_api_check_context("cfx_join_async", ctx, out);
    if (st)
        return st;
    return submit_control("cfx_join_async", ctx, CX_JOIN, strdup("join"), out);
}
