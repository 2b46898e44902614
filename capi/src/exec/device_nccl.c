/* device_nccl - the NCCL path of device tensors (device_nccl.h): the communicator's set-up with a
 * deadline and its agreement, and the allreduce (pack, ncclAllReduce, unpack on Conflux's
 * stream) and broadcast; NCCL builds only. */
#include "exec/device_nccl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "base/log.h"

#if CFX_DEVICE_NCCL

cfx_status cx_dev_nccl_setup(cx_exec *x, cx_device *d, char *why, size_t why_len)
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
    cfx_status st = cx_dev_check_local(d, b->entries, b->n);
    if (!st && cx_nccl_failed(d->nccl))
        st = cx_fail(CFX_ERR_NCCL, "this rank's NCCL communicator failed earlier");
    if (!st)
        st = cx_dev_after_producers(d, b->entries, b->n);
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
    cx_cuda_tensor *desc = cx_dev_segments(b, stack, 16, &m);
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

cfx_status cx_dev_nccl_allreduce(cx_exec *x, cx_device *d, const cx_allreduce_batch *b, double *tl)
{
    const char *name = b->items[0].name;
    cx_entry *e = b->entries && b->n == 1 ? b->entries[0] : NULL;
    bool lone = e && b->dtype != CFX_BOOL, queued = false;
    cfx_status local = b->local ? b->local : nccl_prepare(d, b, lone, &queued);
    char msg[CX_ERROR_MAX];
    cfx_status st = cx_dev_agree(x, d, local, CX_AGREE_READY, name);
    if (st) {
        snprintf(msg, sizeof msg, "%s", cx_error_message());
        if (queued)
            (void)cx_dev_finish(x, d, NULL, 0, st);
        return st == CFX_ERR_TRANSPORT ? st : cx_fail(st, "%s", msg);
    }
    const void *src = !lone ? d->fusion : b->prescale != 1.0 ? e->output : e->input;
    void *dst = lone ? e->output : d->fusion;
    CX_EXEC_TL_STAMP(tl, 1);
    if (!st)
        st = cx_nccl_allreduce(d->nccl, src, dst, b->total, b->dtype, b->op);
    CX_EXEC_TL_STAMP(tl, 2);
    if (!st && lone && b->postscale != 1.0)
        st = cx_cuda_scale(e->output, e->output, b->total, b->dtype, b->postscale, d->stream);
    else if (!st && !lone)
        st = cx_cuda_batch_unpack(d->batch, d->fusion, b->postscale, d->stream);
    st = cx_dev_finish(x, d, b->entries, b->n, st);
    return cx_dev_agree(x, d, st, CX_AGREE_DONE, name);
}
cfx_status cx_dev_nccl_broadcast(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e)
{
    cfx_status local = cx_dev_check_entry(d, e, r->name);
    if (!local && cx_nccl_failed(d->nccl))
        local = cx_fail(CFX_ERR_NCCL, "this rank's NCCL communicator failed earlier");
    if (!local)
        local = cx_dev_after_producers(d, &e, 1);
    cfx_status st = cx_dev_agree(x, d, local, CX_AGREE_READY, r->name);
    if (st)
        return st;
    st = cx_nccl_broadcast(d->nccl, e->input, e->bytes, r->root);
    st = cx_dev_finish(x, d, &e, 1, st);
    return cx_dev_agree(x, d, st, CX_AGREE_DONE, r->name);
}

#else
typedef int cx_device_nccl_absent; /* not an empty translation unit in builds without NCCL */
#endif
