/*
 * gradset (api) - the cfx_gradset_* entry points: options, registration, and the collective
 * commit: every rank's registration is gathered (two allgathers on the context), checked against
 * rank 0's on every rank alike (so a mismatch fails everywhere with the same message), and the
 * buckets are planned from rank 0's order (api/gradset_plan.h), so the plan is identical
 * everywhere. The run-time half (step state, the loop's protocol) is engine/gradset.c.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/dot.h"
#include "base/error.h"
#include "base/strmap.h"
#include "engine/context.h"
#include "engine/gradset.h"
#include "kernels/compress.h"
#include "api/gradset_plan.h"
#include "protocol/gradset_wire.h"
#include "protocol/wire.h"


cfx_status cfx_gradset_options_init(cfx_gradset_options *opts, uint32_t version)
{
    if (!opts)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_gradset_options_init: opts is NULL");
    if (version != 1 && version != CFX_GRADSET_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "cfx_gradset_options_init: options version %u is not "
                       "known to this library (it knows 1..%d)", version,
                       CFX_GRADSET_OPTIONS_VERSION);
    /* A version 1 caller's struct ends before compression. */
    memset(opts, 0, version == 1 ? offsetof(cfx_gradset_options, compression) : sizeof *opts);
    opts->version = version;
    opts->op = CFX_OP_AVERAGE;
    opts->prescale = opts->postscale = 1.0;
    opts->bucket_bytes = 0;
    opts->owned = 1;
    opts->accumulate_steps = 1;
    if (version >= 2) {
        opts->compression = CFX_COMPRESSION_NONE;
        opts->error_feedback = 0;
    }
    return CFX_OK;
}

/* `everywhere`: CFX_COMPRESSION_EVERYWHERE, agreed at init. */
static cfx_status check_options(const cfx_gradset_options *o, bool everywhere, uint8_t *wire)
{
    const char *fn = "cfx_gradset_create";
    *wire = CFX_COMPRESSION_NONE;
    if (o->version >= 2) {
        cfx_status st = cx_compression_wire(fn, o->compression, everywhere, wire);
        if (st)
            return st;
        if (o->error_feedback != 0 && o->error_feedback != 1)
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: error_feedback is %d (0 or 1)", fn,
                           o->error_feedback);
        if (o->error_feedback && !*wire)
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: error_feedback needs a compression (it "
                           "is none)", fn);
    }
    if (o->version != 1 && o->version != CFX_GRADSET_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "%s: options version %u is not known to this library "
                       "(fill them with cfx_gradset_options_init)", fn, o->version);
    if (!cx_op_valid(o->op))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: op %d is not a cfx_reduce_op", fn, o->op);
    if (!isfinite(o->prescale) || !isfinite(o->postscale))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: prescale %g and postscale %g must be finite",
                       fn, o->prescale, o->postscale);
    if (o->bucket_bytes < 0)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: bucket_bytes %lld is negative (0: chosen by "
                       "Conflux)", fn, (long long)o->bucket_bytes);
    if (o->owned != 0 && o->owned != 1)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: owned is %d (0 or 1)", fn, o->owned);
    if (o->accumulate_steps < 1)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: accumulate_steps %d must be at least 1", fn,
                       o->accumulate_steps);
    return CFX_OK;
}

cfx_status cfx_gradset_create(cfx_context *ctx, const char *name, const cfx_gradset_options *opts,
                              cfx_gradset **out)
{
    if (!ctx)
        return cx_fail(CFX_ERR_NOT_INITIALIZED, "cfx_gradset_create: context is NULL");
    if (!out || !name || !*name || strlen(name) > CX_GRADSET_NAME_MAX)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_gradset_create: %s",
                       !out ? "out is NULL" : "name must be a non-empty string of at most 4096 bytes");
    *out = NULL;
    cfx_gradset_options defaults;
    cfx_gradset_options_init(&defaults, CFX_GRADSET_OPTIONS_VERSION);
    const cfx_gradset_options *o = opts ? opts : &defaults;
    uint8_t wire;
    cfx_status st = check_options(o, ctx->cfg.compression_everywhere, &wire);
    if (st)
        return st;
    if (!atomic_load(&ctx->running))
        return cx_fail(CFX_ERR_SHUT_DOWN, "cfx_gradset_create: the context has been shut down");
    cfx_gradset *s = calloc(1, sizeof *s);
    if (!s || !(s->name = strdup(name))) {
        free(s);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for gradient set '%s'", name);
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->done_cv, &attr);
    pthread_condattr_destroy(&attr);
    s->ctx = ctx;
    s->op = o->op;
    s->prescale = o->prescale;
    s->postscale = o->postscale;
    s->bucket_bytes = o->bucket_bytes ? o->bucket_bytes : ctx->cfg.gradset_bucket_bytes;
    s->owned = o->owned;
    s->accumulate_steps = o->accumulate_steps;
    s->compression = wire;
    s->error_feedback = o->version >= 2 ? o->error_feedback : 0;
    *out = s;
    return CFX_OK;
}

static cfx_status check_set(const char *fn, cfx_gradset *set, bool want_committed)
{
    if (!set)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: set is NULL", fn);
    if (!set->ctx)
        return cx_fail(CFX_ERR_SHUT_DOWN, "%s: gradient set '%s': its context was freed", fn,
                       set->name);
    if (set->committed != want_committed)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: gradient set '%s' is %s", fn, set->name,
                       set->committed ? "already committed (add gradients before cfx_gradset_commit)"
                                      : "not committed yet (call cfx_gradset_commit first)");
    return CFX_OK;
}

cfx_status cfx_gradset_add(cfx_gradset *set, const char *name, const cfx_tensor *grad,
                           int32_t *out)
{
    const char *fn = "cfx_gradset_add";
    cfx_status st = check_set(fn, set, false);
    if (st)
        return st;
    if (!name || !*name || strlen(name) > CX_GRADSET_NAME_MAX || !grad || !out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: set '%s': %s", fn, set->name,
                       !grad ? "grad is NULL" : !out ? "out is NULL"
                       : "the gradient's name must be a non-empty string of at most 4096 bytes");
    if (!cx_dtype_valid(grad->dtype))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: gradient '%s': dtype %d is not a cfx_dtype",
                       fn, name, grad->dtype);
    if (grad->ndim < 0 || grad->ndim > CFX_MAX_NDIM || (grad->ndim && !grad->shape))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: gradient '%s': ndim %d (0 .. %d, shape "
                       "non-NULL)", fn, name, grad->ndim, CFX_MAX_NDIM);
    int64_t elements = 1;
    for (int32_t d = 0; d < grad->ndim; d++) {
        if (grad->shape[d] < 0 || (grad->shape[d] && elements > INT64_MAX / grad->shape[d]))
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: gradient '%s': extent %lld of dimension "
                           "%d", fn, name, (long long)grad->shape[d], d);
        elements *= grad->shape[d];
    }
    if (grad->device < CFX_DEVICE_CPU)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: gradient '%s': device %d", fn, name,
                       grad->device);
    if (set->op == CFX_OP_ADASUM && (!cx_dot_dtype_ok((cfx_dtype)grad->dtype) ||
                                     grad->device != CFX_DEVICE_CPU))
        return cx_fail(CFX_ERR_UNSUPPORTED, "%s: gradient '%s': Adasum reduces float16, bfloat16, "
                       "float32 and float64 host tensors, not %s%s", fn, name,
                       cfx_dtype_name((cfx_dtype)grad->dtype),
                       grad->device != CFX_DEVICE_CPU ? " on a CUDA device" : "");
    if (set->compression) {
        char what[CX_GRADSET_NAME_MAX + 16];
        snprintf(what, sizeof what, "gradient '%s'", name);
        st = cx_compression_check(fn, what, (cfx_dtype)grad->dtype, (cfx_reduce_op)set->op,
                                  grad->device, set->compression);
        if (st)
            return st;
    }
    if (set->owned && grad->device != CFX_DEVICE_CPU)
        return cx_fail(CFX_ERR_UNSUPPORTED, "%s: gradient '%s' is on CUDA device %d: owned storage "
                       "is host memory; register device gradients in a set with owned = 0", fn,
                       name, grad->device);
    if (set->owned && grad->data)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: gradient '%s': data must be NULL in an owned "
                       "set (its storage comes from cfx_gradset_data)", fn, name);
    if (!set->owned && !grad->data && elements)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: gradient '%s': data is NULL in a borrowed "
                       "set", fn, name);
    for (int32_t i = 0; i < set->ngrads; i++)
        if (strcmp(set->grads[i].name, name) == 0)
            return cx_fail(CFX_ERR_DUPLICATE_NAME, "%s: set '%s' already has a gradient '%s'", fn,
                           set->name, name);
    if (set->ngrads == set->cap_grads) {
        int32_t cap = set->cap_grads ? 2 * set->cap_grads : 64;
        cx_grad *g = realloc(set->grads, (size_t)cap * sizeof *g);
        if (!g)
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory adding gradient '%s'", name);
        set->grads = g;
        set->cap_grads = cap;
    }
    cx_grad *g = &set->grads[set->ngrads];
    memset(g, 0, sizeof *g);
    if (!(g->name = strdup(name)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory adding gradient '%s'", name);
    g->dtype = grad->dtype;
    g->device = grad->device;
    g->ndim = grad->ndim;
    if (grad->ndim)
        memcpy(g->shape, grad->shape, sizeof(int64_t) * (size_t)grad->ndim);
    g->elements = (size_t)elements;
    g->bytes = (size_t)elements * cfx_dtype_size((cfx_dtype)grad->dtype);
    g->data = grad->data;
    *out = set->ngrads++;
    return CFX_OK;
}

/* ---- the registration on the wire (protocol/gradset_wire.h) ------------------------------------ */

typedef cx_gradset_reg reg_grad;

/* Writes the set's registration into buf (NULL: measures) and returns its length. */
static size_t encode_registration(const cfx_gradset *s, uint8_t *buf)
{
    size_t len = 0;
    cx_gradset_wire_header(buf, &len, (uint32_t)s->ngrads, s->compression);
    for (int32_t i = 0; i < s->ngrads; i++) {
        const cx_grad *g = &s->grads[i];
        reg_grad r = {g->name, (uint32_t)strlen(g->name), g->dtype,
                      g->device == CFX_DEVICE_CPU ? CFX_DEVICE_CPU : 0, g->ndim, {0}};
        memcpy(r.shape, g->shape, sizeof(int64_t) * (size_t)g->ndim);
        cx_gradset_wire_grad(buf, &len, &r);
    }
    return len;
}

static void describe(const reg_grad *g, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "%s%s [", cfx_dtype_name((cfx_dtype)g->dtype),
                                   g->device == CFX_DEVICE_CPU ? "" : " (CUDA)");
    for (int32_t d = 0; d < g->ndim && used < size; d++)
        used += (size_t)snprintf(buf + used, size - used, "%s%lld", d ? ", " : "",
                                 (long long)g->shape[d]);
    if (used < size)
        snprintf(buf + used, size - used, "]");
}

static bool same_grad(const reg_grad *a, const reg_grad *b)
{
    return a->dtype == b->dtype && a->device == b->device && a->ndim == b->ndim &&
           memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0;
}

/* Finds `name` in regs (linear is fine for the error path only; the hot lookups use maps). */
static const reg_grad *find_reg(const reg_grad *regs, uint32_t n, const char *name, uint32_t len)
{
    for (uint32_t i = 0; i < n; i++)
        if (regs[i].name_len == len && memcmp(regs[i].name, name, len) == 0)
            return &regs[i];
    return NULL;
}

/* Checks every rank's registration against rank 0's; the same verdict on every rank. */
static cfx_status validate(const char *set, reg_grad *const *regs, const uint32_t *counts,
                           int size)
{
    cx_strmap index;
    for (int r = 1; r < size; r++) {
        cx_strmap_init(&index);
        char key[CX_GRADSET_NAME_MAX + 1];
        for (uint32_t i = 0; i < counts[r]; i++) {
            memcpy(key, regs[r][i].name, regs[r][i].name_len);
            key[regs[r][i].name_len] = '\0';
            if (!cx_strmap_put(&index, key, &regs[r][i])) {
                cx_strmap_destroy(&index);
                return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory checking gradient set '%s'",
                               set);
            }
        }
        for (uint32_t i = 0; i < counts[0]; i++) {
            const reg_grad *a = &regs[0][i];
            memcpy(key, a->name, a->name_len);
            key[a->name_len] = '\0';
            const reg_grad *b = cx_strmap_get(&index, key);
            if (!b || !same_grad(a, b)) {
                char da[160], db[160];
                describe(a, da, sizeof da);
                if (b)
                    describe(b, db, sizeof db);
                cx_strmap_destroy(&index);
                if (!b)
                    return cx_fail(CFX_ERR_MISMATCH, "cfx_gradset_commit: gradient set '%s': "
                                   "gradient '%s' (%s) is registered on rank 0 but not on rank %d",
                                   set, key, da, r);
                return cx_fail(CFX_ERR_MISMATCH, "cfx_gradset_commit: gradient set '%s': gradient "
                               "'%s' is %s on rank 0 but %s on rank %d", set, key, da, db, r);
            }
        }
        cx_strmap_destroy(&index);
        if (counts[r] != counts[0]) { /* every name of rank 0 was found: rank r has more */
            for (uint32_t i = 0; i < counts[r]; i++) {
                const reg_grad *b = &regs[r][i];
                if (!find_reg(regs[0], counts[0], b->name, b->name_len)) {
                    memcpy(key, b->name, b->name_len);
                    key[b->name_len] = '\0';
                    return cx_fail(CFX_ERR_MISMATCH, "cfx_gradset_commit: gradient set '%s': "
                                   "rank %d registered gradient '%s', which rank 0 did not (%u "
                                   "gradients on rank 0, %u on rank %d)", set, r, key, counts[0],
                                   counts[r], r);
                }
            }
        }
    }
    return CFX_OK;
}

/* Gathers every rank's bytes: *all (malloc'ed) holds them back to back, lens[r] each one's. */
static cfx_status gather_registrations(cfx_gradset *s, const void *mine, size_t len, void **all,
                                       int64_t *lens)
{
    cfx_context *ctx = s->ctx;
    int size = ctx->size;
    char name[CX_GRADSET_NAME_MAX + 64];
    int64_t my_len = (int64_t)len;
    int64_t one = 1, n = (int64_t)len;
    cfx_tensor t_len = {&my_len, &one, 1, CFX_INT64, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    snprintf(name, sizeof name, "cfx.gradset.%s.commit.sizes", s->name);
    cfx_status st = cfx_allgather_async(ctx, name, &t_len, &h);
    if (!st)
        st = cfx_wait(ctx, h, -1.0);
    if (!st)
        st = cfx_handle_output_copy(ctx, h, 0, lens, sizeof(int64_t) * (size_t)size);
    if (h)
        cfx_handle_release(ctx, h);
    if (st)
        return st;
    size_t total = 0;
    for (int r = 0; r < size; r++)
        total += (size_t)lens[r];
    if (!(*all = malloc(total ? total : 1)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory gathering gradient set '%s'", s->name);
    cfx_tensor t_bytes = {(void *)mine, &n, 1, CFX_UINT8, CFX_DEVICE_CPU, NULL};
    h = 0;
    snprintf(name, sizeof name, "cfx.gradset.%s.commit.names", s->name);
    st = cfx_allgather_async(ctx, name, &t_bytes, &h);
    if (!st)
        st = cfx_wait(ctx, h, -1.0);
    if (!st)
        st = cfx_handle_output_copy(ctx, h, 0, *all, total);
    if (h)
        cfx_handle_release(ctx, h);
    if (st) {
        free(*all);
        *all = NULL;
    }
    return st;
}

cfx_status cfx_gradset_commit(cfx_gradset *set)
{
    cfx_status st = check_set("cfx_gradset_commit", set, false);
    if (st)
        return st;
    int size = set->ctx->size;
    size_t len = encode_registration(set, NULL); /* measure */
    uint8_t *mine = malloc(len);
    if (!mine)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for gradient set '%s'", set->name);
    encode_registration(set, mine);
    int64_t *lens = calloc((size_t)size, sizeof *lens);
    uint32_t *counts = calloc((size_t)size, sizeof *counts);
    reg_grad **regs = calloc((size_t)size, sizeof *regs);
    void *all = NULL;
    if (!lens || !counts || !regs)
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for gradient set '%s'", set->name);
    if (!st)
        st = gather_registrations(set, mine, len, &all, lens);
    size_t off = 0;
    uint32_t comp0 = 0, comp = 0;
    for (int r = 0; r < size && !st; r++) {
        if (lens[r] < 0 || !cx_gradset_wire_decode((const uint8_t *)all + off, (size_t)lens[r],
                                                &regs[r], &counts[r], &comp))
            st = cx_fail(CFX_ERR_TRANSPORT, "cfx_gradset_commit: gradient set '%s': rank %d sent "
                         "a malformed registration (%lld bytes)", set->name, r, (long long)lens[r]);
        else if (r == 0)
            comp0 = comp;
        else if (comp != comp0)
            st = cx_fail(CFX_ERR_MISMATCH, "cfx_gradset_commit: gradient set '%s': mismatched "
                         "compression: rank 0 asked for %s but rank %d for %s", set->name,
                         cx_compression_name((uint8_t)comp0), r,
                         cx_compression_name((uint8_t)comp));
        off += (size_t)lens[r];
    }
    if (!st)
        st = validate(set->name, regs, counts, size);
    if (!st)
        st = cx_gradset_plan(set, regs[0], counts[0]);
    if (!st) {
        set->committed = true;
        cx_gradset_reset_step(set);
        st = cx_gradsets_attach(&set->ctx->gradsets, set);
        if (st)
            set->committed = false;
    }
    char msg[CX_ERROR_MAX];
    if (st)
        snprintf(msg, sizeof msg, "%s", cx_error_message());
    for (int r = 0; regs && r < size; r++)
        free(regs[r]);
    free(regs);
    free(counts);
    free(lens);
    free(all);
    free(mine);
    return st ? cx_fail(st, "%s", msg) : CFX_OK;
}

cfx_status cfx_gradset_data(cfx_gradset *set, int32_t index, void **out)
{
    cfx_status st = check_set("cfx_gradset_data", set, true);
    if (st)
        return st;
    if (!out || index < 0 || index >= set->ngrads)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_gradset_data: set '%s': %s", set->name,
                       !out ? "out is NULL" : "index out of range");
    if (!set->owned)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_gradset_data: set '%s' is borrowed (owned = "
                       "0): its gradients are the caller's buffers", set->name);
    *out = set->grads[index].data;
    return CFX_OK;
}

cfx_status cfx_gradset_ready(cfx_gradset *set, int32_t index)
{
    if (!set || !set->committed || !set->ctx || index < 0 || index >= set->ngrads) {
        cfx_status st = check_set("cfx_gradset_ready", set, true);
        return st ? st : cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_gradset_ready: set '%s': index %d "
                                 "out of range (%d gradients)", set->name, index, set->ngrads);
    }
    if (atomic_load_explicit(&set->failed, memory_order_relaxed))
        return cx_fail(set->fail_status, "%s", set->fail_message);
    return cx_gradset_ready(set, index);
}

cfx_status cfx_gradset_wait(cfx_gradset *set, double timeout_s)
{
    cfx_status st = check_set("cfx_gradset_wait", set, true);
    if (st)
        return st;
    if (isnan(timeout_s))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_gradset_wait: timeout is NaN");
    /* The last buckets run on this thread when no other runs the cycles (cx_context_drive). */
    cx_gradset_mark_unused(set);
    return cx_gradset_wait(set, cx_context_drive_for(set->ctx, cx_gradset_step_over, set, timeout_s));
}

void cfx_gradset_free(cfx_gradset *set)
{
    if (!set)
        return;
    cx_gradsets_release(set->registry, set);
}
