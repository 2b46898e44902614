/*
 * handle_calls (api) - the entry points on a handle: poll, wait, status and message, outputs and
 * splits, the joined rank, release. Each checks the context and the output pointer, then asks the
 * context's handle table (protocol/handles.h); waiting goes through the context (cx_context_wait),
 * which may run cycles on the caller's thread.
 */
#include <math.h>
#include <stddef.h>

#include "base/error.h"
#include "engine/context.h"
#include "protocol/handles.h"
#include "protocol/queue.h"

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
