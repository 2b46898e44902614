/* device_exec - device tensors on the background thread (see device_exec.h): set-up, ordering and
 * completion, the failure agreement's device side, and the dispatch to the NCCL path
 * (device_nccl.c) or the host-staged pipeline (device_staged.c). */
#include "exec/device_exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/log.h"
#include "observe/timeline.h"
#include "exec/device_state.h"

#if CFX_DEVICE_CUDA

/* ---- set-up (collective: every rank meets the first device response at the same place) ------- */

/* The machine, as ranks on it see it: the kernel's boot id (shared by containers of one host,
 * which share its GPUs), else the host name. */
static void host_id(char *out, size_t len)
{
    memset(out, 0, len);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        bool ok = fgets(out, (int)len, f) != NULL;
        fclose(f);
        out[strcspn(out, "\n")] = '\0';
        if (ok && out[0])
            return;
    }
    if (gethostname(out, len - 1) != 0)
        snprintf(out, len, "unknown-host");
}

static cfx_status exchange_info(cx_transport *t, const cx_device_info *mine, cx_device_info *all)
{
    int n = t->size;
    if (n == 1) {
        all[0] = *mine;
        return CFX_OK;
    }
    size_t *bytes = malloc(sizeof *bytes * (size_t)n), *displs = malloc(sizeof *displs * (size_t)n);
    cfx_status st = bytes && displs ? CFX_OK : cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory");
    for (int r = 0; !st && r < n; r++) {
        bytes[r] = sizeof *mine;
        displs[r] = (size_t)r * sizeof *mine;
    }
    if (!st)
        st = t->ops->allgatherv(t, mine, sizeof *mine, all, bytes, displs);
    free(bytes);
    free(displs);
    return st;
}

/* The device this rank uses: its tensors' (the device it bound at submission), else, for a rank
 * with none in this batch (one that has joined), the usual local rank modulo the device count,
 * so that joining before the first device response does not cost the job its NCCL path. */
static int choose_device(const cx_exec *x, cx_entry *const *entries, size_t n)
{
    for (size_t i = 0; entries && i < n; i++)
        if (entries[i])
            return entries[i]->req.device;
    int count = cx_cuda_device_count();
    return count > 0 ? x->transport->local_rank % count : -1;
}

/* This rank's device, stream, events, descriptor batch and staging, before the ranks compare
 * notes: a failure here makes the rank "not usable", so no rank attempts NCCL. */
static cfx_status local_setup(cx_device *d, cx_device_info *mine)
{
    cfx_status st = cx_cuda_set_device(d->device);
    if (!st)
        st = cx_cuda_device_id(d->device, mine->bus, sizeof mine->bus);
    if (!st)
        st = cx_cuda_stream_create(&d->stream);
    void **events[] = {&d->ev_in, &d->ev_done, &d->ev_piece[0], &d->ev_piece[1]};
    for (size_t i = 0; !st && i < sizeof events / sizeof events[0]; i++)
        st = cx_cuda_event_create(events[i]);
    if (!st)
        st = cx_cuda_batch_create(&d->batch);
    if (!st)
        st = cx_cuda_host_alloc(2 * STAGE_PIECE_BYTES, &d->pinned);
    if (st)
        snprintf(d->broken, sizeof d->broken, "setting up CUDA device %d failed on this rank: %s",
                 d->device, cx_error_message());
    return st;
}

/* CFX_TEST_DEVICE_PATH=nccl|staged (tests only; base/test_hooks.h): the path set-up must have
 * chosen; otherwise every device batch fails on every rank (the plan is the same everywhere),
 * saying what was chosen and why. tests/gpu asserts the path of each run this way. */
static void check_expected_path(cx_device *d, const char *want, const char *why)
{
    const char *got = d->path == CX_DEVICE_PATH_NCCL ? "nccl" : "staged";
    if (want && *want && strcmp(want, got) != 0 && !d->broken[0])
        snprintf(d->broken, sizeof d->broken, "CFX_TEST_DEVICE_PATH=%.16s, but set-up chose the "
                 "%s path%s%.1800s%s", want, got, why[0] ? " (" : "", why, why[0] ? ")" : "");
}

static cfx_status device_setup(cx_exec *x, int local_device, cx_device **out)
{
    cx_transport *t = x->transport;
    cx_device *d = calloc(1, sizeof *d);
    cx_device_info *all = calloc((size_t)t->size, sizeof *all);
    if (!d || !all) {
        free(d);
        free(all);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the device state");
    }
    d->device = local_device;
    cx_device_info mine;
    memset(&mine, 0, sizeof mine);
    host_id(mine.host, sizeof mine.host);
#if CFX_DEVICE_NCCL
    mine.nccl = 1;
#endif
    if (local_device >= 0)
        mine.usable = local_setup(d, &mine) == CFX_OK;
    cfx_status st = exchange_info(t, &mine, all);
    if (st) {
        free(all);
        cx_device_destroy(d);
        return st;
    }
    char why[CX_ERROR_MAX];
    d->path = cx_device_plan(all, t->size, x->cfg->deterministic != 0, why, sizeof why);
    free(all);
#if CFX_DEVICE_NCCL
    if (d->path == CX_DEVICE_PATH_NCCL) {
        if ((st = cx_dev_nccl_setup(x, d, why, sizeof why))) {
            cx_device_destroy(d);
            return st;
        }
        if (!d->nccl)
            d->path = CX_DEVICE_PATH_STAGED;
    }
#endif
    check_expected_path(d, x->cfg->test.device_path, why);
    if (t->rank == 0)
        cx_log(x->log, CX_LOG_INFO, "device", "device tensors take the %s%s%s%s",
               d->path == CX_DEVICE_PATH_NCCL ? "NCCL data path" : "host-staged data path",
               why[0] ? " (" : "", why, why[0] ? ")" : "");
    if (d->broken[0])
        cx_log(x->log, CX_LOG_WARNING, "device", "%s", d->broken);
    *out = d;
    return CFX_OK;
}

static cfx_status ensure_device(cx_exec *x, cx_entry *const *entries, size_t n, cx_device **out)
{
    if (!x->device) {
        cfx_status st = device_setup(x, choose_device(x, entries, n), &x->device);
        if (st)
            return st;
    }
    *out = x->device;
    return CFX_OK;
}

/* Waits at most `limit` seconds for Conflux's stream (shutdown). */
static bool stream_drained(cx_device *d, double limit)
{
    if (!d->ev_done || d->stuck || cx_cuda_event_record(d->ev_done, d->stream))
        return false;
    double deadline = cx_now_s() + limit;
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        if (cx_cuda_event_query(d->ev_done, &done) || done)
            return done != 0;
        if (cx_now_s() > deadline)
            return false;
        struct timespec ts = {0, spins < 64 ? 0 : 50000};
        nanosleep(&ts, NULL);
    }
}

void cx_device_destroy(cx_device *d)
{
    if (!d)
        return;
    if (d->device >= 0)
        (void)cx_cuda_set_device(d->device);
#if CFX_DEVICE_NCCL
    /* A failed communicator is aborted before anything is freed: cudaFree waits for the device,
     * and an NCCL kernel waiting for a lost peer would never let it return. */
    if (d->nccl && cx_nccl_failed(d->nccl))
        cx_nccl_abort(d->nccl);
#endif
    bool drained = !d->stream || stream_drained(d, DRAIN_S);
#if CFX_DEVICE_NCCL
    if (!drained)
        cx_nccl_abort(d->nccl);
    cx_nccl_comm_destroy(d->nccl); /* finalized and destroyed, or (failed) already aborted */
    drained = drained || stream_drained(d, DRAIN_S);
#endif
    if (drained) {
        cx_cuda_batch_destroy(d->batch);
        cx_cuda_free(d->fusion);
        cx_cuda_host_free(d->pinned);
        void *events[] = {d->ev_in, d->ev_done, d->ev_piece[0], d->ev_piece[1]};
        for (size_t i = 0; i < sizeof events / sizeof events[0]; i++)
            cx_cuda_event_destroy(events[i]);
        cx_cuda_stream_destroy(d->stream);
    } /* else the stream is stuck: freeing would wait for it forever, so its buffers are left */
    free(d);
}

/* ---- ordering and completion ------------------------------------------------------------------ */

/* For each distinct caller stream of the batch, orders it against Conflux's stream through `event`
 * (cx_cuda_stream_after): the caller's stream waits on Conflux's (`callers_wait`) or Conflux's on
 * the caller's. Only the first 8 distinct streams are remembered; a later repeat is redundant,
 * not wrong. */
static cfx_status each_caller_stream(cx_device *d, cx_entry *const *entries, size_t n,
                                     bool callers_wait, void *event)
{
    void *seen[8];
    size_t nseen = 0;
    for (size_t i = 0; entries && i < n; i++) {
        if (!entries[i])
            continue;
        void *s = entries[i]->stream;
        /* On this thread a per-thread default stream would name this thread's own: the caller's
         * is ordered by its ready event before, and by the handle's completion after. */
        if (cx_cuda_stream_is_per_thread(s))
            continue;
        bool dup = false;
        for (size_t k = 0; k < nseen && !dup; k++)
            dup = seen[k] == s;
        if (dup)
            continue;
        cfx_status st = callers_wait ? cx_cuda_stream_after(s, d->stream, event)
                                     : cx_cuda_stream_after(d->stream, s, event);
        if (st)
            return st;
        if (nseen < 8)
            seen[nseen++] = s;
    }
    return CFX_OK;
}

cfx_status cx_dev_after_producers(cx_device *d, cx_entry *const *entries, size_t n)
{
    /* The ready events recorded at submission (api.c) mark exactly the work queued before the
     * call; an entry without one (none recorded) orders after its stream as it is now. */
    bool all_recorded = true;
    for (size_t i = 0; entries && i < n; i++) {
        if (!entries[i])
            continue;
        if (!entries[i]->ready_event) {
            all_recorded = false;
            continue;
        }
        cfx_status st = cx_cuda_stream_wait(d->stream, entries[i]->ready_event);
        if (st)
            return st;
    }
    return all_recorded ? CFX_OK : each_caller_stream(d, entries, n, false, d->ev_in);
}

cfx_status cx_dev_agree(cx_exec *x, cx_device *d, cfx_status local, cx_agree_phase phase,
                        const char *name)
{
#if CFX_DEVICE_NCCL
    uint32_t flags = cx_dev_nccl_flags(d);
    cfx_status st = cx_exec_agree(x, local, phase, name, &flags);
    if (st != CFX_ERR_TRANSPORT)
        cx_dev_nccl_lose(x, d, flags);
    return st;
#else
    (void)d;
    return cx_exec_agree(x, local, phase, name, NULL);
#endif
}

cfx_status cx_dev_wait_event(cx_exec *x, cx_device *d, void *event)
{
    if (d->stuck)
        return cx_fail(CFX_ERR_TIMEOUT, "%s", d->broken);
    double limit = device_timeout(x), deadline = cx_now_s() + limit;
    char failure[CX_ERROR_MAX] = "";
    cfx_status failed = CFX_OK;
    bool aborted = false;
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        cfx_status st = cx_cuda_event_query(event, &done);
        if (st)
            return st;
        if (done)
            return failed ? cx_fail(failed, "%s", failure) : CFX_OK;
#if CFX_DEVICE_NCCL
        if (!failed && d->nccl && !cx_nccl_failed(d->nccl) && (spins & 15) == 15 &&
            (failed = cx_nccl_check(d->nccl))) {
            snprintf(failure, sizeof failure, "%s", cx_error_message());
            cx_dev_nccl_abort(d);
            aborted = true;
            deadline = cx_now_s() + DRAIN_S;
        }
#endif
        if (cx_now_s() > deadline) {
#if CFX_DEVICE_NCCL
            if (d->nccl && !aborted) { /* an NCCL kernel may wait for a peer: stop it */
                if (!failed) {
                    failed = CFX_ERR_TIMEOUT;
                    snprintf(failure, sizeof failure, "device work on rank %d (CUDA device %d) did "
                             "not complete within %.1f s (CFX_STALL_TIMEOUT_S); a peer may be gone; "
                             "the NCCL communicator was aborted", x->transport->rank, d->device,
                             limit);
                }
                cx_dev_nccl_abort(d);
                aborted = true;
                deadline = cx_now_s() + DRAIN_S;
                continue;
            }
#endif
            d->stuck = true;
            snprintf(d->broken, sizeof d->broken, "Conflux's CUDA stream on device %d of rank %d "
                     "did not drain within %.1f s (CFX_STALL_TIMEOUT_S)%s%s", d->device,
                     x->transport->rank, limit, failure[0] ? " after: " : "", failure);
            return cx_fail(failed ? failed : CFX_ERR_TIMEOUT, "%s", d->broken);
        }
        if (spins >= 64) {
            struct timespec ts = {0, spins < 1024 ? 2000 : 50000};
            nanosleep(&ts, NULL);
        }
    }
}

cfx_status cx_dev_finish(cx_exec *x, cx_device *d, cx_entry *const *entries, size_t n, cfx_status st)
{
    char msg[CX_ERROR_MAX] = "";
    if (!st)
        st = each_caller_stream(d, entries, n, true, d->ev_done);
    if (st)
        snprintf(msg, sizeof msg, "%s", cx_error_message());
    cfx_status w = cx_cuda_event_record(d->ev_done, d->stream);
    if (w) { /* nothing to wait on: the stream is unusable */
        d->stuck = true;
        snprintf(d->broken, sizeof d->broken, "recording on Conflux's CUDA stream failed: %s",
                 cx_error_message());
    } else {
        w = cx_dev_wait_event(x, d, d->ev_done);
    }
    return st ? cx_fail(st, "%s", msg) : w;
}

cfx_status cx_dev_check_local(const cx_device *d, cx_entry *const *entries, size_t n)
{
    if (d->broken[0])
        return cx_fail(d->stuck ? CFX_ERR_TIMEOUT : CFX_ERR_CUDA, "%s", d->broken);
    if (d->device < 0)
        return cx_fail(CFX_ERR_CUDA, "no usable CUDA device on this rank");
    for (size_t i = 0; entries && i < n; i++) {
        const cx_entry *e = entries[i];
        if (!e)
            continue;
        if (e->req.device != d->device)
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "tensor '%s' is on CUDA device %d, but this "
                           "rank's device tensors run on CUDA device %d (chosen from its local rank "
                           "when it first met a device response without a device tensor)",
                           e->req.name, e->req.device, d->device);
        if (cx_cuda_stream_is_per_thread(e->stream) && !e->ready_event)
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "tensor '%s': its stream is "
                           "cudaStreamPerThread, which names each thread's own default stream, so "
                           "Conflux's thread cannot order itself after it; pass the stream's own "
                           "handle (or NULL for the legacy default stream)", e->req.name);
    }
    return cx_cuda_set_device(d->device);
}

cfx_status cx_dev_check_entry(const cx_device *d, cx_entry *e, const char *name)
{
    return e ? cx_dev_check_local(d, &e, 1)
             : cx_fail(CFX_ERR_INTERNAL, "tensor '%s' missing from the table", name);
}

/* ---- allreduce -------------------------------------------------------------------------------- */

cx_cuda_tensor *cx_dev_segments(const cx_allreduce_batch *b, cx_cuda_tensor *stack, size_t cap,
                         size_t *nseg)
{
    cx_cuda_tensor *segs = b->n <= cap ? stack : malloc(b->n * sizeof *segs);
    size_t m = 0, off = 0;
    for (size_t i = 0; segs && i < b->n; i++) {
        uint64_t count = (uint64_t)cx_shape_elements(b->items[i].ndim, b->items[i].shape);
        if (b->entries[i])
            segs[m++] = (cx_cuda_tensor){b->entries[i]->input, b->entries[i]->output, off, count};
        off += count;
    }
    *nseg = m;
    return segs;
}
cfx_status cx_device_allreduce(cx_exec *x, const cx_allreduce_batch *b, double *tl)
{
    cx_device *d = NULL;
    cfx_status st = ensure_device(x, b->entries, b->entries ? b->n : 0, &d);
    if (st)
        return st;
#if CFX_DEVICE_NCCL
    /* Agreed on every rank: the path (set-up, done agreements) and the dtype and op (the response). */
    if (d->path == CX_DEVICE_PATH_NCCL && cx_nccl_reducible(b->dtype, b->op))
        return cx_dev_nccl_allreduce(x, d, b, tl);
#endif
    return cx_dev_staged_allreduce(x, d, b, tl);
}

cfx_status cx_device_single(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_device *d = NULL;
    cfx_status st = ensure_device(x, &e, e ? 1 : 0, &d);
    if (st)
        return st;
    if (r->coll == CX_BARRIER || r->coll == CX_JOIN) /* no tensor bytes */
        return cx_exec_single_host(x, r, e);
#if CFX_DEVICE_NCCL
    if (r->coll == CX_BROADCAST && d->path == CX_DEVICE_PATH_NCCL)
        return cx_dev_nccl_broadcast(x, d, r, e);
#endif
    if (r->coll == CX_BROADCAST)
        return cx_dev_staged_broadcast(x, d, r, e);
    return cx_dev_staged_single(x, d, r, e);
}

#else /* no CUDA in this build: api.c refuses device tensors, so these are not reached */

cfx_status cx_device_allreduce(cx_exec *x, const cx_allreduce_batch *b, double *tl)
{
    (void)x, (void)tl;
    return cx_fail(CFX_ERR_UNSUPPORTED, "tensor '%s': device tensors need a build with CUDA (see "
                   "docs/gpu.md)", b->items[0].name);
}

cfx_status cx_device_single(cx_exec *x, const cx_response *r, cx_entry *e)
{
    (void)x, (void)e;
    return cx_fail(CFX_ERR_UNSUPPORTED, "tensor '%s': device tensors need a build with CUDA (see "
                   "docs/gpu.md)", r->name);
}

void cx_device_destroy(cx_device *d) { (void)d; }

#endif

const cx_device_ops cx_device_path_ops = {cx_device_allreduce, cx_device_single, cx_device_destroy};
