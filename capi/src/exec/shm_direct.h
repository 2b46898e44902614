/*
 * shm_direct - the direct path over the host segment (private to exec/shm_*.c; shm.h describes
 * it): each local rank's offer of a batch whose tensors all lie in its shared pool, the check that
 * every rank cut the batch alike, mapping the peers' pools once (agreed over the segment: all or
 * none, for good), and the reads and writes straight from and into every local rank's tensors in
 * local-rank order. One host: cx_shm_direct_one_host; across hosts: shm_cross.c.
 */
#ifndef CFX_SHM_DIRECT_H
#define CFX_SHM_DIRECT_H

#include "exec/shm_segment.h"

/* Writes this rank's offer for the direct path (every tensor of the batch, input and output, in
 * its shared pool, and nothing to prescale) and returns it. */
bool cx_shm_offer_direct(cx_shm *s, const cx_segment *segs, size_t nsegs, size_t esize,
                         double prescale);

/* Whether every local rank's offer cut the batch into the same segments as local rank 0's (each
 * rank reads the same offers, so all decide alike). */
bool cx_shm_same_cuts(const cx_shm *s);

/* Maps every peer's pool from the offers (after a barrier at which all offered), then agrees with
 * the peers over the segment: s->direct ready only if every rank mapped all, else off for good. */
cfx_status cx_shm_setup_direct(cx_shm *s);

/* A position in the batch for the direct path: segment `seg` holds elements [start, start +
 * count); it only moves forward. */
typedef struct cx_shm_batch_pos {
    size_t seg, start;
} cx_shm_batch_pos;

/* Reduces elements [lo, hi) of the batch over every local rank, in local-rank order (as the copy
 * path does), straight from their tensors into `buf`; `*p` moves along. */
void cx_shm_direct_reduce(const cx_shm *s, const cx_segment *segs, cx_shm_batch_pos *p, size_t lo,
                          size_t hi, uint8_t *buf, cfx_dtype dtype, cfx_reduce_op op);

/* Writes `buf` (elements [lo, hi) of the result), scaled by postscale, into every local rank's
 * output; `*p` moves along. */
void cx_shm_direct_write(const cx_shm *s, const cx_segment *segs, cx_shm_batch_pos *p, size_t lo,
                         size_t hi, const uint8_t *buf, cfx_dtype dtype, double postscale);

/* One host: local rank i reduces block i of the whole batch (n elements) in L1-sized strips,
 * each written into every rank's output right after its reduction (no barrier: the caller's). */
void cx_shm_direct_one_host(cx_shm *s, const cx_segment *segs, size_t n, cfx_dtype dtype,
                            cfx_reduce_op op, double postscale);

#endif /* CFX_SHM_DIRECT_H */
