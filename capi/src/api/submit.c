/*
 * submit (api) - what every collective entry point does before and after its own checks: the
 * context, name and tensor checks with messages that name the call, the tensor and the bad value;
 * generated names; queue entries; and the submission (ready events of device tensors, the handle,
 * the push onto the queue). See api/submit.h.
 */
#include "api/submit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/error.h"
#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
#include "cuda/cuda_kernels.h"
#endif

cfx_status cx_api_check_context(const char *fn, cfx_context *ctx, const void *out)
{
    if (!ctx)
        return cx_fail(CFX_ERR_NOT_INITIALIZED, "%s: context is NULL (call cfx_init first)", fn);
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!atomic_load(&ctx->running))
        return cx_fail(CFX_ERR_SHUT_DOWN, "%s: the context has been shut down", fn);
    return CFX_OK;
}

cfx_status cx_api_check_name(const char *fn, const char *name)
{
    if (name && (name[0] == '\0' || strlen(name) > CX_API_NAME_MAX))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: tensor name must have 1..%d characters "
                       "(or be NULL for a generated one)", fn, CX_API_NAME_MAX);
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

cfx_status cx_api_check_tensor(cfx_context *ctx, const char *fn, const char *what,
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

char *cx_api_make_name(cfx_context *ctx, int coll, const char *prefix, const char *name)
{
    char buf[64];
    if (!name) {
        unsigned long n = atomic_fetch_add(&ctx->noname_counter[coll], 1);
        snprintf(buf, sizeof buf, "%s.noname.%lu", prefix, n);
        name = buf;
    }
    return strdup(name);
}

cx_entry *cx_api_new_entry(int coll, char *name, const cfx_tensor *t, size_t bytes, void *output)
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

void cx_api_free_entries(cx_entry **entries, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cx_entry_free(entries[i]);
}

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

cfx_status cx_api_submit(cfx_context *ctx, cx_entry **entries, size_t n, size_t noutputs,
                                cfx_handle *out)
{
    cfx_handle h;
    cfx_status st = record_ready_events(entries, n);
    if (!st)
        st = cx_handles_create(&ctx->handles, n, noutputs, &h);
    if (st) {
        cx_api_free_entries(entries, n);
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        entries[i]->handle = h;
        entries[i]->part = i;
    }
    if ((st = cx_queue_push(&ctx->queue, entries, n))) {
        cx_handles_discard(&ctx->handles, h);
        cx_api_free_entries(entries, n);
        return st;
    }
    *out = h;
    return CFX_OK;
}
