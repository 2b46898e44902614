/* shm_direct - the direct path over the host segment (see shm_direct.h). */
#include "exec/shm_direct.h"

#include <stdio.h>
#include <stdlib.h>

#include "exec/shm_barrier.h"
#include "kernels/reduce.h"

/* Writes this rank's offer for the direct path (every tensor of the batch, input and output, in
 * its shared pool, and nothing to prescale) and returns it. */
bool cx_shm_offer_direct(cx_shm *s, const cx_segment *segs, size_t nsegs, size_t esize,
                         double prescale)
{
    direct_offer *o = &s->offers[s->me];
    bool ok = prescale == 1.0 && nsegs <= CX_SHM_DIRECT_MAX_SEGS;
    for (size_t i = 0; i < nsegs && ok; i++) {
        size_t bytes = segs[i].count * esize;
        o->at[i].src = o->at[i].dst = 0;
        o->at[i].count = segs[i].count;
        if (bytes)
            ok = segs[i].src && segs[i].dst && cx_pool_offset(segs[i].src, bytes, &o->at[i].src) &&
                 cx_pool_offset(segs[i].dst, bytes, &o->at[i].dst);
    }
    if (ok && !s->exported) /* the pool exists: the tensors are in it */
        s->exported = cx_pool_get_export(&o->pool) == CFX_OK;
    ok = ok && s->exported;
    o->nsegs = (uint32_t)(ok ? nsegs : 0);
    o->ok = ok;
    return ok;
}

/* Whether every local rank's offer cut the batch into the same segments as local rank 0's (each
 * rank reads the same offers, so all decide alike). */
bool cx_shm_same_cuts(const cx_shm *s)
{
    const direct_offer *first = &s->offers[0];
    for (int q = 1; q < s->nlocal; q++) {
        const direct_offer *o = &s->offers[q];
        if (o->nsegs != first->nsegs)
            return false;
        for (uint32_t i = 0; i < o->nsegs; i++)
            if (o->at[i].count != first->at[i].count)
                return false;
    }
    return true;
}

/* Maps every peer's pool from the offers (after a barrier at which all offered), then agrees
 * with the peers over the segment: ready only if every rank mapped all; otherwise off for good,
 * with the reason kept for the log, and the batch takes the copies. */
cfx_status cx_shm_setup_direct(cx_shm *s)
{
    cfx_status st = CFX_OK;
    s->peer_pools = calloc((size_t)s->nlocal, sizeof *s->peer_pools);
    s->peer_sizes = calloc((size_t)s->nlocal, sizeof *s->peer_sizes);
    s->strip = aligned_alloc(CX_SHM_CACHE_LINE, CX_SHM_OWN_STRIP_BYTES);
    s->piece = aligned_alloc(CX_SHM_CACHE_LINE, 2 * s->chunk);
    if (!s->peer_pools || !s->peer_sizes || !s->strip || !s->piece)
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the direct path");
    if (!st && s->me < 64 && ((s->direct_map_fail >> s->me) & 1)) /* tests: this rank cannot map */
        st = cx_fail(CFX_ERR_TRANSPORT, "CFX_TEST_DIRECT_MAP_FAIL=%d", s->me);
    for (int q = 0; q < s->nlocal && !st; q++) {
        if (q == s->me)
            continue;
        st = cx_pool_map_peer(&s->offers[q].pool, (void **)&s->peer_pools[q]);
        if (!st)
            s->peer_sizes[q] = s->offers[q].pool.size;
    }
    if (st)
        snprintf(s->direct_off, sizeof s->direct_off, "%s", cx_error_message());
    s->offers[s->me].mapped = st ? 2 : 1;
    cfx_status lost = cx_shm_barrier(s);
    if (lost) {
        cx_shm_unmap_peers(s);
        return lost;
    }
    int failed = -1;
    for (int q = 0; q < s->nlocal; q++)
        if (s->offers[q].mapped != 1 && failed < 0)
            failed = q;
    s->direct = failed < 0 ? DIRECT_READY : DIRECT_OFF;
    if (failed >= 0) {
        cx_shm_unmap_peers(s);
        if (!st)
            snprintf(s->direct_off, sizeof s->direct_off, "local rank %d could not map the other "
                     "ranks' shared tensor memory", failed);
    }
    return CFX_OK;
}

/* Rank q's tensor at element `at` of the batch (input or output), through its pool as mapped here
 * for a peer. Stretches never cross a segment: see direct_stretch. */
static uint8_t *peer_at(const cx_shm *s, const cx_segment *segs, const cx_shm_batch_pos *p, int q,
                          bool output, size_t at, size_t esize)
{
    size_t pos = (at - p->start) * esize;
    if (q == s->me)
        return (output ? (uint8_t *)segs[p->seg].dst : (uint8_t *)segs[p->seg].src) + pos;
    const direct_offer *o = &s->offers[q];
    return s->peer_pools[q] + (output ? o->at[p->seg].dst : o->at[p->seg].src) + pos;
}

/* Moves `p` to the segment holding element `at` and returns how many elements from `at` on stay
 * in it, at most `limit`. */
static size_t stretch(const cx_segment *segs, cx_shm_batch_pos *p, size_t at, size_t limit)
{
    while (p->start + segs[p->seg].count <= at)
        p->start += segs[p->seg++].count;
    size_t m = p->start + segs[p->seg].count - at;
    return m < limit ? m : limit;
}

/* Reduces elements [lo, hi) of the batch over every local rank, in local-rank order (as the copy
 * path does), straight from their tensors into `buf`; `*p` moves along. */
void cx_shm_direct_reduce(const cx_shm *s, const cx_segment *segs, cx_shm_batch_pos *p, size_t lo,
                          size_t hi, uint8_t *buf, cfx_dtype dtype, cfx_reduce_op op)
{
    size_t esize = cfx_dtype_size(dtype);
    for (size_t at = lo, m; at < hi; at += m, buf += m * esize) {
        m = stretch(segs, p, at, hi - at);
        cx_reduce3(buf, peer_at(s, segs, p, 0, false, at, esize),
                   peer_at(s, segs, p, 1, false, at, esize), m, dtype, op);
        for (int q = 2; q < s->nlocal; q++)
            cx_reduce_into(buf, peer_at(s, segs, p, q, false, at, esize), m, dtype, op);
    }
}

/* Writes `buf` (elements [lo, hi) of the result), scaled by postscale, into every local rank's
 * output; `*p` moves along. */
void cx_shm_direct_write(const cx_shm *s, const cx_segment *segs, cx_shm_batch_pos *p, size_t lo,
                         size_t hi, const uint8_t *buf, cfx_dtype dtype, double postscale)
{
    size_t esize = cfx_dtype_size(dtype);
    for (size_t at = lo, m; at < hi; at += m, buf += m * esize) {
        m = stretch(segs, p, at, hi - at);
        for (int q = 0; q < s->nlocal; q++)
            cx_scale_copy(peer_at(s, segs, p, q, true, at, esize), buf, m, dtype, postscale);
    }
}

/* (The strip loop of direct_allreduce, one host.) */
void cx_shm_direct_one_host(cx_shm *s, const cx_segment *segs, size_t n, cfx_dtype dtype,
                            cfx_reduce_op op, double postscale)
{
    size_t esize = cfx_dtype_size(dtype);
    cx_shm_batch_pos rd = {0, 0}, wr = {0, 0}; /* where the reads and the writes have got to */
    size_t lo = cx_shm_block_start(n, s->nlocal, s->me), hi = cx_shm_block_start(n, s->nlocal, s->me + 1);
    for (size_t a = lo, strip = CX_SHM_OWN_STRIP_BYTES / esize; a < hi; a += strip) {
        size_t e = hi - a < strip ? hi : a + strip;
        cx_shm_direct_reduce(s, segs, &rd, a, e, s->strip, dtype, op);
        cx_shm_direct_write(s, segs, &wr, a, e, s->strip, dtype, postscale);
    }
}
