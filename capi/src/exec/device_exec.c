/* device_exec - device tensors on the background thread (see device_exec.h). */
#include "exec/device_exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/log.h"
#include "observe/timeline.h"

#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
#define CFX_DEVICE_CUDA 1
#include "cuda/cuda_kernels.h"
#if defined(CFX_HAVE_NCCL) && CFX_HAVE_NCCL
#define CFX_DEVICE_NCCL 1
#include "cuda/nccl_transport.h"
#endif
#endif

/* ---- planning --------------------------------------------------------------------------------- */

cx_device_path cx_device_plan(const cx_device_info *all, int size, bool deterministic, char *why,
                              size_t why_len)
{
    why[0] = '\0';
    for (int r = 0; r < size; r++)
        if (!all[r].usable) {
            snprintf(why, why_len, "rank %d has no usable CUDA device", r);
            return CX_DEVICE_PATH_STAGED;
        }
    if (deterministic) {
        snprintf(why, why_len, "deterministic mode (CFX_DETERMINISTIC) reduces in rank order on "
                 "the host");
        return CX_DEVICE_PATH_STAGED;
    }
    for (int r = 0; r < size; r++)
        if (!all[r].nccl) {
            snprintf(why, why_len, "rank %d's build has no NCCL", r);
            return CX_DEVICE_PATH_STAGED;
        }
    /* NCCL refuses two ranks of one communicator on one GPU: same machine, same PCI bus id. */
    for (int a = 0; a < size; a++)
        for (int b = a + 1; b < size; b++)
            if (strncmp(all[a].host, all[b].host, sizeof all[a].host) == 0 &&
                strncmp(all[a].bus, all[b].bus, sizeof all[a].bus) == 0) {
                snprintf(why, why_len, "ranks %d and %d share the GPU %.64s (NCCL needs one GPU "
                         "per rank)", a, b, all[a].bus);
                return CX_DEVICE_PATH_STAGED;
            }
    return CX_DEVICE_PATH_NCCL;
}

#if CFX_DEVICE_CUDA

struct cx_device {
    cx_device_path path;
    int device;                /* the ordinal this rank uses; -1: none usable */
    void *stream;              /* Conflux's stream: the NCCL communicator's, or its own */
    bool own_stream;
    void *ev_in, *ev_done;     /* producer -> Conflux ordering; completion (polled) */
    cx_cuda_batch *batch;      /* descriptors of the pack/unpack kernels */
    void *fusion;              /* device fusion buffer, grown on demand */
    size_t fusion_cap;
    void *pinned;              /* page-locked host staging, grown on demand */
    size_t pinned_cap;
#if CFX_DEVICE_NCCL
    cx_nccl *nccl;
#endif
    char broken[CX_ERROR_MAX]; /* a local set-up failure: this rank's device tensors fail */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define TL_AT(tl, i) do { if (CX_TL(x->timeline)) (tl)[i] = cx_timeline_now(); } while (0)

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

#if CFX_DEVICE_NCCL
/* Rank 0 makes the id, the control plane broadcasts it, every rank joins; then one AND decides
 * whether every rank succeeded (else all take the host-staged path). Returns a transport error
 * only; an NCCL failure leaves d->nccl NULL and the reason in `why`. */
static cfx_status nccl_setup(cx_exec *x, cx_device *d, char *why, size_t why_len)
{
    cx_transport *t = x->transport;
    unsigned char msg[1 + CX_NCCL_ID_BYTES];
    memset(msg, 0, sizeof msg);
    char err[CX_ERROR_MAX] = "";
    if (t->rank == 0) {
        msg[0] = cx_nccl_get_unique_id(msg + 1) == CFX_OK;
        if (!msg[0])
            snprintf(err, sizeof err, "%s", cx_error_message());
    }
    if (t->size > 1) {
        void *buf = msg;
        size_t len = sizeof msg;
        cfx_status st = t->ops->bcast_bytes(t, &buf, &len, 0);
        if (st)
            return st;
        if (t->rank != 0) {
            if (len == sizeof msg)
                memcpy(msg, buf, sizeof msg);
            else
                msg[0] = 0;
            free(buf);
        }
    }
    uint64_t ok = msg[0];
    if (ok) {
        ok = cx_nccl_comm_create(t->rank, t->size, msg + 1, d->device, &d->nccl) == CFX_OK;
        if (!ok)
            snprintf(err, sizeof err, "%s", cx_error_message());
    } else if (!err[0]) {
        snprintf(err, sizeof err, "rank 0 could not create an NCCL id");
    }
    if (t->size > 1) {
        cfx_status st = t->ops->allreduce_and(t, &ok, 1);
        if (st)
            return st;
    }
    if (!ok) {
        cx_nccl_comm_destroy(d->nccl);
        d->nccl = NULL;
        snprintf(why, why_len, "the NCCL communicator could not be set up (%s)",
                 err[0] ? err : "on another rank");
    }
    return CFX_OK;
}
#endif

/* Streams, events and the descriptor batch on this rank's device; a failure is this rank's own
 * (recorded in d->broken; the collectives still run, see device_exec.h). */
static void local_setup(cx_device *d)
{
    cfx_status st = cx_cuda_set_device(d->device);
#if CFX_DEVICE_NCCL
    if (!st && d->nccl)
        d->stream = cx_nccl_stream(d->nccl);
#endif
    if (!st && !d->stream) {
        st = cx_cuda_stream_create(&d->stream);
        d->own_stream = st == CFX_OK;
    }
    if (!st)
        st = cx_cuda_event_create(&d->ev_in);
    if (!st)
        st = cx_cuda_event_create(&d->ev_done);
    if (!st)
        st = cx_cuda_batch_create(&d->batch);
    if (st)
        snprintf(d->broken, sizeof d->broken, "setting up CUDA device %d failed: %s", d->device,
                 cx_error_message());
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
    d->device = -1;
    cx_device_info mine;
    memset(&mine, 0, sizeof mine);
    host_id(mine.host, sizeof mine.host);
#if CFX_DEVICE_NCCL
    mine.nccl = 1;
#endif
    char local_err[CX_ERROR_MAX] = "";
    if (local_device >= 0) {
        cfx_status st = cx_cuda_set_device(local_device);
        if (!st)
            st = cx_cuda_device_id(local_device, mine.bus, sizeof mine.bus);
        mine.usable = st == CFX_OK;
        if (st)
            snprintf(local_err, sizeof local_err, "CUDA device %d is not usable: %s", local_device,
                     cx_error_message());
    }
    cfx_status st = exchange_info(t, &mine, all);
    if (st) {
        free(d);
        free(all);
        return st;
    }
    char why[512];
    d->path = cx_device_plan(all, t->size, x->cfg->deterministic != 0, why, sizeof why);
    free(all);
    if (mine.usable)
        d->device = local_device;
    else if (local_err[0])
        snprintf(d->broken, sizeof d->broken, "%s", local_err);
#if CFX_DEVICE_NCCL
    if (d->path == CX_DEVICE_PATH_NCCL) {
        if ((st = nccl_setup(x, d, why, sizeof why))) {
            free(d);
            return st;
        }
        if (!d->nccl)
            d->path = CX_DEVICE_PATH_STAGED;
    }
#endif
    if (d->device >= 0)
        local_setup(d);
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
        int local_device = -1;
        for (size_t i = 0; i < n && local_device < 0; i++)
            if (entries[i])
                local_device = entries[i]->req.device;
        cfx_status st = device_setup(x, local_device, &x->device);
        if (st)
            return st;
    }
    *out = x->device;
    return CFX_OK;
}

void cx_device_destroy(cx_device *d)
{
    if (!d)
        return;
    if (d->device >= 0)
        (void)cx_cuda_set_device(d->device);
    cx_cuda_batch_destroy(d->batch);
    cx_cuda_free(d->fusion);
    cx_cuda_host_free(d->pinned);
    cx_cuda_event_destroy(d->ev_in);
    cx_cuda_event_destroy(d->ev_done);
    if (d->own_stream)
        cx_cuda_stream_destroy(d->stream);
#if CFX_DEVICE_NCCL
    cx_nccl_comm_destroy(d->nccl); /* its stream with it; aborted after a failure */
#endif
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
    for (size_t i = 0; i < n; i++) {
        if (!entries[i])
            continue;
        void *s = entries[i]->stream;
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

/* Conflux's stream waits on every distinct producer stream of the batch: kernels that wrote the
 * tensors before the call finish before Conflux reads them. */
static cfx_status after_producers(cx_device *d, cx_entry *const *entries, size_t n)
{
    return each_caller_stream(d, entries, n, false, d->ev_in);
}

/* Waits, polling the event, until the work recorded before it on Conflux's stream is done. Spins
 * briefly, then sleeps; polls NCCL's asynchronous error so a lost peer becomes an error; gives up
 * after CFX_STALL_TIMEOUT_S (when set). */
static cfx_status wait_event(cx_exec *x, cx_device *d, void *event)
{
    double limit = x->cfg->stall_timeout_s > 0 ? x->cfg->stall_timeout_s : -1.0;
    double start = now_s();
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        cfx_status st = cx_cuda_event_query(event, &done);
        if (st || done)
            return st;
#if CFX_DEVICE_NCCL
        if (d->nccl && (spins & 15) == 15 && (st = cx_nccl_check(d->nccl)))
            return st;
#endif
        if (limit >= 0 && now_s() - start > limit) {
#if CFX_DEVICE_NCCL
            if (d->nccl)
                (void)cx_nccl_wait(d->nccl, 0.0); /* marks it failed: shutdown aborts it */
#endif
            return cx_fail(CFX_ERR_TIMEOUT, "device work on rank %d (CUDA device %d) did not "
                           "complete within %.1f s (CFX_STALL_TIMEOUT_S); a peer may be gone",
                           x->transport->rank, d->device, limit);
        }
        if (spins >= 64) {
            struct timespec ts = {0, spins < 1024 ? 2000 : 50000};
            nanosleep(&ts, NULL);
        }
    }
}

/* The callers' streams wait on Conflux's stream (work they queue later sees the results), then the
 * thread waits for Conflux's stream itself before the handles complete. */
static cfx_status release_callers(cx_exec *x, cx_device *d, cx_entry *const *entries, size_t n)
{
    cfx_status st = each_caller_stream(d, entries, n, true, d->ev_done);
    if (st)
        return st;
    st = cx_cuda_event_record(d->ev_done, d->stream);
    return st ? st : wait_event(x, d, d->ev_done);
}

/* A staging buffer's next capacity: doubled from `cap` (64 KiB at first) until `bytes` fit. */
static size_t grown_capacity(size_t cap, size_t bytes)
{
    cap = cap ? cap : 65536;
    while (cap < bytes)
        cap *= 2;
    return cap;
}

static cfx_status reserve_pinned(cx_device *d, size_t bytes)
{
    if (d->pinned_cap >= bytes && d->pinned)
        return CFX_OK;
    size_t cap = grown_capacity(d->pinned_cap, bytes);
    void *p = NULL;
    cfx_status st = cx_cuda_host_alloc(cap, &p);
    if (st)
        return st;
    cx_cuda_host_free(d->pinned); /* no copy from it is pending: every batch waited */
    d->pinned = p;
    d->pinned_cap = cap;
    return CFX_OK;
}

static cfx_status local_failure(const cx_device *d)
{
    if (d->broken[0])
        return cx_fail(CFX_ERR_CUDA, "%s", d->broken);
    if (d->device < 0)
        return cx_fail(CFX_ERR_CUDA, "no usable CUDA device on this rank");
    return cx_cuda_set_device(d->device);
}

/* ---- allreduce -------------------------------------------------------------------------------- */

#if CFX_DEVICE_NCCL
static cfx_status reserve_fusion(cx_device *d, size_t bytes)
{
    if (d->fusion_cap >= bytes && d->fusion)
        return CFX_OK;
    size_t cap = grown_capacity(d->fusion_cap, bytes);
    cx_cuda_free(d->fusion); /* cudaFree waits for the kernels that used it; growth only */
    d->fusion = NULL;
    d->fusion_cap = 0;
    cfx_status st = cx_cuda_malloc(cap, &d->fusion);
    if (!st)
        d->fusion_cap = cap;
    return st;
}

/* Pack (prescale) -> ncclAllReduce -> unpack (postscale, 1/size), all on Conflux's stream. A lone
 * tensor (not bool, whose bytes are normalised by the pack kernel) is reduced in place. */
static cfx_status nccl_allreduce(cx_exec *x, cx_device *d, const cx_allreduce_batch *b, double *tl)
{
    const cx_response *items = b->items;
    cx_entry *const *entries = b->entries;
    size_t n = b->n, esize = b->esize, total = b->total;
    cfx_dtype dtype = b->dtype;
    cfx_reduce_op op = b->op;
    double pre = b->prescale, post = b->postscale;
    cfx_status st = local_failure(d);
    if (!st)
        st = after_producers(d, entries, n);
    if (!st && n == 1 && entries[0] && dtype != CFX_BOOL) {
        cx_entry *e = entries[0];
        const void *src = e->input;
        if (pre != 1.0) {
            st = cx_cuda_scale(e->output, e->input, total, dtype, pre, d->stream);
            src = e->output;
        }
        TL_AT(tl, 1);
        if (!st)
            st = cx_nccl_allreduce(d->nccl, src, e->output, total, dtype, op);
        TL_AT(tl, 2);
        if (!st && post != 1.0)
            st = cx_cuda_scale(e->output, e->output, total, dtype, post, d->stream);
    } else if (!st) {
        cx_cuda_tensor stack[16];
        cx_cuda_tensor *desc = n <= 16 ? stack : malloc(n * sizeof *desc);
        if (!desc)
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu descriptors", n);
        if (!st)
            st = reserve_fusion(d, total * esize + 1);
        size_t m = 0, off = 0;
        for (size_t i = 0; !st && i < n; i++) {
            uint64_t count = (uint64_t)cx_shape_elements(items[i].ndim, items[i].shape);
            if (entries[i])
                desc[m++] = (cx_cuda_tensor){entries[i]->input, entries[i]->output, off, count};
            else /* joined: the identity */
                st = cx_cuda_fill_identity((char *)d->fusion + off * esize, count, dtype, op,
                                           d->stream);
            off += count;
        }
        if (!st && m)
            st = cx_cuda_batch_set(d->batch, desc, m, dtype, d->stream);
        if (!st && m)
            st = cx_cuda_batch_pack(d->batch, d->fusion, pre, d->stream);
        TL_AT(tl, 1);
        if (!st)
            st = cx_nccl_allreduce(d->nccl, d->fusion, d->fusion, total, dtype, op);
        TL_AT(tl, 2);
        if (!st && m)
            st = cx_cuda_batch_unpack(d->batch, d->fusion, post, d->stream);
        if (desc != stack)
            free(desc);
    }
    return st ? st : release_callers(x, d, entries, n);
}
#endif

/* Device -> page-locked host, the host data path, host -> device. A rank whose staging fails
 * still takes part with the identity, so the peers never wait for it in vain. */
static cfx_status staged_allreduce(cx_exec *x, cx_device *d, const cx_allreduce_batch *b, double *tl)
{
    const cx_response *items = b->items;
    cx_entry *const *entries = b->entries;
    size_t n = b->n, esize = b->esize, total = b->total;
    bool any = false;
    for (size_t i = 0; i < n; i++)
        any = any || entries[i];
    cx_entry *copies = calloc(n, sizeof *copies);
    cx_entry **staged = calloc(n, sizeof *staged);
    cfx_status local = copies && staged ? CFX_OK
                                        : cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu "
                                                  "staged tensors", n);
    if (!copies || !staged) { /* without them this rank cannot even take part */
        free(copies);
        free(staged);
        return local;
    }
    if (any) {
        local = local_failure(d);
        if (!local)
            local = after_producers(d, entries, n);
        if (!local)
            local = reserve_pinned(d, total * esize + 1);
        size_t off = 0;
        for (size_t i = 0; !local && i < n; i++) {
            size_t count = (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
            if (entries[i] && count)
                local = cx_cuda_memcpy_async((char *)d->pinned + off * esize, entries[i]->input,
                                             count * esize, d->stream);
            off += count;
        }
        if (!local)
            local = cx_cuda_event_record(d->ev_done, d->stream);
        if (!local)
            local = wait_event(x, d, d->ev_done);
        off = 0;
        for (size_t i = 0; !local && i < n; i++) {
            if (entries[i]) {
                copies[i] = *entries[i]; /* shallow: only input/output differ, never freed */
                copies[i].input = copies[i].output = (char *)d->pinned + off * esize;
                staged[i] = &copies[i];
            }
            off += (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
        }
    }
    char local_msg[CX_ERROR_MAX] = "";
    if (local) {
        snprintf(local_msg, sizeof local_msg, "%s", cx_error_message());
        memset(staged, 0, n * sizeof *staged); /* take part with the identity */
    }
    cx_allreduce_batch on_host = *b;
    on_host.entries = staged;
    cfx_status st = cx_exec_allreduce_host(x, &on_host, tl);
    if (!st && local)
        st = cx_fail(local, "%s", local_msg);
    if (!st && any) {
        size_t off = 0;
        for (size_t i = 0; !st && i < n; i++) {
            size_t count = (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
            if (entries[i] && count)
                st = cx_cuda_memcpy_async(entries[i]->output, (char *)d->pinned + off * esize,
                                          count * esize, d->stream);
            off += count;
        }
        if (!st)
            st = release_callers(x, d, entries, n);
    }
    free(copies);
    free(staged);
    return st;
}

cfx_status cx_device_allreduce(cx_exec *x, const cx_allreduce_batch *b, double *tl)
{
    cx_device *d = NULL;
    cfx_status st = ensure_device(x, b->entries, b->n, &d);
    if (st)
        return st;
#if CFX_DEVICE_NCCL
    /* Agreed on every rank: the path (set-up) and the dtype (the response). */
    if (d->path == CX_DEVICE_PATH_NCCL && cx_nccl_reducible(b->dtype))
        return nccl_allreduce(x, d, b, tl);
#endif
    return staged_allreduce(x, d, b, tl);
}

/* ---- the other collectives -------------------------------------------------------------------- */

/* Stages e's input on the host, runs the host path on the copy, and (broadcast) copies the result
 * back. Outputs Conflux allocates (allgather, alltoall, reducescatter) stay in host memory. */
static cfx_status staged_single(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e)
{
    bool bcast = r->coll == CX_BROADCAST;
    bool needs_input = !bcast || r->root == x->transport->rank;
    cfx_status local = local_failure(d);
    if (!local)
        local = after_producers(d, &e, 1);
    if (!local)
        local = reserve_pinned(d, e->bytes + 1);
    if (!local && needs_input && e->bytes)
        local = cx_cuda_memcpy_async(d->pinned, e->input, e->bytes, d->stream);
    if (!local)
        local = cx_cuda_event_record(d->ev_done, d->stream);
    if (!local)
        local = wait_event(x, d, d->ev_done);
    char local_msg[CX_ERROR_MAX] = "";
    void *fallback = NULL;
    cx_entry copy = *e; /* shallow: only input/output differ, never freed */
    if (local) {
        snprintf(local_msg, sizeof local_msg, "%s", cx_error_message());
        /* Take part with zeros, so the peers do not wait for this rank in vain. */
        if (!(fallback = calloc(1, e->bytes + 1)))
            return cx_fail(local, "%s", local_msg);
        copy.input = copy.output = fallback;
    } else {
        copy.input = copy.output = d->pinned;
    }
    cfx_status st = cx_exec_single_host(x, r, &copy);
    free(fallback);
    if (!st && local)
        return cx_fail(local, "%s", local_msg);
    if (!st && bcast && !needs_input && e->bytes) {
        st = cx_cuda_memcpy_async(e->input, d->pinned, e->bytes, d->stream);
        if (!st)
            st = release_callers(x, d, &e, 1);
    }
    return st;
}

cfx_status cx_device_single(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_device *d = NULL;
    cfx_status st = ensure_device(x, &e, 1, &d);
    if (st)
        return st;
#if CFX_DEVICE_NCCL
    if (r->coll == CX_BROADCAST && d->path == CX_DEVICE_PATH_NCCL) {
        st = local_failure(d);
        if (!st)
            st = after_producers(d, &e, 1);
        if (!st)
            st = cx_nccl_broadcast(d->nccl, e->input, e->bytes, r->root);
        return st ? st : release_callers(x, d, &e, 1);
    }
#endif
    if (r->coll == CX_BARRIER || r->coll == CX_JOIN) /* no tensor bytes */
        return cx_exec_single_host(x, r, e);
    return staged_single(x, d, r, e);
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
