/* shm_cross - the hierarchical form's step across hosts (see shm_cross.h). */
#include "exec/shm_cross.h"

#include <stdlib.h>

#include "exec/combine16.h"
#include "kernels/compress.h"

/* The cross-host leg of this rank's block (`count` elements of `buf`, in place): in the tensor's
 * dtype, or with `wire` >= 0 packed into that 16-bit dtype, combined over the hosts in float32
 * and rounded once (exec/combine16.h), and unpacked. The block is chunk-sized and was just
 * reduced, so both conversions run on cache-resident data. */
cfx_status cx_shm_cross_leg(cx_shm *s, cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                            cfx_reduce_op op, int wire, void *residual)
{
    if (wire < 0)
        return t->ops->cross_allreduce(t, buf, count, dtype, op);
    /* A block holds at most a chunk of 4-byte elements. */
    size_t bytes = cx_combine16_bytes(s->chunk / 4 + 1, t->cross_size);
    if (!s->wire16 && !(s->wire16 = malloc(bytes)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a compressed block (%zu bytes)",
                       bytes);
    cx_compress_pack(s->wire16, buf, residual, count, dtype, (cfx_dtype)wire, 1.0);
    cfx_status st = cx_combine16(t, CX_GROUP_CROSS, s->wire16, count, (cfx_dtype)wire, op);
    if (!st)
        cx_compress_unpack(buf, s->wire16, count, dtype, (cfx_dtype)wire, 1.0);
    return st;
}

/* A posted block's result, written into every local rank's output. */
static cfx_status direct_wait_write(cx_shm *s, cx_transport *t, const cx_segment *segs,
                                   cx_shm_batch_pos *wr, size_t lo, size_t hi, const uint8_t *piece,
                                   cfx_dtype dtype, double postscale)
{
    cfx_status st = t->ops->cross_allreduce_wait(t);
    if (!st)
        cx_shm_direct_write(s, segs, wr, lo, hi, piece, dtype, postscale);
    return st;
}

/* The direct path across hosts: block i of each chunk is reduced into private scratch,
 * allreduced across hosts, then written into every local rank's output. Where the transport can
 * post the cross-host call and the block crosses uncompressed, chunk k+1 is reduced while chunk k
 * crosses, so the link does not wait for the reduction: the blocks alternate between the two
 * halves of `piece`, and the writes follow in chunk order. */
cfx_status cx_shm_direct_across_hosts(cx_shm *s, cx_transport *t, const cx_segment *segs,
                                      size_t n, cfx_dtype dtype, cfx_reduce_op op,
                                      double postscale, int wire, uint8_t *residual)
{
    bool pipelined = wire < 0 && cx_transport_has(t, CX_TRANSPORT_CROSS_PIPELINE);
    size_t esize = cfx_dtype_size(dtype), per_chunk = s->chunk / esize;
    cx_shm_batch_pos rd = {0, 0}, wr = {0, 0}; /* where the reads and the writes have got to */
    size_t lo[2] = {0, 0}, hi[2] = {0, 0};
    bool crossing = false; /* the other half's chunk is under way */
    int k = 0;
    cfx_status st = CFX_OK;
    for (size_t off = 0; off < n; off += per_chunk, k ^= 1) {
        size_t count = n - off < per_chunk ? n - off : per_chunk;
        lo[k] = off + cx_shm_block_start(count, s->nlocal, s->me);
        hi[k] = off + cx_shm_block_start(count, s->nlocal, s->me + 1);
        uint8_t *piece = s->piece + (size_t)k * s->chunk;
        cx_shm_direct_reduce(s, segs, &rd, lo[k], hi[k], piece, dtype, op);
        /* Ranks with an empty block still call, so the cross group's calls match. */
        if (!pipelined) {
            if ((st = cx_shm_cross_leg(s, t, piece, hi[k] - lo[k], dtype, op, wire,
                                residual ? residual + lo[k] * esize : NULL)))
                return st;
            cx_shm_direct_write(s, segs, &wr, lo[k], hi[k], piece, dtype, postscale);
            continue;
        }
        if ((st = t->ops->cross_allreduce_post(t, piece, hi[k] - lo[k], dtype, op)))
            return st;
        int other = k ^ 1;
        if (crossing && (st = direct_wait_write(s, t, segs, &wr, lo[other], hi[other],
                                                s->piece + (size_t)other * s->chunk, dtype,
                                                postscale)))
            return st;
        crossing = true;
    }
    int last = k ^ 1; /* the half written last */
    return crossing ? direct_wait_write(s, t, segs, &wr, lo[last], hi[last],
                                        s->piece + (size_t)last * s->chunk, dtype, postscale)
                    : CFX_OK;
}

