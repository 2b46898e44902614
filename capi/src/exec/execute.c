/* execute - the collective engine on one rank (see execute.h): its state, the dispatch of a
 * response list, and the collectives other than the host allreduce (allgather, alltoall,
 * reducescatter, broadcast, barrier, join). The failure agreement is in agree.c, the host
 * allreduce paths in host_allreduce.c. */
#include "exec/execute.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/hugemem.h"
#include "protocol/fusion.h"
#include "kernels/reduce.h"
#include "exec/adasum.h"
#include "observe/timeline.h"

void cx_exec_init(cx_exec *x, cx_transport *t, const cx_config *cfg, cx_queue *q, cx_handles *h,
                  const cx_logger *log)
{
    memset(x, 0, sizeof *x);
    x->transport = t;
    x->cfg = cfg;
    x->queue = q;
    x->handles = h;
    x->log = log;
}

/* A response whose entry this rank lost (an internal inconsistency): it still takes part in the
 * agreement with this failure, so the peers fail the response too instead of waiting for it. */
static cfx_status lost_entry(const cx_exec *x, const char *name)
{
    return cx_fail(CFX_ERR_INTERNAL, "tensor '%s' missing from the table on rank %d", name,
                   x->transport->rank);
}

/* A device response on an engine without a device path (cx_exec.device_ops unset). */
static cfx_status no_device_path(const cx_response *r)
{
    return cx_fail(CFX_ERR_UNSUPPORTED, "tensor '%s': no device data path in this engine", r->name);
}

void cx_exec_destroy(cx_exec *x)
{
    if (x->device && x->device_ops) /* normally done already by the background thread (loop.c) */
        x->device_ops->destroy(x->device);
    x->device = NULL;
    cx_adasum_free(x->adasum);
    x->adasum = NULL;
    cx_huge_free(x->fusion, x->fusion_cap);
    cx_huge_free(x->scratch, x->scratch_cap);
    cx_huge_free(x->segs, x->segs_cap);
    x->fusion = x->scratch = x->segs = NULL;
    x->fusion_cap = x->scratch_cap = x->segs_cap = 0;
}

void cx_exec_complete(cx_exec *x, cx_entry *e, cfx_status status, const char *message)
{
    if (!e)
        return;
    cx_handles_complete_part(x->handles, e->handle, status, message);
    cx_entry_free(e);
}

static double final_scale(const cx_exec *x, const cx_response *r)
{
    double f = r->postscale;
    if (r->op == CFX_OP_AVERAGE)
        f /= (double)x->transport->size;
    return f;
}

/* entries == NULL: they could not be listed; each is taken from the table by name. */
static void fail_entries(cx_exec *x, const cx_response *items, size_t n, cx_entry **entries,
                         cfx_status st, const char *msg)
{
    for (size_t i = 0; i < n; i++) {
        cx_entry *e = entries ? entries[i] : cx_queue_take(x->queue, items[i].name);
        if (e)
            cx_exec_complete(x, e, st, msg);
        else if (!x->joined)
            cx_log(x->log, CX_LOG_ERROR, "execute", "tensor '%s' missing from the table", items[i].name);
    }
}

/* Timeline (timeline.h): PACK, ALLREDUCE and UNPACK of a batch, from stamps t[0..3], on the lane
 * of every tensor in it; the collective carries the batch's bytes and tensor count. */
static void timeline_allreduce(cx_exec *x, const cx_response *items, size_t n, const double *t,
                               size_t bytes)
{
    for (size_t i = 0; i < n; i++) {
        cx_timeline_phase(x->timeline, items[i].name, CX_TL_PACK, "PACK", t[0], t[1], -1, 0);
        cx_timeline_phase(x->timeline, items[i].name, CX_TL_COLLECTIVE, "ALLREDUCE", t[1], t[2],
                          (int64_t)bytes, (int64_t)n);
        cx_timeline_phase(x->timeline, items[i].name, CX_TL_UNPACK, "UNPACK", t[2], t[3], -1, 0);
    }
}

/* Timeline: every tensor of the list ends NEGOTIATE as the list starts to run; failures get a mark. */
static void timeline_negotiated(cx_exec *x, const cx_response_list *responses)
{
    double now = cx_timeline_now();
    for (size_t i = 0; i < responses->count; i++) {
        const cx_response *r = &responses->items[i];
        cx_timeline_negotiated(x->timeline, r->name, now);
        if (r->status != CFX_OK)
            cx_timeline_mark(x->timeline, r->name, cfx_status_string((cfx_status)r->status), -1, now);
    }
}

/* One or more fused allreduce responses. */
static cfx_status run_allreduce(cx_exec *x, const cx_response *items, size_t n)
{
    const cx_response *first = &items[0];
    cx_entry *stack_entries[16];
    cx_entry **entries = n <= 16 ? stack_entries : malloc(n * sizeof *entries);
    cx_allreduce_batch b = {items, n, entries, (cfx_dtype)first->dtype, (cfx_reduce_op)first->op,
                            cfx_dtype_size((cfx_dtype)first->dtype), 0, first->prescale,
                            final_scale(x, first), CFX_OK};
    /* A rank that cannot list its entries, or lost one (not joined), still takes part in the
     * batch's ready agreement (b.local), so that every rank fails the batch. */
    if (!entries)
        b.local = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for %zu entries", n);
    for (size_t i = 0; i < n; i++) {
        if (entries) {
            entries[i] = cx_queue_take(x->queue, items[i].name);
            if (!entries[i] && !x->joined && !b.local)
                b.local = lost_entry(x, items[i].name);
        }
        b.total += (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
    }
    double tl[4] = {0};
    CX_EXEC_TL_STAMP(tl, 0);
    /* Device tensors (the kind is agreed, so every rank takes the same branch): cx_device_ops. */
    cfx_status st = first->device == CFX_DEVICE_CPU ? cx_exec_allreduce_host(x, &b, tl)
                    : x->device_ops                 ? x->device_ops->allreduce(x, &b, tl)
                                                    : no_device_path(first);
    CX_EXEC_TL_STAMP(tl, 3);
    if (CX_TL(x->timeline) && !st)
        timeline_allreduce(x, items, n, tl, b.total * b.esize);
    if (st) {
        char msg[CX_ERROR_MAX];
        snprintf(msg, sizeof msg, "allreduce of tensor '%s'%s failed: %s", first->name,
                 n > 1 ? " and the tensors fused with it" : "", cx_error_message());
        fail_entries(x, items, n, entries, st, msg);
    } else {
        for (size_t i = 0; i < n; i++)
            cx_exec_complete(x, entries[i], CFX_OK, NULL);
    }
    if (entries != stack_entries)
        free(entries);
    return st;
}

static size_t row_bytes(const cx_response *r)
{
    size_t b = cfx_dtype_size(r->dtype);
    for (int32_t i = 1; i < r->ndim; i++)
        b *= (size_t)r->shape[i];
    return b;
}

static void set_output(cx_exec *x, cx_entry *e, void *data, size_t bytes, const cx_response *r,
                       int64_t rows, int64_t *splits)
{
    cx_output o;
    memset(&o, 0, sizeof o);
    o.data = data;
    o.bytes = bytes;
    o.dtype = r->dtype;
    o.ndim = r->ndim;
    memcpy(o.shape, r->shape, sizeof o.shape);
    o.shape[0] = rows;
    o.splits = splits;
    cx_handles_set_output(x->handles, e->handle, e->part, &o);
}

static cfx_status run_allgather(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_transport *t = x->transport;
    int size = t->size;
    size_t rb = row_bytes(r);
    size_t bytes[size], displs[size];
    size_t total = 0;
    int64_t rows = 0;
    int64_t *splits = malloc(sizeof(int64_t) * (size_t)size);
    for (int j = 0; j < size; j++) {
        bytes[j] = (size_t)r->rank_rows[j] * rb;
        displs[j] = total;
        total += bytes[j];
        rows += r->rank_rows[j];
        if (splits)
            splits[j] = r->rank_rows[j];
    }
    void *out = malloc(total ? total : 1);
    cfx_status st = !e ? lost_entry(x, r->name)
                    : out && splits ? CFX_OK
                                    : cx_fail(CFX_ERR_OUT_OF_MEMORY, "allgather of tensor '%s': "
                                              "out of memory for %zu output bytes", r->name, total);
    st = cx_exec_agree(x, st, CX_AGREE_READY, r->name, NULL);
    if (!st)
        st = t->ops->allgatherv(t, e->input, bytes[t->rank], out, bytes, displs);
    if (st) {
        free(out);
        free(splits);
        return st;
    }
    set_output(x, e, out, total, r, rows, splits);
    return CFX_OK;
}

static cfx_status run_alltoall(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_transport *t = x->transport;
    int size = t->size;
    size_t rb = row_bytes(r);
    int64_t *recv_rows = malloc(sizeof(int64_t) * (size_t)size);
    cfx_status st = !e ? lost_entry(x, r->name)
                    : recv_rows ? CFX_OK
                                : cx_fail(CFX_ERR_OUT_OF_MEMORY, "alltoall of tensor '%s': out of "
                                          "memory", r->name);
    size_t eight[size], sd[size], sb[size], rbytes[size], rd[size];
    for (int j = 0; j < size; j++) {
        eight[j] = sizeof(int64_t);
        sd[j] = rd[j] = (size_t)j * sizeof(int64_t);
    }
    st = cx_exec_agree(x, st, CX_AGREE_READY, r->name, NULL);
    if (!st)
        st = t->ops->alltoallv(t, e->splits, eight, sd, recv_rows, eight, rd);
    if (st) {
        free(recv_rows);
        return st;
    }
    /* The row counts came in: the output is allocated, and agreed on, before the data moves. */
    size_t soff = 0, roff = 0;
    for (int j = 0; !st && j < size; j++) {
        sb[j] = (size_t)e->splits[j] * rb;
        sd[j] = soff;
        soff += sb[j];
        if (recv_rows[j] < 0)
            st = cx_fail(CFX_ERR_INTERNAL, "alltoall of tensor '%s': rank %d announced %lld rows",
                         r->name, j, (long long)recv_rows[j]);
        rbytes[j] = (size_t)recv_rows[j] * rb;
        rd[j] = roff;
        roff += rbytes[j];
    }
    void *out = st ? NULL : malloc(roff ? roff : 1);
    if (!st && !out)
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "alltoall of tensor '%s': out of memory for %zu bytes",
                     r->name, roff);
    st = cx_exec_agree(x, st, CX_AGREE_READY, r->name, NULL);
    if (!st)
        st = t->ops->alltoallv(t, e->input, sb, sd, out, rbytes, rd);
    if (st) {
        free(out);
        free(recv_rows);
        return st;
    }
    int64_t rows = 0;
    for (int j = 0; j < size; j++)
        rows += recv_rows[j];
    set_output(x, e, out, roff, r, rows, recv_rows);
    return CFX_OK;
}

/* Rows rank r receives from a reducescatter of d0 rows over size ranks. */
static int64_t scatter_rows(int64_t d0, int size, int r)
{
    return d0 / size + (r < d0 % size ? 1 : 0);
}

static cfx_status run_reducescatter(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_transport *t = x->transport;
    int size = t->size;
    cfx_dtype dtype = (cfx_dtype)r->dtype;
    size_t esize = cfx_dtype_size(dtype);
    size_t row_elems = row_bytes(r) / esize;
    size_t counts[size];
    size_t total = 0;
    for (int j = 0; j < size; j++) {
        counts[j] = (size_t)scatter_rows(r->shape[0], size, j) * row_elems;
        total += counts[j];
    }
    size_t mine = counts[t->rank];
    void *out = malloc(mine * esize + 1);
    void *send = e ? e->input : NULL;
    void *scaled = NULL;
    cfx_status st = !e ? lost_entry(x, r->name)
                    : out ? CFX_OK
                          : cx_fail(CFX_ERR_OUT_OF_MEMORY, "reducescatter of tensor '%s': out of "
                                    "memory", r->name);
    if (!st && r->prescale != 1.0) {
        if (!(scaled = malloc(total * esize + 1)))
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "reducescatter of tensor '%s': out of memory", r->name);
        else
            cx_scale_copy(scaled, e->input, total, dtype, r->prescale);
        send = scaled;
    }
    if (!st && x->cfg->deterministic && size > 1) /* the ordered path's receive area */
        st = cx_exec_reserve(&x->scratch, &x->scratch_cap, mine * esize * (size_t)size + 1);
    st = cx_exec_agree(x, st, CX_AGREE_READY, r->name, NULL);
    if (!st) {
        if (size == 1)
            memcpy(out, send, mine * esize);
        else if (x->cfg->deterministic)
            st = cx_exec_ordered_reduce_scatter(x, send, out, counts, dtype, (cfx_reduce_op)r->op);
        else
            st = t->ops->reduce_scatter(t, send, out, counts, dtype, (cfx_reduce_op)r->op);
    }
    free(scaled);
    if (st) {
        free(out);
        return st;
    }
    cx_scale(out, mine, dtype, final_scale(x, r));
    set_output(x, e, out, mine * esize, r, scatter_rows(r->shape[0], size, t->rank), NULL);
    return CFX_OK;
}

/* Several allgathers as one allgatherv: each rank sends its inputs back to back; each output is
 * then assembled from every rank's part. */
static cfx_status run_allgather_fused(cx_exec *x, const cx_response *items, size_t n)
{
    cx_transport *t = x->transport;
    int size = t->size;
    cx_entry **entries = calloc(n, sizeof *entries);
    size_t *rb = calloc(n, sizeof *rb);
    char **outs = calloc(n, sizeof *outs); /* every output, allocated before the agreement */
    int64_t **splits = calloc(n, sizeof *splits);
    size_t bytes[size], displs[size];
    cfx_status st = entries && rb && outs && splits ? CFX_OK
                                                    : cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; entries && i < n; i++) {
        entries[i] = cx_queue_take(x->queue, items[i].name);
        if (!entries[i] && !st)
            st = lost_entry(x, items[i].name);
    }
    size_t total = 0;
    for (int r = 0; !st && r < size; r++) {
        bytes[r] = 0;
        for (size_t i = 0; i < n; i++)
            bytes[r] += (size_t)items[i].rank_rows[r] * row_bytes(&items[i]);
        displs[r] = total;
        total += bytes[r];
    }
    char *send = NULL, *recv = NULL;
    if (!st) {
        send = malloc(bytes[t->rank] + 1);
        recv = malloc(total + 1);
        if (!send || !recv)
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a fused allgather of %zu bytes", total);
    }
    for (size_t i = 0; !st && i < n; i++) {
        rb[i] = row_bytes(&items[i]);
        outs[i] = malloc(cx_allgather_bytes(&items[i]) + 1);
        splits[i] = malloc(sizeof(int64_t) * (size_t)size);
        if (!outs[i] || !splits[i])
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for allgather output '%s'", items[i].name);
    }
    size_t off = 0;
    for (size_t i = 0; !st && i < n; i++) {
        size_t b = (size_t)items[i].rank_rows[t->rank] * rb[i];
        if (b)
            memcpy(send + off, entries[i]->input, b);
        off += b;
    }
    st = cx_exec_agree(x, st, CX_AGREE_READY, items[0].name, NULL);
    if (!st)
        st = t->ops->allgatherv(t, send, bytes[t->rank], recv, bytes, displs);
    size_t part[size]; /* read position within each rank's part of recv */
    for (int r = 0; r < size; r++)
        part[r] = 0;
    for (size_t i = 0; !st && i < n; i++) {
        size_t o = 0;
        int64_t rows = 0;
        for (int r = 0; r < size; r++) {
            size_t b = (size_t)items[i].rank_rows[r] * rb[i];
            if (b)
                memcpy(outs[i] + o, recv + displs[r] + part[r], b);
            part[r] += b;
            o += b;
            splits[i][r] = items[i].rank_rows[r];
            rows += splits[i][r];
        }
        set_output(x, entries[i], outs[i], cx_allgather_bytes(&items[i]), &items[i], rows, splits[i]);
        outs[i] = NULL;
        splits[i] = NULL;
    }
    free(send);
    free(recv);
    char msg[CX_ERROR_MAX];
    if (st)
        snprintf(msg, sizeof msg, "allgather of tensor '%s' and the tensors fused with it failed: %s",
                 items[0].name, cx_error_message());
    for (size_t i = 0; i < n; i++) {
        cx_exec_complete(x, entries ? entries[i] : cx_queue_take(x->queue, items[i].name), st,
                         st ? msg : NULL);
        if (outs)
            free(outs[i]);
        if (splits)
            free(splits[i]);
    }
    free(entries);
    free(rb);
    free(outs);
    free(splits);
    return st;
}

cfx_status cx_exec_single_host(cx_exec *x, const cx_response *r, cx_entry *e)
{
    cx_transport *t = x->transport;
    cfx_status st;
    switch (r->coll) {
    case CX_BROADCAST:
        st = cx_exec_agree(x, e ? CFX_OK : lost_entry(x, r->name), CX_AGREE_READY, r->name, NULL);
        return st || t->size == 1 ? st : t->ops->broadcast(t, e->input, e->bytes, r->root);
    case CX_ALLGATHER:
        return run_allgather(x, r, e);
    case CX_ALLTOALL:
        return run_alltoall(x, r, e);
    case CX_REDUCESCATTER:
        return run_reducescatter(x, r, e);
    case CX_BARRIER:
        return t->size == 1 ? CFX_OK : t->ops->barrier(t);
    case CX_JOIN: /* no communication */
        if (e)
            cx_handles_set_join_rank(x->handles, e->handle, r->last_joined);
        x->joined = false;
        return e ? CFX_OK : lost_entry(x, r->name);
    default:
        return cx_fail(CFX_ERR_INTERNAL, "tensor '%s': unknown collective %d", r->name, r->coll);
    }
}

cfx_status cx_execute(cx_exec *x, const cx_response_list *responses)
{
    cfx_status failure = CFX_OK;
    if (CX_TL(x->timeline))
        timeline_negotiated(x, responses);
    for (size_t i = 0; i < responses->count;) {
        const cx_response *r = &responses->items[i];
        if (r->status != CFX_OK) {
            cx_exec_complete(x, cx_queue_take(x->queue, r->name), (cfx_status)r->status, r->message);
            i++;
            continue;
        }
        if (r->coll == CX_ALLREDUCE) {
            /* The shared-memory path reads every tensor where it lies, so large tensors fuse as
             * freely as small ones: chunks then run across tensor boundaries, and no tensor's tail
             * is a short chunk of its own. Elsewhere the fusion buffer would copy them. */
            int64_t cap = cx_exec_uses_shm(x) && r->device == CFX_DEVICE_CPU ? INT64_MAX : x->cfg->chunk_bytes;
            size_t n = cx_fusion_batch(responses->items, responses->count, i,
                                       x->cfg->fusion_threshold, cap);
            cfx_status st = run_allreduce(x, r, n);
            if (st == CFX_ERR_TRANSPORT && !failure)
                failure = st;
            i += n;
            continue;
        }
        if (r->coll == CX_ALLGATHER && r->device == CFX_DEVICE_CPU) { /* device: one at a time */
            size_t n = cx_fusion_batch(responses->items, responses->count, i,
                                       x->cfg->fusion_threshold, x->cfg->chunk_bytes);
            if (n > 1) {
                cfx_status st = run_allgather_fused(x, r, n);
                if (st == CFX_ERR_TRANSPORT && !failure)
                    failure = st;
                i += n;
                continue;
            }
        }
        cx_entry *e = cx_queue_take(x->queue, r->name);
        i++;
        double tl[2] = {0};
        CX_EXEC_TL_STAMP(tl, 0);
        /* A lost entry (e == NULL) still takes part, so the peers fail the response with it. */
        cfx_status st = r->device == CFX_DEVICE_CPU ? cx_exec_single_host(x, r, e)
                        : x->device_ops             ? x->device_ops->single(x, r, e)
                                                    : no_device_path(r);
        CX_EXEC_TL_STAMP(tl, 1);
        if (!e) {
            cx_log(x->log, CX_LOG_ERROR, "execute", "tensor '%s' (%s) missing from the table",
                   r->name, cx_coll_name(r->coll));
            if (st == CFX_ERR_TRANSPORT && !failure)
                failure = st;
            continue;
        }
        if (CX_TL(x->timeline))
            cx_timeline_phase(x->timeline, r->name, CX_TL_COLLECTIVE, cx_timeline_coll_label(r->coll),
                              tl[0], tl[1], (int64_t)e->bytes, 1);
        if (st) {
            char msg[CX_ERROR_MAX];
            snprintf(msg, sizeof msg, "%s of tensor '%s' failed: %s", cx_coll_name(r->coll), r->name,
                     cx_error_message());
            cx_exec_complete(x, e, st, msg);
            if (st == CFX_ERR_TRANSPORT && !failure)
                failure = st;
        } else {
            cx_exec_complete(x, e, CFX_OK, NULL);
        }
    }
    return failure;
}
