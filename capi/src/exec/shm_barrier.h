/*
 * shm_barrier - where the local ranks meet in the host segment (private to exec/shm_*.c): the
 * barrier (spin, yield, then a futex the last arriver wakes), the liveness of a late peer (its
 * process probed while waiting; CFX_ERR_PEER_LOST naming it when it ended, or at the deadline,
 * from then on for every call on the segment), and the one-host AND of words through the AND
 * rows (cx_shm_allreduce_and, shm.h).
 */
#ifndef CFX_SHM_BARRIER_H
#define CFX_SHM_BARRIER_H

#include "exec/shm_segment.h"

/* Waits for every local rank, yielding for up to yield_s before sleeping. */
cfx_status cx_shm_barrier_yielding(cx_shm *s, double yield_s);

/* The same with the data paths' yield (1 ms). */
cfx_status cx_shm_barrier(cx_shm *s);

#endif /* CFX_SHM_BARRIER_H */
