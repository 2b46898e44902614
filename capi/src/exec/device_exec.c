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
#include "exec/device_nccl.h"
#include "exec/device_prims.h"
#include "exec/device_staged.h"

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

/* ---- dispatch ---------------------------------------------------------------------------- */

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
