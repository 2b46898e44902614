/* host_allreduce - the host data paths of an allreduce batch (host_allreduce.h):
 * shared memory (through the transport's shared-memory layer, shm_layer.h), chunked over the
 * transport with the fusion buffer, the deterministic ordered path, compression on the wire
 * (combine16.h) and Adasum (adasum.h). One concern: how a batch's bytes are reduced on the host. */
#include "exec/host_allreduce.h"

#include "exec/agree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/split.h"
#include "kernels/compress.h"
#include "kernels/reduce.h"
#include "exec/adasum.h"
#include "exec/combine16.h"
#include "exec/shm_layer.h"
#include "observe/timeline.h"

static size_t elements_per_chunk(const cx_exec *x, size_t esize)
{
    size_t n = (size_t)x->cfg->chunk_bytes / esize;
    return n ? n : 1;
}

cfx_status cx_exec_ordered_reduce_scatter(cx_exec *x, const void *send, void *out,
                                          const size_t *counts, cfx_dtype dtype, cfx_reduce_op op)
{
    cx_transport *t = x->transport;
    int size = t->size;
    size_t esize = cfx_dtype_size(dtype);
    size_t mine = counts[t->rank];
    size_t sb[size], sd[size], rb[size], rd[size];
    size_t off = 0;
    for (int j = 0; j < size; j++) {
        sb[j] = counts[j] * esize;
        sd[j] = off;
        off += sb[j];
        rb[j] = mine * esize;
        rd[j] = (size_t)j * mine * esize;
    }
    cfx_status st = cx_exec_reserve(&x->scratch, &x->scratch_cap, mine * esize * (size_t)size);
    if (st)
        return st;
    st = t->ops->alltoallv(t, send, sb, sd, x->scratch, rb, rd);
    if (st)
        return st;
    const char *in = x->scratch;
    memmove(out, in, mine * esize);
    for (int j = 1; j < size; j++)
        cx_reduce_into(out, in + (size_t)j * mine * esize, mine, dtype, op);
    return CFX_OK;
}

/* The ordered path's largest block of a batch of n elements: its first step's (every later step
 * is as long or shorter). */
static size_t ordered_block_elems(const cx_exec *x, size_t n, size_t esize)
{
    size_t size = (size_t)x->transport->size;
    size_t step = elements_per_chunk(x, esize) * size;
    size_t len = n < step ? n : step;
    return (len + size - 1) / size;
}

/* What reduce_chunks' ordered path uses, reserved before the batch's ready agreement so that a
 * failure comes before any collective: x->scratch holds the alltoall's receive area (a block from
 * every rank) and then this rank's reduced block. */
static cfx_status reserve_ordered(cx_exec *x, size_t n, size_t esize)
{
    if (!x->cfg->deterministic || x->transport->size == 1 || n == 0)
        return CFX_OK;
    size_t block = ordered_block_elems(x, n, esize) * esize;
    size_t blocks = (size_t)x->transport->size + 1;
    return cx_exec_reserve(&x->scratch, &x->scratch_cap, block * blocks + 1);
}

/* reduce_chunks with compression on this leg: each chunk packed into the 16-bit `half` with the
 * prescale fused in, combined over the ranks in float32 and rounded once (exec/combine16.h),
 * unpacked with the postscale fused in. */
static cfx_status compressed_chunks(cx_exec *x, const void *src, void *dst, size_t n,
                                    cfx_dtype dtype, cfx_reduce_op op, double prescale,
                                    double postscale, cfx_dtype half)
{
    cx_transport *t = x->transport;
    size_t esize = cfx_dtype_size(dtype);
    size_t step = elements_per_chunk(x, esize);
    cfx_status st = cx_exec_reserve(&x->scratch, &x->scratch_cap,
                            cx_combine16_bytes(n < step ? n : step, t->size));
    for (size_t off = 0; off < n && !st; off += step) {
        size_t len = n - off < step ? n - off : step;
        void *residual = x->residual ? (char *)x->residual + off * esize : NULL;
        cx_compress_pack(x->scratch, (const char *)src + off * esize, residual, len, dtype, half,
                         prescale);
        st = cx_combine16(t, CX_GROUP_WORLD, x->scratch, len, half, op);
        if (!st)
            cx_compress_unpack((char *)dst + off * esize, x->scratch, len, dtype, half, postscale);
    }
    return st;
}

/* Allreduce of n elements from src into dst (which may be the same), chunk by chunk, with the
 * prescale applied as each chunk is staged and the postscale right after its reduction, while
 * the chunk is still in cache. Deterministic mode reduces every element in rank order (its
 * scratch reserved by reserve_ordered). */
static cfx_status reduce_chunks(cx_exec *x, const void *src, void *dst, size_t n, cfx_dtype dtype,
                                cfx_reduce_op op, double prescale, double postscale, uint8_t wire)
{
    cx_transport *t = x->transport;
    int size = t->size;
    size_t esize = cfx_dtype_size(dtype);
    bool ordered = x->cfg->deterministic && size > 1;
    /* MPI's path crosses hosts whenever the job spans them. */
    int half = ordered || size == 1 ? -1 : cx_compression_leg(wire, dtype, t->cross_size > 1);
    if (half >= 0)
        return compressed_chunks(x, src, dst, n, dtype, op, prescale, postscale, (cfx_dtype)half);
    /* Ordered: each rank owns a chunk-sized block of every step. */
    size_t step = elements_per_chunk(x, esize) * (ordered ? (size_t)size : 1);
    size_t counts[size], bytes[size], displs[size];
    char *block = ordered ? (char *)x->scratch +
                            ordered_block_elems(x, n, esize) * esize * (size_t)size : NULL;
    cfx_status st = CFX_OK;
    for (size_t off = 0; off < n && !st; off += step) {
        size_t len = n - off < step ? n - off : step;
        const char *in = (const char *)src + off * esize;
        char *chunk = (char *)dst + off * esize;
        if (in != chunk)
            cx_scale_copy(chunk, in, len, dtype, prescale);
        else
            cx_scale(chunk, len, dtype, prescale);
        if (size > 1 && !ordered) {
            st = t->ops->allreduce(t, chunk, len, dtype, op);
        } else if (ordered) {
            for (int r = 0; r < size; r++) {
                counts[r] = cx_split_start(len, size, r + 1) - cx_split_start(len, size, r);
                bytes[r] = counts[r] * esize;
                displs[r] = cx_split_start(len, size, r) * esize;
            }
            st = cx_exec_ordered_reduce_scatter(x, chunk, block, counts, dtype, op);
            if (!st)
                st = t->ops->allgatherv(t, block, bytes[t->rank], chunk, bytes, displs);
        }
        if (!st)
            cx_scale(chunk, len, dtype, postscale);
    }
    return st;
}

/* Whether allreduces take the shared-memory path. It combines in rank order, so it keeps the
 * deterministic guarantee on one host; across hosts deterministic mode takes the ordered path. */
bool cx_exec_uses_shm(const cx_exec *x)
{
    cx_host_path p = cx_shm_layer_path(x->transport);
    return p.shm && (!x->cfg->deterministic || !p.hierarchical);
}

/* Whether `next` continues the `bytes` at `prev` in memory (two NULLs, a joined rank's identity,
 * continue each other too). */
static bool follows(const void *prev, size_t bytes, const void *next)
{
    return prev && next ? (const char *)prev + bytes == (const char *)next : prev == next;
}

/* Appends `count` elements at src/dst (NULL for a joined rank's identity) to the first `n`
 * segments and returns the new number: a tensor that continues the last one in memory, input and
 * output alike, extends it. A gradient set's owned bucket (contiguous on every rank) becomes one
 * segment, however many gradients it holds, and so stays within the direct path's segment limit;
 * the direct path checks that every local rank cut its batch alike (exec/shm_direct.c). */
static size_t add_segment(cx_segment *segs, size_t n, const void *src, void *dst, size_t count,
                          size_t esize)
{
    cx_segment *last = n ? &segs[n - 1] : NULL;
    if (last && follows(last->src, last->count * esize, src) &&
        follows(last->dst, last->count * esize, dst)) {
        last->count += count;
        return n;
    }
    segs[n] = (cx_segment){src, dst, count};
    return n + 1;
}

cfx_status cx_exec_allreduce_host(cx_exec *x, const cx_allreduce_batch *b, double *tl)
{
    const cx_response *items = b->items;
    cx_entry *const *entries = b->entries;
    size_t n = b->n, esize = b->esize, total = b->total;
    cfx_dtype dtype = b->dtype;
    cfx_reduce_op op = b->op;
    double pre = b->prescale, post = b->postscale;
    const char *name = items[0].name;
    uint8_t wire = items[0].compression; /* agreed, the same for the whole batch */
    if (b->local) /* failed before it started: only the agreement */
        return cx_exec_agree(x, b->local, CX_AGREE_READY, name, NULL);
    if (op == CFX_OP_ADASUM) { /* its own data path (adasum.h); across hosts after a host average */
        cx_host_path path = cx_shm_layer_path(x->transport);
        cx_shm *host = path.hierarchical && cx_exec_uses_shm(x) ? path.shm : NULL;
        cfx_status st = cx_exec_agree(x, cx_adasum_reserve(&x->adasum, items, entries, n, dtype),
                                      CX_AGREE_READY, name, NULL);
        CX_EXEC_TL_STAMP(tl, 1);
        if (!st)
            st = cx_adasum_allreduce(x->adasum, x->transport, host, items, entries, n, dtype, pre,
                                     post);
        CX_EXEC_TL_STAMP(tl, 2);
        return st;
    }
    cfx_status st = CFX_OK;
    if (cx_exec_uses_shm(x)) {
        /* Straight from the tensors into shared memory and back: no fusion buffer. */
        cx_host_path path = cx_shm_layer_path(x->transport);
        size_t nsegs = 0;
        st = cx_exec_reserve(&x->segs, &x->segs_cap, n * sizeof(cx_segment));
        cx_segment *segs = x->segs;
        for (size_t i = 0; !st && i < n; i++)
            nsegs = add_segment(segs, nsegs, entries[i] ? entries[i]->input : NULL,
                                entries[i] ? entries[i]->output : NULL,
                                (size_t)cx_shape_elements(items[i].ndim, items[i].shape), esize);
        st = cx_exec_agree(x, st, CX_AGREE_READY, name, NULL);
        if (!st) {
            CX_EXEC_TL_STAMP(tl, 1);
            st = cx_shm_allreduce_wire(path.shm, x->transport, segs, nsegs, dtype, op, pre, post,
                                       path.hierarchical, cx_compression_leg(wire, dtype, true),
                                       x->residual);
            CX_EXEC_TL_STAMP(tl, 2);
            const char *why;
            int direct = cx_shm_direct_state(path.shm, &why);
            if (direct != x->direct_logged) {
                x->direct_logged = direct;
                if (direct > 0)
                    cx_log(x->log, CX_LOG_INFO, "execute", "allreduce path direct: tensors in "
                           "shared tensor memory on every local rank, reduced without copies");
                else
                    cx_log(x->log, CX_LOG_WARNING, "execute", "no direct path for tensors in "
                           "shared tensor memory (%s): they take the copies", why);
            }
        }
    } else if (n == 1 && entries[0]) {
        cx_entry *e = entries[0];
        st = cx_exec_agree(x, reserve_ordered(x, total, esize), CX_AGREE_READY, name, NULL);
        CX_EXEC_TL_STAMP(tl, 1);
        if (!st)
            st = reduce_chunks(x, e->input, e->output, total, dtype, op, pre, post, wire);
        CX_EXEC_TL_STAMP(tl, 2);
    } else {
        st = cx_exec_reserve(&x->fusion, &x->fusion_cap, total * esize + 1);
        if (!st)
            st = reserve_ordered(x, total, esize);
        char *buf = x->fusion;
        size_t off = 0;
        for (size_t i = 0; !st && i < n; i++) {
            size_t count = (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
            if (entries[i])
                cx_scale_copy(buf + off * esize, entries[i]->input, count, dtype, pre);
            else /* joined: contribute the identity */
                cx_fill_identity(buf + off * esize, count, dtype, op);
            off += count;
        }
        st = cx_exec_agree(x, st, CX_AGREE_READY, name, NULL);
        CX_EXEC_TL_STAMP(tl, 1);
        if (!st)
            st = reduce_chunks(x, buf, buf, total, dtype, op, 1.0, 1.0, wire);
        CX_EXEC_TL_STAMP(tl, 2);
        off = 0;
        for (size_t i = 0; !st && i < n; i++) {
            size_t count = (size_t)cx_shape_elements(items[i].ndim, items[i].shape);
            if (entries[i])
                cx_scale_copy(entries[i]->output, buf + off * esize, count, dtype, post);
            off += count;
        }
    }
    return st;
}
