/*
 * host_allreduce - the host data paths of an allreduce batch (host_allreduce.c): shared memory
 * (through the transport's shared-memory layer, shm_layer.h), chunked over the transport with the
 * fusion buffer, the deterministic ordered path, compression on the wire and Adasum. Called by
 * execute.c, the host-staged device path and the gradient sets; calls nothing above it.
 */
#ifndef CFX_HOST_ALLREDUCE_H
#define CFX_HOST_ALLREDUCE_H

#include "exec/exec_state.h"

/* The host data path of a batch: shared memory, chunked MPI or the deterministic ordered path,
 * prescale and postscale fused in. Neither takes nor completes the entries. run_allreduce calls it
 * for host tensors; the host-staged device path (device_exec.c) calls it with entries whose
 * input/output point into page-locked staging memory. Its first collective call is the batch's
 * ready agreement (cx_exec_agree), after every local allocation. tl[1] and tl[2] get the
 * collective's start and end when the timeline is on. */
cfx_status cx_exec_allreduce_host(cx_exec *x, const cx_allreduce_batch *b, double *tl);

/* Whether host allreduces take the shared-memory path. It combines in rank order, so it keeps the
 * deterministic guarantee on one host; across hosts deterministic mode takes the ordered path. */
bool cx_exec_uses_shm(const cx_exec *x);

/* Deterministic reduce-scatter of one chunk: rank r owns block r, receives every rank's copy of it
 * and reduces them in rank order. `send` holds the elements of counts[]; `out` receives this
 * rank's block (the copies are staged in x->scratch). */
cfx_status cx_exec_ordered_reduce_scatter(cx_exec *x, const void *send, void *out,
                                          const size_t *counts, cfx_dtype dtype, cfx_reduce_op op);

#endif /* CFX_HOST_ALLREDUCE_H */
