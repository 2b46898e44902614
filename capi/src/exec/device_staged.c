/* device_staged - the host-staged pipeline of device tensors (device_staged.h): device to
 * page-locked host to the host data path and back, piece by piece through two halves, for the
 * allreduce, the broadcast and the collectives that are always host-staged; CUDA builds only. */
#include "exec/device_staged.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"

#if CFX_DEVICE_CUDA

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
            *local = cx_dev_wait_event(s->x, s->d, s->d->ev_piece[k % 2]);
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

cfx_status cx_dev_staged_allreduce(cx_exec *x, cx_device *d, const cx_allreduce_batch *b, double *tl)
{
    bool any = false;
    for (size_t i = 0; b->entries && i < b->n; i++)
        any = any || b->entries[i];
    cfx_status local = b->local;
    cx_cuda_tensor stack[16];
    size_t nseg = 0;
    cx_cuda_tensor *segs = any && !local ? cx_dev_segments(b, stack, 16, &nseg) : stack;
    if (!segs)
        local = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu staged tensors", b->n);
    if (any && !local)
        local = cx_dev_check_local(d, b->entries, b->n);
    if (any && !local)
        local = cx_dev_after_producers(d, b->entries, b->n);
    bool staging = any && !local;
    stage s = {x, d, segs, nseg, b->total, b->esize, STAGE_PIECE_BYTES / b->esize, staging, staging};
    reduce_arg a = {b, tl};
    cfx_status st = run_pieces(&s, reduce_piece, &a, &local);
    if (segs && segs != stack)
        free(segs);
    char msg[CX_ERROR_MAX];
    if (staging) /* always, failed or not: the queued copies touch the tensors */
        local = cx_dev_finish(x, d, b->entries, b->n, st ? st : local);
    if (st) { /* agreed at a piece, on every rank */
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        return st == CFX_ERR_TRANSPORT ? st : cx_fail(st, "%s", msg);
    }
    return cx_dev_agree(x, d, local, CX_AGREE_DONE, b->items[0].name);
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
cfx_status cx_dev_staged_broadcast(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e)
{
    bool root = r->root == x->transport->rank;
    cfx_status local = cx_dev_check_entry(d, e, r->name);
    if (!local)
        local = cx_dev_after_producers(d, &e, 1);
    bool staging = !local;
    cx_cuda_tensor seg = {e ? e->input : NULL, e ? e->input : NULL, 0, e ? e->bytes : 0};
    stage s = {x, d, &seg, 1, response_bytes(r), 1, STAGE_PIECE_BYTES, staging && root,
               staging && !root};
    cfx_status st = run_pieces(&s, bcast_piece, (void *)r, &local);
    char msg[CX_ERROR_MAX];
    if (staging)
        local = cx_dev_finish(x, d, &e, 1, st ? st : local);
    if (st) {
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        return st == CFX_ERR_TRANSPORT ? st : cx_fail(st, "%s", msg);
    }
    return cx_dev_agree(x, d, local, CX_AGREE_DONE, r->name);
}

static cfx_status gather_piece(const stage *s, void *half, size_t lo, size_t count,
                               cfx_status local, void *arg)
{
    (void)s;
    if (!local && count)
        memcpy((char *)arg + lo, half, count);
    return local;
}

cfx_status cx_dev_staged_single(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e)
{
    cfx_status local = cx_dev_check_entry(d, e, r->name);
    size_t bytes = e ? e->bytes : 0;
    char *host = NULL;
    if (!local && !(host = malloc(bytes + 1)))
        local = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu staged bytes", bytes);
    if (!local)
        local = cx_dev_after_producers(d, &e, 1);
    if (!local && bytes) {
        cx_cuda_tensor seg = {e->input, NULL, 0, bytes};
        stage s = {x, d, &seg, 1, bytes, 1, STAGE_PIECE_BYTES, true, false};
        (void)run_pieces(&s, gather_piece, host, &local);
        local = cx_dev_finish(x, d, NULL, 0, local);
    }
    cfx_status st = cx_dev_agree(x, d, local, CX_AGREE_READY, r->name);
    if (!st) {
        cx_entry copy = *e; /* shallow: only input/output differ, never freed */
        copy.input = copy.output = host;
        st = cx_exec_single_host(x, r, &copy);
    }
    free(host);
    return st;
}

#else
typedef int cx_device_staged_absent; /* not an empty translation unit in builds without CUDA */
#endif
