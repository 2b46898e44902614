/* context - lifetime of a cfx_context (see context.h). */
#include "engine/context.h"

#include <ctype.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "exec/execute.h"
#include "exec/shm_layer.h"
#include "observe/timeline.h"
#include "protocol/handshake.h"

/* ---- the exit handler --------------------------------------------------------------------
 * A rank that returns from main (or calls exit) without cfx_shutdown would leave the other ranks
 * waiting for it forever. The handler, registered at the first context creation (after MPI's own
 * finalizer, so it runs before it), shuts every live context of the process down as cfx_shutdown
 * would, marked as an exit (shutdown_requested = 2): the other ranks' pending handles fail with
 * CFX_ERR_SHUT_DOWN naming this rank. This list is the engine's one process-global registry. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static cfx_context *live_head;
static pid_t live_pid; /* the process the list belongs to: a forked child inherits a stale copy */
static pthread_once_t live_once = PTHREAD_ONCE_INIT;

static void exit_handler(void)
{
    pthread_mutex_lock(&live_mu);
    if (live_pid != getpid()) /* a forked child: its parent's contexts have no thread here */
        live_head = NULL;
    for (cfx_context *c = live_head; c; c = c->live_next)
        if (c->thread_started) {
            int expected = 0;
            atomic_compare_exchange_strong(&c->shutdown_requested, &expected, 2);
            cx_queue_wake(&c->queue);
        }
    for (cfx_context *c = live_head; c; c = c->live_next)
        cx_context_shutdown(c); /* all flagged first: thread ranks of one process leave together */
    pthread_mutex_unlock(&live_mu);
}

static void register_exit_handler(void) { atexit(exit_handler); }

static void live_add(cfx_context *ctx)
{
    pthread_once(&live_once, register_exit_handler);
    pthread_mutex_lock(&live_mu);
    if (live_pid != getpid()) {
        live_pid = getpid();
        live_head = NULL;
    }
    ctx->live_next = live_head;
    live_head = ctx;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(cfx_context *ctx)
{
    pthread_mutex_lock(&live_mu);
    for (cfx_context **p = &live_head; *p; p = &(*p)->live_next)
        if (*p == ctx) {
            *p = ctx->live_next;
            break;
        }
    pthread_mutex_unlock(&live_mu);
}

/* ---- timeline hand-over (see context.h) ------------------------------------------------------ */

/* The loop's timeline hand-over (cx_loop_env.take_timeline): adopts what cfx_timeline_start/stop
 * or CFX_TIMELINE left in tl_next, closes the old one, and wakes the caller waiting for it. */
static cx_timeline *take_timeline(void *owner)
{
    cfx_context *ctx = owner;
    pthread_mutex_lock(&ctx->tl_mu);
    cx_timeline *old = ctx->timeline;
    ctx->timeline = ctx->tl_next;
    ctx->tl_next = NULL;
    uint64_t ticket = ctx->tl_requested;
    atomic_store(&ctx->tl_change, 0);
    pthread_mutex_unlock(&ctx->tl_mu);
    cx_timeline_destroy(old); /* closed before cfx_timeline_stop returns */
    pthread_mutex_lock(&ctx->tl_mu);
    ctx->tl_applied = ticket;
    pthread_cond_broadcast(&ctx->tl_cv);
    pthread_mutex_unlock(&ctx->tl_mu);
    return ctx->timeline;
}

static cfx_status open_timeline(cfx_context *ctx, const char *path, bool mark_cycles,
                                cx_timeline **out)
{
    char full[CX_PATH_MAX + 32];
    cx_timeline_rank_path(path, ctx->rank, full, sizeof full);
    return cx_timeline_create(full, ctx->rank, ctx->cfg.timeline_max_bytes, mark_cycles,
                              &ctx->log, out);
}

cfx_status cx_context_set_timeline(cfx_context *ctx, const char *path, bool mark_cycles)
{
    cx_timeline *tl = NULL;
    cfx_status st = path ? open_timeline(ctx, path, mark_cycles, &tl) : CFX_OK;
    if (st)
        return st;
    pthread_mutex_lock(&ctx->tl_mu);
    if (!ctx->thread_started || !atomic_load(&ctx->running)) {
        pthread_mutex_unlock(&ctx->tl_mu);
        cx_timeline_destroy(tl);
        return cx_fail(CFX_ERR_SHUT_DOWN, "cfx_timeline_%s: the context has been shut down",
                       path ? "start" : "stop");
    }
    cx_timeline *stale = ctx->tl_next; /* handed over earlier, never adopted */
    ctx->tl_next = tl;
    uint64_t ticket = ++ctx->tl_requested;
    atomic_store(&ctx->tl_change, 1);
    pthread_mutex_unlock(&ctx->tl_mu);
    cx_timeline_destroy(stale);
    cx_queue_wake(&ctx->queue);
    pthread_mutex_lock(&ctx->tl_mu);
    while (ctx->tl_applied < ticket && atomic_load(&ctx->running)) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&ctx->tl_cv, &ctx->tl_mu, &ts);
    }
    pthread_mutex_unlock(&ctx->tl_mu);
    return CFX_OK;
}

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

/* Settings that change what a caller asked for cannot be adopted from rank 0 (a rank would get
 * another result than its environment promised): they must be equal already. One allgather of
 * each rank's value, so every rank finds the same first difference and fails init with the same
 * CFX_ERR_CONFIG naming the variable, both values and both ranks. */
static cfx_status check_equal_settings(cfx_context *ctx)
{
    cx_transport *t = ctx->transport;
    if (t->size == 1)
        return CFX_OK;
    int32_t *all = NULL;
    cfx_status st = cx_transport_allgather_int32(t, ctx->cfg.compression_everywhere, &all);
    for (int r = 1; !st && r < t->size; r++)
        if (all[r] != all[0])
            st = cx_fail(CFX_ERR_CONFIG, "CFX_COMPRESSION_EVERYWHERE differs across ranks: rank 0 "
                         "has %d, rank %d has %d (set it alike on every rank)", (int)all[0], r,
                         (int)all[r]);
    free(all);
    return st;
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

/* Forms the context's world over `transport` (ownership moves to the context): topology,
 * handshake, agreed settings, data path, loop and background thread. With `timeline`, CFX_TIMELINE
 * starts with the thread. On failure everything made here is released again (the transport too)
 * and the queue, handles and gradient sets are left as they were. */
static cfx_status start_world(cfx_context *ctx, cx_transport *transport, bool timeline)
{
    ctx->transport = transport;
    ctx->transport_name = transport->ops->name;
    ctx->rank = transport->rank;
    ctx->size = transport->size;
    ctx->local_rank = transport->local_rank;
    ctx->local_size = transport->local_size;
    ctx->cross_rank = transport->cross_rank;
    ctx->cross_size = transport->cross_size;
    ctx->log.rank = ctx->rank;
    cfx_status st = cx_transport_check(transport);
    if (!st) /* first: ranks that cannot talk stop here, before any other exchange */
        st = cx_handshake(ctx->transport, &ctx->cfg, &ctx->log);
    if (!st)
        st = agree_config(ctx);
    if (!st)
        st = check_equal_settings(ctx);
    if (!st) /* may wrap ctx->transport in the shared-memory layer, which then owns it */
        st = cx_shm_layer_setup(&ctx->transport, &ctx->cfg, &ctx->log);
    if (!st)
        st = cx_loop_create(&(cx_loop_env){.cfg = &ctx->cfg, .log = &ctx->log,
                                            .transport = ctx->transport, .queue = &ctx->queue,
                                            .handles = &ctx->handles,
                                            .gradsets = &ctx->gradsets, .running = &ctx->running,
                                            .shutdown_requested = &ctx->shutdown_requested,
                                            .device_bound = &ctx->cuda_device_bound,
                                            .timeline_change = &ctx->tl_change,
                                            .take_timeline = take_timeline, .owner = ctx},
                            &ctx->loop);
    if (!st && timeline && ctx->cfg.timeline[0] && /* CFX_TIMELINE: adopted by the first cycle */
        !(st = open_timeline(ctx, ctx->cfg.timeline, ctx->cfg.timeline_cycles, &ctx->tl_next)))
        atomic_store(&ctx->tl_change, 1);
    cx_host_path path = cx_shm_layer_path(ctx->transport);
    char across[64]; /* "shared memory + MPI across hosts": the transport's name in capitals */
    size_t n = (size_t)snprintf(across, sizeof across, "shared memory + ");
    for (const char *c = ctx->transport->ops->name; *c && n < sizeof across - 1; c++)
        across[n++] = (char)toupper((unsigned char)*c);
    snprintf(across + n, sizeof across - n, " across hosts");
    if (!st) /* before the thread starts: it may retune ctx->cfg (autotune) */
        cx_log(&ctx->log, CX_LOG_INFO, "context", "rank %d of %d over %s (local %d/%d, cross %d/%d); "
           "fusion %lld B, chunk %lld B, cache %lld, cycle %g ms, deterministic %d, allreduce path %s",
           ctx->rank,
           ctx->size, ctx->transport->ops->name, ctx->local_rank, ctx->local_size, ctx->cross_rank,
           ctx->cross_size, (long long)ctx->cfg.fusion_threshold, (long long)ctx->cfg.chunk_bytes,
           (long long)ctx->cfg.cache_capacity, ctx->cfg.cycle_time_ms, ctx->cfg.deterministic,
           path.shm ? (path.hierarchical ? across : "shared memory")
                    : ctx->transport->ops->name);
    if (!st) {
        atomic_store(&ctx->running, 1);
        if (pthread_create(&ctx->thread, NULL, cx_loop_main, ctx->loop) != 0) {
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
        cx_timeline_destroy(ctx->tl_next);
        ctx->loop = NULL;
        ctx->tl_next = NULL;
        ctx->transport->ops->destroy(ctx->transport); /* the layer, if made, frees the segment */
        ctx->transport = NULL;
        return cx_fail(st, "%s", msg);
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
    ctx->rank = transport->rank;
    cfx_status st = open_log(ctx);
    pthread_mutex_init(&ctx->tl_mu, NULL);
    pthread_cond_init(&ctx->tl_cv, NULL);
    bool queue_ok = false, handles_ok = false, gradsets_ok = false;
    if (!st && !(st = cx_queue_init(&ctx->queue))) {
        queue_ok = true;
        ctx->queue.lazy_wake = ctx->cfg.wait_runs_cycles; /* waiters run their own work (loop.h) */
    }
    if (!st && !(st = cx_handles_init(&ctx->handles)))
        handles_ok = true;
    if (!st && !(st = cx_gradsets_init(&ctx->gradsets, &ctx->queue, &ctx->log, transport->size)))
        gradsets_ok = true;
    if (st)
        transport->ops->destroy(transport);
    else
        st = start_world(ctx, transport, true); /* releases the transport when it fails */
    if (st) {
        char msg[CX_ERROR_MAX];
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        if (queue_ok)
            cx_queue_destroy(&ctx->queue);
        if (handles_ok)
            cx_handles_destroy(&ctx->handles);
        if (gradsets_ok)
            cx_gradsets_destroy(&ctx->gradsets);
        if (ctx->log.owns_fd)
            close(ctx->log.fd);
        pthread_mutex_destroy(&ctx->tl_mu);
        pthread_cond_destroy(&ctx->tl_cv);
        free(ctx);
        return cx_fail(st, "%s", msg);
    }
    live_add(ctx);
    *out = ctx;
    return CFX_OK;
}

/* ---- elastic worlds (membership.h) --------------------------------------------------------- */

cfx_status cx_context_create_elastic(cx_membership *m, const cx_config *cfg,
                                     const cfx_reform_options *o, cfx_context **out)
{
    cx_logger lg = {.level = cfg->log_level, .rank = cx_membership_id(m), .fd = 2, .owns_fd = 0};
    cx_transport *t;
    cfx_status st = cx_membership_form(m, o, &lg, &t);
    if (!st)
        st = cx_context_create(t, cfg, out);
    if (st) {
        cx_membership_close(m);
        return st;
    }
    (*out)->membership = m;
    return CFX_OK;
}

cfx_status cx_context_reform(cfx_context *ctx, const cfx_reform_options *o)
{
    if (!ctx->membership)
        return cx_fail(CFX_ERR_UNSUPPORTED, "cfx_context_reform: this context was not made by "
                       "cfx_elastic_init (only elastic worlds can be formed again)");
    if (!ctx->transport) /* an earlier reform failed half-way: the queue is open, no world yet */
        goto form;
    /* Pending work fails with CFX_ERR_MEMBERSHIP_CHANGED (loop.c reads the 3), unless a lost peer
     * already failed it with CFX_ERR_PEER_LOST. */
    int expected = 0;
    atomic_compare_exchange_strong(&ctx->shutdown_requested, &expected, 3);
    cx_context_shutdown(ctx);
    cx_loop_destroy(ctx->loop);
    ctx->loop = NULL;
    /* Sets of the old world are orphaned (their calls fail; cfx_gradset_free frees them). */
    cx_gradsets_destroy(&ctx->gradsets);
    cx_queue_destroy(&ctx->queue); /* closed by the loop's end; every entry completed */
    ctx->transport->ops->destroy(ctx->transport); /* the layer, if made, frees the segment */
    ctx->transport = NULL;
    cfx_status st = cx_queue_init(&ctx->queue);
    if (st)
        return st;
    ctx->queue.lazy_wake = ctx->cfg.wait_runs_cycles;
    if ((st = cx_gradsets_init(&ctx->gradsets, &ctx->queue, &ctx->log, 1)))
        return st;
form:;
    cx_transport *t;
    if ((st = cx_membership_form(ctx->membership, o, &ctx->log, &t)))
        return st;
    ctx->gradsets.size = t->size;
    atomic_store(&ctx->shutdown_requested, 0);
    for (size_t i = 0; i < sizeof ctx->noname_counter / sizeof ctx->noname_counter[0]; i++)
        atomic_store(&ctx->noname_counter[i], 0); /* newcomers count generated names from 0 */
    return start_world(ctx, t, false);
}

/* ---- subset contexts --------------------------------------------------------------------- */

static pthread_mutex_t family_mu = PTHREAD_MUTEX_INITIALIZER;

cfx_status cx_context_create_subset(cfx_context *parent, const int *ranks, size_t n,
                                    cfx_context **out)
{
    *out = NULL;
    cx_transport *t = parent->transport;
    if (!cx_transport_has(t, CX_TRANSPORT_SPLIT))
        return cx_fail(CFX_ERR_UNSUPPORTED, "cfx_context_create_subset: the %s transport cannot "
                       "make subsets", t->ops->name);
    cx_transport *sub = NULL;
    cfx_status st = t->ops->split(t, ranks, n, &sub);
    if (st || !sub)
        return st;
    cx_config cfg = parent->cfg;
    cfg.timeline[0] = '\0'; /* the parent's CFX_TIMELINE file is the parent's */
    cfx_context *child = NULL;
    if ((st = cx_context_create(sub, &cfg, &child)))
        return st;
    pthread_mutex_lock(&family_mu);
    child->parent = parent;
    child->next_sibling = parent->children;
    parent->children = child;
    pthread_mutex_unlock(&family_mu);
    *out = child;
    return CFX_OK;
}

/* Shuts down the subsets split from ctx (a snapshot: shutting down takes no family lock). */
static void shutdown_children(cfx_context *ctx)
{
    for (;;) {
        cfx_context *next = NULL;
        pthread_mutex_lock(&family_mu);
        for (cfx_context *c = ctx->children; c && !next; c = c->next_sibling)
            if (c->thread_started)
                next = c;
        pthread_mutex_unlock(&family_mu);
        if (!next)
            return;
        cx_context_shutdown(next);
    }
}

static void unlink_family(cfx_context *ctx)
{
    pthread_mutex_lock(&family_mu);
    for (cfx_context *c = ctx->children; c; c = c->next_sibling)
        c->parent = NULL;
    ctx->children = NULL;
    if (ctx->parent) {
        cfx_context **link = &ctx->parent->children;
        while (*link && *link != ctx)
            link = &(*link)->next_sibling;
        if (*link)
            *link = ctx->next_sibling;
        ctx->parent = NULL;
    }
    pthread_mutex_unlock(&family_mu);
}

cfx_status cx_context_shutdown(cfx_context *ctx)
{
    shutdown_children(ctx);
    if (!ctx->thread_started)
        return CFX_OK;
    int expected = 0; /* keeps 2 (set by the exit handler) */
    atomic_compare_exchange_strong(&ctx->shutdown_requested, &expected, 1);
    cx_queue_wake(&ctx->queue);
    pthread_join(ctx->thread, NULL);
    ctx->thread_started = false;
    atomic_store(&ctx->running, 0);
    /* The timeline ends with the thread: the file is complete when cfx_shutdown returns. */
    cx_timeline_destroy(ctx->timeline);
    cx_timeline_destroy(ctx->tl_next);
    ctx->timeline = ctx->tl_next = NULL;
    return CFX_OK;
}

/* ---- waiting on the calling thread (loop.h, cx_loop_drive) ---------------------------------- */

cx_drive_result cx_context_drive(cfx_context *ctx, bool (*done)(void *), void *arg, double deadline_s)
{
    cx_drive_result r = CX_DRIVE_BUSY;
    if (ctx->cfg.wait_runs_cycles && ctx->thread_started && atomic_load(&ctx->running))
        r = cx_loop_drive(ctx->loop, done, arg, deadline_s);
    if (r != CX_DRIVE_DONE) /* the background thread carries on: it may owe a wake-up (queue.h) */
        cx_queue_pay_wake(&ctx->queue);
    return r;
}

typedef struct handle_wait {
    cx_handles *handles;
    cfx_handle handle;
} handle_wait;

static bool handle_done(void *arg)
{
    handle_wait *w = arg;
    int done = 0;
    return cx_handles_poll(w->handles, w->handle, &done) != CFX_OK || done; /* stale: the wait says */
}

double cx_context_drive_for(cfx_context *ctx, bool (*done)(void *), void *arg, double timeout_s)
{
    double deadline = timeout_s < 0 ? INFINITY : cx_now_s() + timeout_s;
    cx_drive_result r = cx_context_drive(ctx, done, arg, deadline);
    if (r == CX_DRIVE_TIMEOUT)
        return 0;
    return timeout_s < 0 || r == CX_DRIVE_DONE ? timeout_s : fmax(0, deadline - cx_now_s());
}

cfx_status cx_context_wait(cfx_context *ctx, cfx_handle handle, double timeout_s)
{
    handle_wait w = {&ctx->handles, handle};
    return cx_handles_wait(&ctx->handles, handle, cx_context_drive_for(ctx, handle_done, &w, timeout_s));
}

void cx_context_free(cfx_context *ctx)
{
    if (!ctx)
        return;
    live_remove(ctx);
    cx_context_shutdown(ctx);
    unlink_family(ctx);
    cx_loop_destroy(ctx->loop);
    cx_gradsets_destroy(&ctx->gradsets);
    cx_queue_destroy(&ctx->queue);
    cx_handles_destroy(&ctx->handles);
    if (ctx->transport)
        ctx->transport->ops->destroy(ctx->transport);
    cx_membership_close(ctx->membership);
    if (ctx->log.owns_fd)
        close(ctx->log.fd);
    pthread_mutex_destroy(&ctx->tl_mu);
    pthread_cond_destroy(&ctx->tl_cv);
    free(ctx);
}
