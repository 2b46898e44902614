/* device_prims - the device primitives both device paths stand on (see device_prims.h): ordering
 * against the callers' streams, completion waits with their deadline, the device side of the
 * failure agreement, the local checks, a batch's segments, and the NCCL communicator's state. */
#include "exec/device_prims.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/log.h"

#if CFX_DEVICE_CUDA

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
#if CFX_DEVICE_NCCL
/* ---- the NCCL communicator's state ------------------------------------------------------------ */

void cx_dev_nccl_abort(cx_device *d)
{
    cx_nccl_abort(d->nccl);
}

void cx_dev_nccl_lose(cx_exec *x, cx_device *d, uint32_t flags)
{
    if (!(flags & CX_AGREE_FLAG_NCCL_LOST) || !d->nccl || d->path != CX_DEVICE_PATH_NCCL)
        return;
    cx_nccl_abort(d->nccl);
    d->path = CX_DEVICE_PATH_STAGED;
    if (x->transport->rank == 0)
        cx_log(x->log, CX_LOG_WARNING, "device", "an NCCL communicator failed: device tensors take "
               "the host-staged data path from now on");
}

uint32_t cx_dev_nccl_flags(const cx_device *d)
{
    return d->path == CX_DEVICE_PATH_NCCL && d->nccl && cx_nccl_failed(d->nccl)
               ? CX_AGREE_FLAG_NCCL_LOST : 0;
}
#endif /* CFX_DEVICE_NCCL */

#endif /* CFX_DEVICE_CUDA */
