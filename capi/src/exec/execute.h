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
 *
 * Its files, lowest first: exec_state.h/.c (the engine's state, a batch, the device path's
 * interface, buffer reservation), agree.c (the failure agreement), host_allreduce.c (the host
 * allreduce paths), execute.c (the dispatch of a response list and the other collectives). This
 * header gathers their interfaces for the engine's users; no file below includes it.
 */
#ifndef CFX_EXECUTE_H
#define CFX_EXECUTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exec/agree.h"
#include "exec/exec_state.h"
#include "exec/host_allreduce.h"

void cx_exec_init(cx_exec *x, cx_transport *t, const cx_config *cfg, cx_queue *q, cx_handles *h,
                  const cx_logger *log);
void cx_exec_destroy(cx_exec *x);

/* Runs every response in order. A transport failure fails the affected tensors and is returned
 * (the context can no longer communicate); mismatches only fail their own tensors. */
cfx_status cx_execute(cx_exec *x, const cx_response_list *responses);

/* A single non-allreduce response (broadcast, allgather, alltoall, reducescatter, barrier, join)
 * on the host data path, with this rank's entry `e` (not completed here). Outputs Conflux
 * allocates are host memory. Every collective but barrier and join starts with a ready agreement.
 * e == NULL: this rank lost its entry; it takes part in that agreement with CFX_ERR_INTERNAL (and
 * in a barrier as usual), so the peers fail the response instead of waiting for it. */
cfx_status cx_exec_single_host(cx_exec *x, const cx_response *r, cx_entry *e);

/* Completes an entry with a status and frees it. */
void cx_exec_complete(cx_exec *x, cx_entry *e, cfx_status status, const char *message);

#endif /* CFX_EXECUTE_H */
