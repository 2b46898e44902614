/*
 * device_staged - the host-staged pipeline of device tensors (private to exec/device_*.c): device
 * to page-locked host to the host data path and back, piece by piece through two halves. Called by
 * device_exec.c's dispatch; stands on device_prims.h. CUDA builds only.
 */
#ifndef CFX_DEVICE_STAGED_H
#define CFX_DEVICE_STAGED_H

#include "exec/device_prims.h"

#if CFX_DEVICE_CUDA
/* Device -> page-locked host -> the host data path -> device, piece by piece through two halves
 * of STAGE_PIECE_BYTES (bounded memory, and the copies of one piece overlap the reduction of the
 * next). A joined rank (no entries) stages nothing and takes part with the identity. */
cfx_status cx_dev_staged_allreduce(cx_exec *x, cx_device *d, const cx_allreduce_batch *b,
                                   double *tl);

/* The root copies pieces in, every rank broadcasts them over the host data path, the others copy
 * them out into the tensor. */
cfx_status cx_dev_staged_broadcast(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e);

/* Allgather, alltoall, reducescatter: this rank's input comes to host memory (through the
 * page-locked halves: every wait bounded), then the host data path runs on the copy; the outputs
 * Conflux allocates stay in host memory. */
cfx_status cx_dev_staged_single(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e);

#endif /* CFX_DEVICE_CUDA */

#endif /* CFX_DEVICE_STAGED_H */
