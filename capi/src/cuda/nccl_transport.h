/*
 * nccl_transport - the device data plane: collectives on CUDA memory over one NCCL communicator.
 *
 * A context that has device tensors creates one cx_nccl after its MPI (or local) transport is up:
 * rank 0 calls cx_nccl_get_unique_id, the id travels over the control plane (bcast_bytes), and
 * every rank calls cx_nccl_comm_create with it, its device and the engine's stream
 * (cx_nccl_stream; not owned): the engine runs its pack/unpack kernels and every collective on
 * it, so they are ordered without host waits, and makes that stream wait on the producer's
 * stream (and the consumer's on it) with events (cuda_kernels.h).
 *
 * From NCCL 2.14 the communicator is non-blocking (ncclConfig_t.blocking = 0): set-up returns at
 * once and is polled against a deadline (a rank whose peer failed its own set-up gives up instead
 * of waiting in the bootstrap forever), and any call that answers ncclInProgress is polled to its
 * result within the same deadline (CFX_ERR_TIMEOUT after it).
 *
 * Collectives only enqueue work on the stream and return; cx_nccl_wait waits for it on the host
 * (spin, then sleep), polling NCCL's asynchronous error so a lost peer becomes CFX_ERR_NCCL instead
 * of a hang. Their signatures mirror cx_transport_ops' data plane (transport.h), with device
 * pointers: AVERAGE reduces as SUM (the engine scales), bool reduces as uint8 with max (sum, max)
 * or min (min, product), and the 16-bit integer types cannot be reduced by NCCL
 * (cx_nccl_reducible() is false; the engine takes the host-staged path for them).
 *
 * Errors: CFX_ERR_NCCL with ncclGetErrorString's text and ncclGetLastError's detail, CFX_ERR_CUDA
 * for the runtime, CFX_ERR_UNSUPPORTED for a dtype NCCL lacks. After an error other than a bad
 * argument the communicator is marked failed: later calls fail at once, and cx_nccl_comm_destroy
 * aborts it (ncclCommAbort) instead of waiting for peers that may be gone. cx_nccl_abort aborts
 * at once (the engine does so as soon as a completion wait times out, before freeing anything).
 *
 * NCCL refuses two ranks of one communicator on one GPU ("duplicate GPU"); ranks that share a
 * device use the host-staged path (docs/gpu.md). Called by the background thread alone.
 */
#ifndef CFX_NCCL_TRANSPORT_H
#define CFX_NCCL_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "conflux/conflux.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CX_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct cx_nccl cx_nccl;

/* NCCL's version number (e.g. 22809 for 2.28.9). */
int cx_nccl_version(void);

/* Fills `out` with a new communicator id (rank 0 calls this and broadcasts the bytes). */
cfx_status cx_nccl_get_unique_id(unsigned char out[CX_NCCL_ID_BYTES]);

/* Joins the communicator `id` as `rank` of `size` on CUDA `device` (collective: every rank calls
 * it with the same id), its collectives to run on `stream` (a cudaStream_t on `device`, not
 * owned). Waits at most timeout_s (> 0) for the other ranks, then aborts: CFX_ERR_TIMEOUT
 * (CFX_ERR_NCCL / CFX_ERR_CUDA for a failure). Before NCCL 2.14 the set-up blocks unbounded. */
cfx_status cx_nccl_comm_create(int rank, int size, const unsigned char id[CX_NCCL_ID_BYTES],
                               int device, void *stream, double timeout_s, cx_nccl **out);

/* Accepts NULL. A healthy communicator is finalized and destroyed (bounded by its timeout); a
 * failed one is aborted. The stream is the caller's. */
void cx_nccl_comm_destroy(cx_nccl *c);

/* Accepts NULL. Aborts the communicator now (ncclCommAbort: its kernels stop, so work queued
 * behind them on the stream can complete) and marks it failed; destroy then only frees. */
void cx_nccl_abort(cx_nccl *c);

/* The stream its collectives run on (a cudaStream_t), its device, rank and size. */
void *cx_nccl_stream(const cx_nccl *c);
int cx_nccl_device(const cx_nccl *c);
int cx_nccl_rank(const cx_nccl *c);
int cx_nccl_size(const cx_nccl *c);
/* true once an error poisoned the communicator or it was aborted. */
bool cx_nccl_failed(const cx_nccl *c);

/* Whether the engine reduces `dtype` with `op` over NCCL: false for int16/uint16 (NCCL has none),
 * for bfloat16 before NCCL 2.10, for ops that are not one NCCL reduction (past product), and for
 * float min/max, where NCCL drops a NaN that reduce.c propagates (the host-staged path keeps the
 * results equal on both paths). */
bool cx_nccl_reducible(cfx_dtype dtype, cfx_reduce_op op);

/* NCCL's ncclDataType_t / ncclRedOp_t for a dtype and op, as ints (exposed for tests).
 * CFX_ERR_UNSUPPORTED for int16/uint16, CFX_ERR_INVALID_ARGUMENT out of range. */
cfx_status cx_nccl_map(cfx_dtype dtype, cfx_reduce_op op, int *nccl_dtype, int *nccl_op);

/* ---- collectives on device memory, enqueued on cx_nccl_stream() ------------------------------- */

/* recv = op over ranks of send (count elements); recv may equal send (in place). */
cfx_status cx_nccl_allreduce(cx_nccl *c, const void *send, void *recv, size_t count,
                             cfx_dtype dtype, cfx_reduce_op op);

/* Each rank sends send_bytes; rank r's bytes land at recv + displs[r] (recv_bytes[r] long).
 * ncclAllGather when every rank sends the same bytes packed in rank order, else one grouped
 * ncclBroadcast per rank. */
cfx_status cx_nccl_allgatherv(cx_nccl *c, const void *send, size_t send_bytes, void *recv,
                              const size_t *recv_bytes, const size_t *displs);

/* `bytes` of buf from root to every rank, in place. */
cfx_status cx_nccl_broadcast(cx_nccl *c, void *buf, size_t bytes, int root);

/* Rank r sends send_bytes[j] from send + sdispls[j] to rank j and receives recv_bytes[j] from
 * rank j at recv + rdispls[j] (one group of ncclSend/ncclRecv). */
cfx_status cx_nccl_alltoallv(cx_nccl *c, const void *send, const size_t *send_bytes,
                             const size_t *sdispls, void *recv, const size_t *recv_bytes,
                             const size_t *rdispls);

/* Reduces `send` (sum of counts[] elements) across ranks; rank r receives elements
 * [sum(counts[0..r)), +counts[r]) in recv. ncclReduceScatter when the counts are equal, else one
 * grouped ncclReduce per rank. */
cfx_status cx_nccl_reduce_scatter(cx_nccl *c, const void *send, void *recv, const size_t *counts,
                                  cfx_dtype dtype, cfx_reduce_op op);

/* Waits on the host until the stream's work so far is done, at most timeout_s seconds (negative:
 * no limit), polling ncclCommGetAsyncError. CFX_ERR_NCCL on an asynchronous NCCL error,
 * CFX_ERR_TIMEOUT when the deadline passes; both mark the communicator failed. */
cfx_status cx_nccl_wait(cx_nccl *c, double timeout_s);

/* Polls NCCL's asynchronous error without waiting (CFX_OK when none). */
cfx_status cx_nccl_check(cx_nccl *c);

#ifdef __cplusplus
}
#endif

#endif /* CFX_NCCL_TRANSPORT_H */
