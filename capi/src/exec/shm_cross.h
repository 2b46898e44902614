/*
 * shm_cross - the hierarchical form's step across hosts (private to exec/shm_*.c): one block of a
 * chunk across hosts (cx_shm_cross_leg: in the tensor's dtype, or packed into a 16-bit wire dtype,
 * combined in float32 and rounded once), and the direct path across hosts, pipelined where the
 * transport posts its cross-host call (CX_TRANSPORT_CROSS_PIPELINE): chunk k+1 is reduced while
 * chunk k crosses. The copy path pipelines its chunks the same way within its own loop
 * (shm_copy.c), through the same transport calls.
 */
#ifndef CFX_SHM_CROSS_H
#define CFX_SHM_CROSS_H

#include "exec/shm_direct.h"

/* This rank's block (`count` elements of `buf`, in place) across hosts; `wire` >= 0: the 16-bit
 * dtype it travels in, with `residual` (NULL: none) read and rewritten where this rank packs. */
cfx_status cx_shm_cross_leg(cx_shm *s, cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                            cfx_reduce_op op, int wire, void *residual);

/* The direct path's hierarchical form over the batch's n elements (no closing barrier: the
 * caller's). */
cfx_status cx_shm_direct_across_hosts(cx_shm *s, cx_transport *t, const cx_segment *segs,
                                      size_t n, cfx_dtype dtype, cfx_reduce_op op,
                                      double postscale, int wire, uint8_t *residual);

#endif /* CFX_SHM_CROSS_H */
