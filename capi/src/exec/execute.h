/*
 * execute - the collective engine: runs an ordered response list on this rank.
 *
 * For each response (or fused batch, see fusion.h) it takes the local entries out of the tensor
 * table, moves their bytes through the transport's data plane, applies prescale/postscale and the
 * average, stores the outputs Conflux allocates (allgather, alltoall, reducescatter) and completes
 * the handles. Large buffers are reduced as chunks of the agreed chunk size. In deterministic mode
 * every element is reduced in rank order 0..n-1 by its owning rank, whatever the fusion packing or
 * chunking, so results are bitwise reproducible run to run. A rank that has joined takes part in
 * allreduces with the identity of the op. Called by the background thread alone.
 */
#ifndef CFX_EXECUTE_H
#define CFX_EXECUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/config.h"
#include "protocol/handles.h"
#include "base/log.h"
#include "protocol/queue.h"
#include "transport/transport.h"
#include "protocol/wire.h"

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

void cx_exec_init(cx_exec *x, cx_transport *t, const cx_config *cfg, cx_queue *q, cx_handles *h,
                  const cx_logger *log);
void cx_exec_destroy(cx_exec *x);

/* Runs every response in order. A transport failure fails the affected tensors and is returned
 * (the context can no longer communicate); mismatches only fail their own tensors. */
cfx_status cx_execute(cx_exec *x, const cx_response_list *responses);

/* One fused allreduce batch, described once by run_allreduce for whichever data path runs it. */
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

/* The host data path of a batch: shared memory, chunked MPI or the deterministic ordered path,
 * prescale and postscale fused in. Neither takes nor completes the entries. run_allreduce calls it
 * for host tensors; the host-staged device path (device_exec.c) calls it with entries whose
 * input/output point into page-locked staging memory. Its first collective call is the batch's
 * ready agreement (cx_exec_agree), after every local allocation. tl[1] and tl[2] get the
 * collective's start and end when the timeline is on. */
cfx_status cx_exec_allreduce_host(cx_exec *x, const cx_allreduce_batch *b, double *tl);

/* A single non-allreduce response (broadcast, allgather, alltoall, reducescatter, barrier, join)
 * on the host data path, with this rank's entry `e` (not completed here). Outputs Conflux
 * allocates are host memory. Every collective but barrier and join starts with a ready agreement.
 * e == NULL: this rank lost its entry; it takes part in that agreement with CFX_ERR_INTERNAL (and
 * in a barrier as usual), so the peers fail the response instead of waiting for it. */
cfx_status cx_exec_single_host(cx_exec *x, const cx_response *r, cx_entry *e);

/* ---- failure agreement ---------------------------------------------------------------------
 * A rank whose local work fails (an allocation, a CUDA call, a staging copy) must neither skip a
 * collective its peers enter (they would wait for it forever, and its next collective would pair
 * with their pending one) nor take part with made-up data (they would finish with a wrong result
 * and CFX_OK). So every data path agrees before the first data-plane call of a batch (READY: no
 * rank enters unless every rank can), and the device paths, whose local work goes on after the
 * collective (copies back, the completion wait), agree once more after it (DONE). Either way
 * every rank completes the batch with the same status. */
typedef enum cx_agree_phase { CX_AGREE_READY = 1, CX_AGREE_DONE = 2 } cx_agree_phase;

/* Collective: every rank calls it at the same point with its own status `local` (its message in
 * cx_error_message()). One AND-allreduce of one bit per rank (plus a flags word); CFX_OK on every
 * rank when every rank was OK. Otherwise the lowest failing rank broadcasts its status and message
 * and every rank returns that status, with a message naming the failing ranks and that reason. No
 * allocation, so out of memory can be agreed too. `flags` (may be NULL): in, this rank's bits
 * (CX_AGREE_FLAG_*); out, their OR over the ranks. `name`: the batch's first tensor (failure
 * injection, CFX_TEST_FAIL). A failure of the agreement's own calls is returned as it is. */
#define CX_AGREE_FLAG_NCCL_LOST 1u /* this rank's NCCL communicator failed (device_exec.c) */
cfx_status cx_exec_agree(cx_exec *x, cfx_status local, cx_agree_phase phase, const char *name,
                         uint32_t *flags);

/* Completes an entry with a status and frees it. */
void cx_exec_complete(cx_exec *x, cx_entry *e, cfx_status status, const char *message);

/* ---- shared by the engine's own files (execute.c, host_allreduce.c, agree.c) ---------------- */

/* Grows *buf to at least `bytes` (contents not kept). */
cfx_status cx_exec_reserve(void **buf, size_t *cap, size_t bytes);

/* Whether host allreduces take the shared-memory path. It combines in rank order, so it keeps the
 * deterministic guarantee on one host; across hosts deterministic mode takes the ordered path. */
bool cx_exec_uses_shm(const cx_exec *x);

/* Deterministic reduce-scatter of one chunk: rank r owns block r, receives every rank's copy of it
 * and reduces them in rank order. `send` holds the elements of counts[]; `out` receives this
 * rank's block (the copies are staged in x->scratch). */
cfx_status cx_exec_ordered_reduce_scatter(cx_exec *x, const void *send, void *out,
                                          const size_t *counts, cfx_dtype dtype, cfx_reduce_op op);

/* Timeline stamp i of t[] (x in scope), when the timeline is on. */
#define CX_EXEC_TL_STAMP(t, i) do { if (CX_TL(x->timeline)) (t)[i] = cx_timeline_now(); } while (0)

#endif /* CFX_EXECUTE_H */
