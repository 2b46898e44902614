/*
 * device_exec - the engine's side of CUDA device tensors: runs the responses whose tensors live in
 * device memory (execute.c dispatches them here; the kind of memory is part of the agreed
 * response, so every rank takes the same branch).
 *
 * Owns this rank's device state (cx_device): the CUDA device it uses, Conflux's own stream (NCCL
 * runs on it too), the events that order that stream after the producers' streams and the
 * callers' streams after it, the device fusion buffer (grown stream-ordered), the descriptor batch
 * of the pack/unpack kernels (cuda_kernels.h), two page-locked staging halves made once, and in
 * NCCL builds the NCCL communicator (nccl_transport.h).
 *
 * Set-up is lazy and collective: the first device response creates the state on every rank at
 * the same place of the agreed order, so CPU-only jobs never pay for it. Each rank picks its
 * device (its tensors', else its local rank modulo the device count, so a rank that joined early
 * still has one), makes its stream, events, batch and staging, then publishes whether all that
 * worked, whether it has NCCL, its host and its GPU's PCI bus id; cx_device_plan picks the same
 * path everywhere: NCCL when every rank has a GPU of its own, else host-staged (NCCL refuses two
 * ranks on one GPU; also without NCCL and in deterministic mode). The NCCL set-up has a deadline
 * and ends in an agreement: all joined, or every rank aborts and the job is host-staged.
 *
 * Failure agreement (execute.h): every batch agrees before its collective (READY) and after its
 * completion wait (DONE), so a rank whose device work fails neither leaves its peers waiting in
 * NCCL nor lets them finish with a wrong result: every rank fails the batch, naming that rank.
 * A failed NCCL communicator is aborted at once, and the agreement makes every rank give NCCL up
 * at the same point (host-staged from then on).
 *
 * A fused allreduce: Conflux's stream waits on the producers' streams (events, no host wait);
 * NCCL path: one pack kernel (prescale fused) into the device fusion buffer, ncclAllReduce, one
 * unpack kernel (postscale and 1/size fused); a lone tensor is reduced in place. Host-staged path:
 * piece by piece through the two staging halves (device to host, the host data path
 * cx_exec_allreduce_host, host to device), the copies of one piece overlapping the reduction of
 * the next. Then the callers' streams wait on Conflux's stream, and the background thread polls a
 * completion event (bounded by CFX_STALL_TIMEOUT_S; an NCCL error or the deadline aborts the
 * communicator first) before the handles complete; a failed batch waits too, so no queued work
 * touches its tensors after their handles completed. int16/uint16 and float min/max take the
 * host-staged path (cx_nccl_reducible). Broadcast uses ncclBroadcast on the NCCL path;
 * allgather, alltoall and reducescatter are host-staged, and their outputs (allocated by Conflux)
 * are host memory.
 *
 * The module is cut along its seams, each file below the one that calls it: device_plan.c (the
 * path plan, pure), device_prims.c (the device state, ordering and completion, the agreement's
 * device side, the NCCL communicator's state: what both paths stand on), device_nccl.c (the NCCL
 * path), device_staged.c (the host-staged pipeline), device_exec.c (set-up and the dispatch to the
 * two paths, above them).
 *
 * Every CUDA and NCCL call is made by the background thread, which sets its device itself (the
 * caller's current device is untouched). In a build without CUDA the entry points fail with
 * CFX_ERR_UNSUPPORTED (api.c refuses device tensors there, so they are not reached).
 */
#ifndef CFX_DEVICE_EXEC_H
#define CFX_DEVICE_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exec/device_plan.h"
#include "exec/execute.h"

typedef struct cx_device cx_device;

/* A fused allreduce batch of device tensors (execute.h; a NULL entry is a joined rank's share).
 * Neither takes nor completes the entries. tl as for cx_exec_allreduce_host. */
cfx_status cx_device_allreduce(cx_exec *x, const cx_allreduce_batch *b, double *tl);

/* One non-allreduce response of a device tensor with this rank's entry (not completed here). */
cfx_status cx_device_single(cx_exec *x, const cx_response *r, cx_entry *e);

/* cx_device_allreduce, cx_device_single and cx_device_destroy as execute.h's interface. */
extern const cx_device_ops cx_device_path_ops;

/* Accepts NULL. Frees the device state: a failed NCCL communicator is aborted first, then
 * Conflux's stream drains (bounded), the communicator is finalized, and only then is memory freed
 * (a stream that does not drain keeps its buffers: freeing would wait for it forever). The
 * background thread calls it as its loop ends. */
void cx_device_destroy(cx_device *d);

#endif /* CFX_DEVICE_EXEC_H */
