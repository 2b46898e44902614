/*
 * device_prims - the device primitives both device paths stand on (private to exec/device_*.c):
 * this rank's device state (struct cx_device, described in device_exec.h), the staging constants,
 * and ordering, completion, the device side of the failure agreement, the local checks and the
 * NCCL communicator's state (abort, loss, its flag in the agreement). Below device_nccl.c and
 * device_staged.c, which device_exec.c dispatches to: no file of the three calls back up.
 */
#ifndef CFX_DEVICE_PRIMS_H
#define CFX_DEVICE_PRIMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "exec/device_plan.h"
#include "exec/execute.h"
#include "observe/timeline.h"

#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
#define CFX_DEVICE_CUDA 1
#include "cuda/cuda_kernels.h"
#if defined(CFX_HAVE_NCCL) && CFX_HAVE_NCCL
#define CFX_DEVICE_NCCL 1
#include "cuda/nccl_transport.h"
#endif
#endif

#if CFX_DEVICE_CUDA

typedef struct cx_device cx_device;

/* The host-staged path moves data through two page-locked halves of this size, piece by piece; a
 * constant, so every rank cuts a batch into the same pieces (each piece is one host collective). */
#define STAGE_PIECE_BYTES ((size_t)4 << 20)
/* After an abort, how long the work queued behind the aborted kernels may take to drain. */
#define DRAIN_S 10.0

struct cx_device {
    cx_device_path path;
    int device;                /* the ordinal this rank uses; -1: none */
    void *stream;              /* Conflux's stream (its own); NCCL's collectives run on it too */
    void *ev_in, *ev_done;     /* producer -> Conflux ordering; completion (polled) */
    void *ev_piece[2];         /* host-staged: a half's copy in has landed */
    cx_cuda_batch *batch;      /* descriptors of the pack/unpack kernels */
    void *fusion;              /* device fusion buffer, grown stream-ordered */
    size_t fusion_cap;
    void *pinned;              /* page-locked staging: two halves of STAGE_PIECE_BYTES, made once */
    bool stuck;                /* Conflux's stream did not drain: later waits fail at once */
#if CFX_DEVICE_NCCL
    cx_nccl *nccl;
#endif
    char broken[CX_ERROR_MAX]; /* a local failure that outlives a batch: this rank's batches fail */
};

/* Every device wait is bounded: CFX_STALL_TIMEOUT_S, or 600 s when that is 0 (never). */
static inline double device_timeout(const cx_exec *x)
{
    return x->cfg->stall_timeout_s > 0 ? x->cfg->stall_timeout_s : 600.0;
}

/* ---- device_prims.c: ordering, completion, agreement ---------------------------------------- */

/* Conflux's stream waits on every distinct producer stream of the batch: kernels that wrote the
 * tensors before the call finish before Conflux reads them. */
cfx_status cx_dev_after_producers(cx_device *d, cx_entry *const *entries, size_t n);

/* Every agreement of a device batch (cx_exec_agree), which also tells every rank whether some
 * rank's NCCL communicator failed; then every rank gives NCCL up at this same point. */
cfx_status cx_dev_agree(cx_exec *x, cx_device *d, cfx_status local, cx_agree_phase phase,
                        const char *name);

/* Waits, polling the event, until the work recorded before it on Conflux's stream is done. Spins
 * briefly, then sleeps; polls NCCL's asynchronous error. Bounded (device_timeout): when the
 * deadline passes or NCCL reports an error, the communicator is aborted at once (its kernels stop)
 * and the work queued behind them gets DRAIN_S to finish, so that nothing touches the tensors
 * after their handles complete; a stream that still does not drain makes this rank's later device
 * batches fail. */
cfx_status cx_dev_wait_event(cx_exec *x, cx_device *d, void *event);

/* Every batch that queued device work ends here, failed or not, so that no queued work touches
 * the tensors after their handles complete: on success the callers' streams wait on Conflux's;
 * then the thread waits (bounded) for Conflux's stream. Returns `st`, else the wait's failure. */
cfx_status cx_dev_finish(cx_exec *x, cx_device *d, cx_entry *const *entries, size_t n,
                         cfx_status st);

/* cx_dev_check_local for one response's entry; a lost entry (NULL) is CFX_ERR_INTERNAL naming
 * the tensor, so this rank still takes part in the agreement with that failure. */
cfx_status cx_dev_check_entry(const cx_device *d, cx_entry *e, const char *name);

/* Why this rank cannot run device work for these entries (CFX_OK: it can). */
cfx_status cx_dev_check_local(const cx_device *d, cx_entry *const *entries, size_t n);

/* The batch's tensors as segments of one run (NULL entries, a joined rank's, are left out). */
cx_cuda_tensor *cx_dev_segments(const cx_allreduce_batch *b, cx_cuda_tensor *stack, size_t cap,
                                size_t *nseg);

#if CFX_DEVICE_NCCL
/* ---- the NCCL communicator's state (device_prims.c) ------------------------------------------ */

/* Aborts this rank's communicator now; the next done agreement tells the others. */
void cx_dev_nccl_abort(cx_device *d);

/* After an agreement in which some rank's communicator had failed: every rank gives NCCL up at
 * this same point, and device tensors take the host-staged path from now on. */
void cx_dev_nccl_lose(cx_exec *x, cx_device *d, uint32_t flags);

uint32_t cx_dev_nccl_flags(const cx_device *d);
#endif /* CFX_DEVICE_NCCL */


#endif /* CFX_DEVICE_CUDA */

#endif /* CFX_DEVICE_PRIMS_H */
