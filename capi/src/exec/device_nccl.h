/*
 * device_nccl - the NCCL path of device tensors (private to exec/device_*.c): the communicator's
 * set-up with a deadline and its agreement, the allreduce (pack, ncclAllReduce, unpack on
 * Conflux's stream) and the broadcast. Called by device_exec.c's dispatch; stands on
 * device_prims.h (which also holds the communicator's abort and loss). NCCL builds only.
 */
#ifndef CFX_DEVICE_NCCL_H
#define CFX_DEVICE_NCCL_H

#include "exec/device_prims.h"

#if CFX_DEVICE_NCCL
/* Every rank is ready (the info exchange said so) when this runs. Rank 0 makes the id, the control
 * plane broadcasts it, every rank joins with a deadline (the non-blocking set-up), and one
 * agreement decides: all joined, or every rank aborts its communicator and the job takes the
 * host-staged path. Returns a transport error only; otherwise d->nccl is set or NULL and `why`
 * says why not. */
cfx_status cx_dev_nccl_setup(cx_exec *x, cx_device *d, char *why, size_t why_len);

/* Ready agreement; ncclAllReduce and the unpack (postscale, 1/size), all on Conflux's stream;
 * completion; done agreement (which also tells every rank when a communicator failed). */
cfx_status cx_dev_nccl_allreduce(cx_exec *x, cx_device *d, const cx_allreduce_batch *b, double *tl);

cfx_status cx_dev_nccl_broadcast(cx_exec *x, cx_device *d, const cx_response *r, cx_entry *e);
#endif /* CFX_DEVICE_NCCL */

#endif /* CFX_DEVICE_NCCL_H */
