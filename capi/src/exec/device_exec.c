/* device_exec - device tensors on the background thread (see device_exec.h). */
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

/* The host-staged path moves data through two page-locked halves of this size, piece by piece; a
 * constant, so every rank cuts a batch into the same pieces (each piece is one host collective). */
#define STAGE_PIECE_BYTES ((size_t)4 << 20)
/* After an abort, how long the work queued behind the aborted kernels may take to drain. */
#define DRAIN_S 10.0

struct cx_device {
    cx_device_path path;
    int device;                /* the ordinal this rank uses; -1: none */
    void *stream;              /* Conflux's stream (its own); NCCL's collectives run on it too */
    void *ev_in, *ev_done;     /* producer -> Conflux ordering; completion (polled) */
    void *ev_piece[2];         /* host-staged: a half's copy in has landed */
    cx_cuda_batch *batch;      /* descriptors of the pack/unpack kernels */
    void *fusion;              /* device fusion buffer, grown stream-ordered */
    size_t fusion_cap;
    void *pinned;              /* page-locked staging: two halves of STAGE_PIECE_BYTES, made once */
    bool stuck;                /* Conflux's stream did not drain: later waits fail at once */
#if CFX_DEVICE_NCCL
    cx_nccl *nccl;
#endif
    char broken[CX_ERROR_MAX]; /* a local failure that outlives a batch: this rank's batches fail */
};

/* Every device wait is bounded: CFX_STALL_TIMEOUT_S, or 600 s when that is 0 (never). */
static double device_timeout(const cx_exec *x)
{
    return x->cfg->stall_timeout_s > 0 ? x->cfg->stall_timeout_s : 600.0;
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
/* Every rank is ready (the info exchange said so) when this runs. Rank 0 makes the id, the control
 * plane broadcasts it, every rank joins with a deadline (the non-blocking set-up), and one
 * agreement decides: all joined, or every rank aborts its communicator and the job takes the
 * host-staged path. Returns a transport error only; otherwise d->nccl is set or NULL and `why`
 * says why not. */
static cfx_status nccl_setup(cx_exec *x, cx_device *d, char *why, size_t why_len)
{
    cx_transport *t = x->transport;
    unsigned char msg[1 + CX_NCCL_ID_BYTES];
    memset(msg, 0, sizeof msg);
    cfx_status local = CFX_OK;
    if (t->rank == 0) {
        local = cx_nccl_get_unique_id(msg + 1);
        msg[0] = local == CFX_OK;
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
    if (msg[0]) /* otherwise rank 0 failed, and says so in the agreement */
        local = cx_nccl_comm_create(t->rank, t->size, msg + 1, d->device, d->stream,
                                    device_timeout(x), &d->nccl);
    cfx_status st = cx_exec_agree(x, local, CX_AGREE_READY, "nccl.init", NULL);
    if (st == CFX_ERR_TRANSPORT)
        return st;
    if (st) {
        cx_nccl_abort(d->nccl);
        cx_nccl_comm_destroy(d->nccl);
        d->nccl = NULL;
        snprintf(why, why_len, "the NCCL communicator could not be set up: %s", cx_error_message());
    }
    return CFX_OK;
}
#endif

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
        if ((st = nccl_setup(x, d, why, sizeof why))) {
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

/* Conflux's stream waits on every distinct producer stream of the batch: kernels that wrote the
 * tensors before the call finish before Conflux reads them. */
static cfx_status after_producers(cx_device *d, cx_entry *const *entries, size_t n)
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

#if CFX_DEVICE_NCCL
/* Aborts this rank's communicator now; the next done agreement tells the others. */
static void abort_nccl(cx_device *d)
{
    cx_nccl_abort(d->nccl);
}

/* After an agreement in which some rank's communicator had failed: every rank gives NCCL up at
 * this same point, and device tensors take the host-staged path from now on. */
static void lose_nccl(cx_exec *x, cx_device *d, uint32_t flags)
{
    if (!(flags & CX_AGREE_FLAG_NCCL_LOST) || !d->nccl || d->path != CX_DEVICE_PATH_NCCL)
        return;
    cx_nccl_abort(d->nccl);
    d->path = CX_DEVICE_PATH_STAGED;
    if (x->transport->rank == 0)
        cx_log(x->log, CX_LOG_WARNING, "device", "an NCCL communicator failed: device tensors take "
               "the host-staged data path from now on");
}

static uint32_t nccl_flags(const cx_device *d)
{
    return d->path == CX_DEVICE_PATH_NCCL && d->nccl && cx_nccl_failed(d->nccl)
               ? CX_AGREE_FLAG_NCCL_LOST : 0;
}
#endif

/* Every agreement of a device batch (cx_exec_agree), which also tells every rank whether some
 * rank's NCCL communicator failed; then every rank gives NCCL up at this same point. */
static cfx_status device_agree(cx_exec *x, cx_device *d, cfx_status local, cx_agree_phase phase,
                               const char *name)
{
#if CFX_DEVICE_NCCL
    uint32_t flags = nccl_flags(d);
    cfx_status st = cx_exec_agree(x, local, phase, name, &flags);
    if (st != CFX_ERR_TRANSPORT)
        lose_nccl(x, d, flags);
    return st;
#else
    (void)d;
    return cx_exec_agree(x, local, phase, name, NULL);
#endif
}

/* Waits, polling the event, until the work recorded before it on Conflux's stream is done. Spins
 * briefly, then sleeps; polls NCCL's asynchronous error. Bounded (device_timeout): when the
 * deadline passes or NCCL reports an error, the communicator is aborted at once (its kernels stop)
 * and the work queued behind them gets DRAIN_S to finish, so that nothing touches the tensors
 * after their handles complete; a stream that still does not drain makes this rank's later device
 * batches fail. */
static cfx_status wait_event(cx_exec *x, cx_device *d, void *event)
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
            abort_nccl(d);
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
                abort_nccl(d);
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

/* Every batch that queued device work ends here, failed or not, so that no queued work touches
 * the tensors after their handles complete: on success the callers' streams wait on Conflux's;
 * then the thread waits (bounded) for Conflux's stream. Returns `st`, else the wait's failure. */
static cfx_status finish(cx_exec *x, cx_device *d, cx_entry *const *entries, size_t n, cfx_status st)
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
        w = wait_event(x, d, d->ev_done);
    }
    return st ? cx_fail(st, "%s", msg) : w;
}

/* Why this rank cannot run device work for these entries (CFX_OK: it can). */
static cfx_status check_local(const cx_device *d, cx_entry *const *entries, size_t n)
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

/* ---- the host-staged pipeline ----------------------------------------------------------------- */

/* A batch laid out as one run of `total` elements of esize bytes; segs give each tensor's place
 * in it (offset, count) and its device input/output. */
typedef struct stage {
    cx_exec *x;
    cx_device *d;
    const cx_cuda_tensor *segs;
    size_t nseg, total, esize, per; /* per: elements of one piece */
    bool in, out;                   /* this rank copies pieces in (device to host) / back out */
} stage;

/* One piece on the host, in `half` (NULL when this rank stages nothing), with this rank's
 * status so far. A failure stops the pipeline. */
typedef cfx_status (*piece_fn)(const stage *s, void *half, size_t lo, size_t count,
                               cfx_status local, void *arg);

static cfx_status copy_piece(const stage *s, size_t k, bool in)
{
    size_t lo = k * s->per, hi = lo + s->per < s->total ? lo + s->per : s->total;
    char *half = (char *)s->d->pinned + (k % 2) * STAGE_PIECE_BYTES;
    for (size_t i = 0; i < s->nseg; i++) {
        const cx_cuda_tensor *g = &s->segs[i];
        size_t a = lo > g->offset ? lo : (size_t)g->offset;
        size_t b = hi < g->offset + g->count ? hi : (size_t)(g->offset + g->count);
        if (a >= b)
            continue;
        size_t at = (a - (size_t)g->offset) * s->esize, bytes = (b - a) * s->esize;
        char *h = half + (a - lo) * s->esize;
        cfx_status st = in ? cx_cuda_memcpy_async(h, (const char *)g->input + at, bytes, s->d->stream)
                           : cx_cuda_memcpy_async((char *)g->output + at, h, bytes, s->d->stream);
        if (st)
            return st;
    }
    /* The half's event: its copy in landed, or (a rank that only copies out) its copy out left it */
    return in || !s->in ? cx_cuda_event_record(s->d->ev_piece[k % 2], s->d->stream) : CFX_OK;
}

/* For each piece k: its copy in (queued two pieces ahead, behind the copy out that last used its
 * half, so the halves are reused in stream order), a bounded wait for it, fn, its copy out. A
 * rank that only copies out waits instead, before fn writes a half, for the copy out that last
 * read it. A rank's own copy failure reaches fn as `local` (fn's agreement then stops every rank
 * at the same piece), or stays in *local after the last piece. Returns fn's first failure. */
static cfx_status run_pieces(const stage *s, piece_fn fn, void *arg, cfx_status *local)
{
    size_t np = s->total ? (s->total + s->per - 1) / s->per : 1;
    for (size_t k = 0; k < 2 && k < np && s->in && !*local; k++)
        *local = copy_piece(s, k, true);
    for (size_t k = 0; k < np; k++) {
        if ((s->in || (s->out && k >= 2)) && !*local)
            *local = wait_event(s->x, s->d, s->d->ev_piece[k % 2]);
        size_t lo = k * s->per, count = s->total - lo < s->per ? s->total - lo : s->per;
        void *half = s->in || s->out ? (char *)s->d->pinned + (k % 2) * STAGE_PIECE_BYTES : NULL;
        cfx_status st = fn(s, half, lo, count, *local, arg);
        if (st)
            return st;
        if (s->out && !*local)
            *local = copy_piece(s, k, false);
        if (s->in && !*local && k + 2 < np)
            *local = copy_piece(s, k + 2, true);
    }
    return CFX_OK;
}

/* ---- allreduce -------------------------------------------------------------------------------- */

/* The batch's tensors as segments of one run (NULL entries, a joined rank's, are left out). */
static cx_cuda_tensor *segments(const cx_allreduce_batch *b, cx_cuda_tensor *stack, size_t cap,
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
static cfx_status reserve_fusion(cx_device *d, size_t bytes)
{
    if (d->fusion_cap >= bytes && d->fusion)
        return CFX_OK;
    size_t cap = d->fusion_cap ? d->fusion_cap : 65536;
    while (cap < bytes)
        cap *= 2;
    cx_cuda_free_async(d->fusion, d->stream); /* after the kernels queued before: stream order */
    d->fusion = NULL;
    d->fusion_cap = 0;
    cfx_status st = cx_cuda_malloc_async(cap, d->stream, &d->fusion);
    if (!st)
        d->fusion_cap = cap;
    return st;
}

/* Everything before ncclAllReduce that can fail on this rank, so that its failure comes before
 * the ready agreement: the producers' ordering, the fusion buffer, the identity of a joined rank's
 * share, the descriptors and the pack kernel (prescale fused; it writes only the fusion buffer).
 * A lone tensor (not bool, whose bytes the pack normalises) is reduced in place, its prescale
 * into its output. *queued: device work that touches the tensors was queued. */
static cfx_status nccl_prepare(cx_device *d, const cx_allreduce_batch *b, bool lone, bool *queued)
{
    cfx_status st = check_local(d, b->entries, b->n);
    if (!st && cx_nccl_failed(d->nccl))
        st = cx_fail(CFX_ERR_NCCL, "this rank's NCCL communicator failed earlier");
    if (!st)
        st = after_producers(d, b->entries, b->n);
    if (!st && lone && b->prescale != 1.0) { /* into the output: a failed batch's is unspecified */
        cx_entry *e = b->entries[0];
        *queued = true;
        st = cx_cuda_scale(e->output, e->input, b->total, b->dtype, b->prescale, d->stream);
    }
    if (st || lone)
        return st;
    size_t esize = b->esize;
    cx_cuda_tensor stack[16];
    size_t m = 0;
    cx_cuda_tensor *desc = segments(b, stack, 16, &m);
    if (!desc)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu descriptors", b->n);
    st = reserve_fusion(d, b->total * esize + 1);
    size_t off = 0;
    for (size_t i = 0; !st && i < b->n; i++) {
        uint64_t count = (uint64_t)cx_shape_elements(b->items[i].ndim, b->items[i].shape);
        if (!b->entries[i]) /* joined: the identity */
            st = cx_cuda_fill_identity((char *)d->fusion + off * esize, count, b->dtype, b->op,
                                       d->stream);
        off += count;
    }
    /* Always set, also with no tensors (a joined rank): the unpack must not see the last batch's */
    if (!st)
        st = cx_cuda_batch_set(d->batch, desc, m, b->dtype, d->stream);
    if (!st && m) {
        *queued = true;
        st = cx_cuda_batch_pack(d->batch, d->fusion, b->prescale, d->stream);
    }
    if (desc != stack)
        free(desc);
    return st;
}

/* Ready agreement; ncclAllReduce and the unpack (postscale, 1/size), all on Conflux's stream;
 * completion; done agreement (which also tells every rank when a communicator failed). */
static cfx_status nccl_allreduce(cx_exec *x, cx_device *d, const cx_allreduce_batch *b, double *tl)
{
    const char *name = b->items[0].name;
    cx_entry *e = b->entries && b->n == 1 ? b->entries[0] : NULL;
    bool lone = e && b->dtype != CFX_BOOL, queued = false;
    cfx_status local = b->local ? b->local : nccl_prepare(d, b, lone, &queued);
    char msg[CX_ERROR_MAX];
    cfx_status st = device_agree(x, d, local, CX_AGREE_READY, name);
    if (st) {
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        if (queued)
            (void)finish(x, d, NULL, 0, st);
        return st == CFX_ERR_TRANSPORT ? st : cx_fail(st, "%s", msg);
    }
    const void *src = !lone ? d->fusion : b->prescale != 1.0 ? e->output : e->input;
    void *dst = lone ? e->output : d->fusion;
    TL_AT(tl, 1);
    if (!st)
        st = cx_nccl_allreduce(d->nccl, src, dst, b->total, b->dtype, b->op);
    TL_AT(tl, 2);
    if (!st && lone && b->postscale != 1.0)
        st = cx_cuda_scale(e->output, e->output, b->total, b->dtype, b->postscale, d->stream);
    else if (!st && !lone)
        st = cx_cuda_batch_unpack(d->batch, d->fusion, b->postscale, d->stream);
    st = finish(x, d, b->entries, b->n, st);
    return device_agree(x, d, st, CX_AGREE_DONE, name);
}
#endif

typedef struct reduce_arg {
    const cx_allreduce_batch *b;
    double *tl;
} reduce_arg;

/* One piece through the host data path (its ready agreement carries `local`). */
static cfx_status reduce_piece(const stage *s, void *half, size_t lo, size_t count,
                               cfx_status local, void *arg)
{
    reduce_arg *a = arg;
    const cx_allreduce_batch *b = a->b;
    cx_response item = b->items[0]; /* name, dtype, op, scale factors; one flat piece */
    item.ndim = 1;
    item.shape[0] = (int64_t)count;
    cx_entry staged, *pe = NULL;
    if (half) {
        memset(&staged, 0, sizeof staged);
        staged.input = staged.output = half;
        staged.bytes = count * b->esize;
        pe = &staged;
    }
    cx_allreduce_batch piece = {&item, 1, &pe, b->dtype, b->op, b->esize, count, b->prescale,
                                b->postscale, local};
    double ptl[4] = {0};
    cfx_status st = cx_exec_allreduce_host(s->x, &piece, ptl);
    if (lo == 0)
        a->tl[1] = ptl[1];
    a->tl[2] = ptl[2];
    return st;
}

/* Device -> page-locked host -> the host data path -> device, piece by piece through two halves
 * of STAGE_PIECE_BYTES (bounded memory, and the copies of one piece overlap the reduction of the
 * next). A joined rank (no entries) stages nothing and takes part with the identity. */
static cfx_status staged_allreduce(cx_exec *x, cx_device *d, const cx_allreduce_batch *b, double *tl)
{
    bool any = false;
    for (size_t i = 0; b->entries && i < b->n; i++)
        any = any || b->entries[i];
    cfx_status local = b->local;
    cx_cuda_tensor stack[16];
    size_t nseg = 0;
    cx_cuda_tensor *segs = any && !local ? segments(b, stack, 16, &nseg) : stack;
    if (!segs)
        local = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu staged tensors", b->n);
    if (any && !local)
        local = check_local(d, b->entries, b->n);
    if (any && !local)
        local = after_producers(d, b->entries, b->n);
    bool staging = any && !local;
    stage s = {x, d, segs, nseg, b->total, b->esize, STAGE_PIECE_BYTES / b->esize, staging, staging};
    reduce_arg a = {b, tl};
    cfx_status st = run_pieces(&s, reduce_piece, &a, &local);
    if (segs && segs != stack)
        free(segs);
    char msg[CX_ERROR_MAX];
    if (staging) /* always, failed or not: the queued copies touch the tensors */
        local = finish(x, d, b->entries, b->n, st ? st : local);
    if (st) { /* agreed at a piece, on every rank */
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        return st == CFX_ERR_TRANSPORT ? st : cx_fail(st, "%s", msg);
    }
    return device_agree(x, d, local, CX_AGREE_DONE, b->items[0].name);
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
        return nccl_allreduce(x, d, b, tl);
#endif
    return staged_allreduce(x, d, b, tl);
}

/* ---- the other collectives -------------------------------------------------------------------- */

static cfx_status bcast_piece(const stage *s, void *half, size_t lo, size_t count, cfx_status local,
                              void *arg)
{
    const cx_response *r = arg;
    cx_transport *t = s->x->transport;
    (void)lo;
    cfx_status st = cx_exec_agree(s->x, local, CX_AGREE_READY, r->name, NULL);
    if (st || t->size == 1 || count == 0)
        return st;
    return t->ops->broadcast(t, half, count, r->root);
}

/* Bytes of a response's tensor, as agreed (the same on every rank). */
static size_t response_bytes(const cx_response *r)
{
    return (size_t)cx_shape_elements(r->ndim, r->shape) * cfx_dtype_size((cfx_dtype)r->dtype);
}

/* The root copies pieces in, every rank broadcasts them over the host data path, the others copy
 * them out into the tensor. */
static cfx_status staged_broadcast(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e)
{
    bool root = r->root == x->transport->rank;
    cfx_status local = e ? check_local(d, &e, 1) : cx_fail(CFX_ERR_INTERNAL, "tensor '%s' missing "
                                                           "from the table", r->name);
    if (!local)
        local = after_producers(d, &e, 1);
    bool staging = !local;
    cx_cuda_tensor seg = {e ? e->input : NULL, e ? e->input : NULL, 0, e ? e->bytes : 0};
    stage s = {x, d, &seg, 1, response_bytes(r), 1, STAGE_PIECE_BYTES, staging && root,
               staging && !root};
    cfx_status st = run_pieces(&s, bcast_piece, (void *)r, &local);
    char msg[CX_ERROR_MAX];
    if (staging)
        local = finish(x, d, &e, 1, st ? st : local);
    if (st) {
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        return st == CFX_ERR_TRANSPORT ? st : cx_fail(st, "%s", msg);
    }
    return device_agree(x, d, local, CX_AGREE_DONE, r->name);
}

#if CFX_DEVICE_NCCL
static cfx_status nccl_broadcast(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e)
{
    cfx_status local = e ? check_local(d, &e, 1) : cx_fail(CFX_ERR_INTERNAL, "tensor '%s' missing "
                                                           "from the table", r->name);
    if (!local && cx_nccl_failed(d->nccl))
        local = cx_fail(CFX_ERR_NCCL, "this rank's NCCL communicator failed earlier");
    if (!local)
        local = after_producers(d, &e, 1);
    cfx_status st = device_agree(x, d, local, CX_AGREE_READY, r->name);
    if (st)
        return st;
    st = cx_nccl_broadcast(d->nccl, e->input, e->bytes, r->root);
    st = finish(x, d, &e, 1, st);
    return device_agree(x, d, st, CX_AGREE_DONE, r->name);
}
#endif

static cfx_status gather_piece(const stage *s, void *half, size_t lo, size_t count,
                               cfx_status local, void *arg)
{
    (void)s;
    if (!local && count)
        memcpy((char *)arg + lo, half, count);
    return local;
}

/* Allgather, alltoall, reducescatter: this rank's input comes to host memory (through the
 * page-locked halves: every wait bounded), then the host data path runs on the copy; the outputs
 * Conflux allocates stay in host memory. */
static cfx_status staged_single(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e)
{
    cfx_status local = e ? check_local(d, &e, 1) : cx_fail(CFX_ERR_INTERNAL, "tensor '%s' missing "
                                                           "from the table", r->name);
    size_t bytes = e ? e->bytes : 0;
    char *host = NULL;
    if (!local && !(host = malloc(bytes + 1)))
        local = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu staged bytes", bytes);
    if (!local)
        local = after_producers(d, &e, 1);
    if (!local && bytes) {
        cx_cuda_tensor seg = {e->input, NULL, 0, bytes};
        stage s = {x, d, &seg, 1, bytes, 1, STAGE_PIECE_BYTES, true, false};
        (void)run_pieces(&s, gather_piece, host, &local);
        local = finish(x, d, NULL, 0, local);
    }
    cfx_status st = device_agree(x, d, local, CX_AGREE_READY, r->name);
    if (!st) {
        cx_entry copy = *e; /* shallow: only input/output differ, never freed */
        copy.input = copy.output = host;
        st = cx_exec_single_host(x, r, &copy);
    }
    free(host);
    return st;
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
        return nccl_broadcast(x, d, r, e);
#endif
    if (r->coll == CX_BROADCAST)
        return staged_broadcast(x, d, r, e);
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
