/*
 * exec_state - what the collective engine's files share, below all of them (execute.h gathers the
 * interfaces for the engine's users): the engine's state on one rank (cx_exec), one fused
 * allreduce batch as every data path sees it, the device path's interface (inverted: device_exec.c
 * implements it, the cycle's set-up installs it), and the reservation of the engine's buffers.
 */
#ifndef CFX_EXEC_STATE_H
#define CFX_EXEC_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "base/log.h"
#include "protocol/handles.h"
#include "protocol/queue.h"
#include "protocol/wire.h"
#include "transport/transport.h"

typedef struct cx_exec {
    cx_transport *transport;
    const cx_config *cfg;
    cx_queue *queue;
    cx_handles *handles;
    const cx_logger *log;
    bool joined;          /* this rank has joined and not yet been released by the join */
    void *fusion;         /* the fusion buffer, grown on demand up to the threshold */
    size_t fusion_cap;
    void *scratch;        /* staging for deterministic reductions and joined ranks */
    size_t scratch_cap;
    void *segs;           /* the shared-memory path's segment list (cx_segment), grown on demand */
    size_t segs_cap;
    void *residual;       /* set by a gradient set with error feedback for one batch: what
                             rounding took from each element this rank packs (kernels/compress.h) */
    struct cx_adasum *adasum; /* Adasum's buffers (adasum.h), made by its first batch, or NULL */
    int direct_logged;    /* the shm direct path's state last logged (cx_shm_direct_state); the
                             host path itself is the transport's layer (shm_layer.h) */
    struct cx_timeline *timeline; /* the context's, or NULL (timeline.h) */
    struct cx_device *device; /* device tensors' state (device_exec.h): made by the first device
                                 response, or NULL */
    const struct cx_device_ops *device_ops; /* the device path, or NULL (device tensors fail) */
} cx_exec;

struct cx_allreduce_batch;

/* The device path as the engine reaches it (device_exec.h implements it; the context installs it
 * in cx_exec.device_ops). Tensors' memory kind is part of the agreed response, so every rank
 * dispatches the same response the same way. */
typedef struct cx_device_ops {
    /* A fused allreduce batch of device tensors; neither takes nor completes the entries. */
    cfx_status (*allreduce)(cx_exec *x, const struct cx_allreduce_batch *b, double *tl);
    /* One non-allreduce response of a device tensor with this rank's entry (not completed). */
    cfx_status (*single)(cx_exec *x, const cx_response *r, cx_entry *e);
    /* Frees x->device (accepts NULL): called by the background thread as its loop ends. */
    void (*destroy)(struct cx_device *device);
} cx_device_ops;

/* One fused allreduce batch, described once by execute.c for whichever data path runs it. */
typedef struct cx_allreduce_batch {
    const cx_response *items; /* n responses; items[0]'s dtype, op and scale factors hold for all */
    size_t n;
    cx_entry *const *entries; /* this rank's entries; NULL: contribute the op's identity (joined) */
    cfx_dtype dtype;
    cfx_reduce_op op;
    size_t esize;
    size_t total;             /* elements over all n responses */
    double prescale;
    double postscale;         /* the response's, with 1/size folded in for AVERAGE */
    cfx_status local;         /* this rank already failed the batch (CFX_OK: no): it takes part in
                                 the batch's ready agreement with this status and nothing else;
                                 entries may then be NULL */
} cx_allreduce_batch;

/* Grows *buf to at least `bytes` (contents not kept). */
cfx_status cx_exec_reserve(void **buf, size_t *cap, size_t bytes);

/* Timeline stamp i of t[] (x in scope), when the timeline is on. */
#define CX_EXEC_TL_STAMP(t, i) do { if (CX_TL(x->timeline)) (t)[i] = cx_timeline_now(); } while (0)


#endif /* CFX_EXEC_STATE_H */
