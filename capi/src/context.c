/* context - lifetime of a cfx_context (see context.h). */
#include "context.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "loop.h"

/* Every rank adopts rank 0's shape-deciding settings; a rank whose own differ says so. */
static cfx_status agree_config(cfx_context *ctx)
{
    cx_transport *t = ctx->transport;
    if (t->size == 1)
        return CFX_OK;
    cx_config_agreed mine, *agreed = &mine;
    cx_config_get_agreed(&ctx->cfg, &mine);
    void *buf = &mine;
    size_t len = sizeof mine;
    cfx_status st = t->ops->bcast_bytes(t, &buf, &len, 0);
    if (st)
        return st;
    if (t->rank != 0) {
        if (len != sizeof mine) {
            free(buf);
            return cx_fail(CFX_ERR_INTERNAL, "configuration from rank 0 has %zu bytes, %zu expected",
                           len, sizeof mine);
        }
        agreed = buf;
        if (memcmp(agreed, &mine, sizeof mine) != 0)
            cx_log(&ctx->log, CX_LOG_WARNING, "context", "this rank's settings (CFX_* variables or "
                   "options) differ from rank 0's; using rank 0's so that all ranks fuse and chunk "
                   "alike");
        cx_config_set_agreed(&ctx->cfg, agreed);
        free(buf);
    }
    return CFX_OK;
}

static cfx_status open_log(cfx_context *ctx)
{
    ctx->log.level = ctx->cfg.log_level;
    ctx->log.rank = ctx->rank;
    ctx->log.fd = 2;
    if (ctx->cfg.log_file[0]) {
        int fd = open(ctx->cfg.log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0)
            return cx_fail(CFX_ERR_CONFIG, "CFX_LOG_FILE=\"%s\": cannot open for appending",
                           ctx->cfg.log_file);
        ctx->log.fd = fd;
        ctx->log.owns_fd = 1;
    }
    return CFX_OK;
}

cfx_status cx_context_create(cx_transport *transport, const cx_config *cfg, cfx_context **out)
{
    cfx_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) {
        transport->ops->destroy(transport);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a context");
    }
    ctx->cfg = *cfg;
    ctx->transport = transport;
    ctx->rank = transport->rank;
    ctx->size = transport->size;
    ctx->local_rank = transport->local_rank;
    ctx->local_size = transport->local_size;
    ctx->cross_rank = transport->cross_rank;
    ctx->cross_size = transport->cross_size;
    cfx_status st = open_log(ctx);
    bool queue_ok = false, handles_ok = false;
    if (!st && !(st = cx_queue_init(&ctx->queue)))
        queue_ok = true;
    if (!st && !(st = cx_handles_init(&ctx->handles)))
        handles_ok = true;
    if (!st)
        st = agree_config(ctx);
    if (!st)
        st = cx_loop_create(ctx, &ctx->loop);
    if (!st) {
        atomic_store(&ctx->running, 1);
        if (pthread_create(&ctx->thread, NULL, cx_loop_main, ctx) != 0) {
            atomic_store(&ctx->running, 0);
            st = cx_fail(CFX_ERR_INTERNAL, "cannot start the background thread");
        } else {
            ctx->thread_started = true;
        }
    }
    if (st) {
        /* Keep the message: cleanup below must not overwrite it. */
        char msg[CX_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        cx_loop_destroy(ctx->loop);
        if (queue_ok)
            cx_queue_destroy(&ctx->queue);
        if (handles_ok)
            cx_handles_destroy(&ctx->handles);
        if (ctx->log.owns_fd)
            close(ctx->log.fd);
        transport->ops->destroy(transport);
        free(ctx);
        return cx_fail(st, "%s", msg);
    }
    cx_log(&ctx->log, CX_LOG_INFO, "context", "rank %d of %d over %s (local %d/%d, cross %d/%d); "
           "fusion %lld B, chunk %lld B, cache %lld, cycle %g ms, deterministic %d", ctx->rank,
           ctx->size, transport->ops->name, ctx->local_rank, ctx->local_size, ctx->cross_rank,
           ctx->cross_size, (long long)ctx->cfg.fusion_threshold, (long long)ctx->cfg.chunk_bytes,
           (long long)ctx->cfg.cache_capacity, ctx->cfg.cycle_time_ms, ctx->cfg.deterministic);
    *out = ctx;
    return CFX_OK;
}

cfx_status cx_context_shutdown(cfx_context *ctx)
{
    if (!ctx->thread_started)
        return CFX_OK;
    atomic_store(&ctx->shutdown_requested, 1);
    cx_queue_wake(&ctx->queue);
    pthread_join(ctx->thread, NULL);
    ctx->thread_started = false;
    atomic_store(&ctx->running, 0);
    return CFX_OK;
}

void cx_context_free(cfx_context *ctx)
{
    if (!ctx)
        return;
    cx_context_shutdown(ctx);
    cx_loop_destroy(ctx->loop);
    cx_queue_destroy(&ctx->queue);
    cx_handles_destroy(&ctx->handles);
    ctx->transport->ops->destroy(ctx->transport);
    if (ctx->log.owns_fd)
        close(ctx->log.fd);
    free(ctx);
}
