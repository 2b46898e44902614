/*
 * device_exec - the engine's side of CUDA device tensors: runs the responses whose tensors live in
 * device memory (execute.c dispatches them here; the kind of memory is part of the agreed
 * response, so every rank takes the same branch).
 *
 * Owns this rank's device state (cx_device): the CUDA device it uses, Conflux's own stream, the
 * events that order that stream after the producer's stream and the caller's stream after it, the
 * device fusion buffer and the descriptor batch of the pack/unpack kernels (cuda_kernels.h), the
 * page-locked staging buffer and, in NCCL builds, the NCCL communicator (nccl_transport.h).
 *
 * Set-up is lazy and collective: the first device response creates the state on every rank at
 * the same place of the agreed order, so CPU-only jobs never pay for it. Every rank publishes
 * whether it has a usable device, whether it has NCCL, its host and the PCI bus id of its GPU;
 * cx_device_plan then picks the same path everywhere: NCCL when every rank has a GPU of its own,
 * else host-staged (NCCL refuses two ranks on one GPU; also without NCCL, in deterministic mode,
 * or when the NCCL set-up failed on some rank).
 *
 * A fused allreduce: Conflux's stream waits on the producers' streams (events, no host wait);
 * NCCL path: one pack kernel (prescale fused) into the device fusion buffer, ncclAllReduce, one
 * unpack kernel (postscale and 1/size fused); host-staged path: cudaMemcpyAsync into page-locked
 * memory, the host data path (cx_exec_allreduce_host: shared memory or MPI), copies back. Then the
 * callers' streams wait on Conflux's stream, and the background thread polls a completion event
 * (spin, then sleep, and NCCL's asynchronous error) before the handles complete: no device-wide
 * synchronisation. int16/uint16 (which NCCL cannot reduce) take the host-staged path.
 * Broadcast uses ncclBroadcast on the NCCL path; allgather, alltoall and reducescatter are
 * host-staged, and their outputs (allocated by Conflux) are host memory.
 *
 * A rank whose device work fails before the collective still takes part in host-staged
 * collectives with the op's identity (the peers do not hang) and fails its own tensors.
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

#include "exec/execute.h"

typedef struct cx_device cx_device;

/* A fused allreduce batch of device tensors (execute.h; a NULL entry is a joined rank's share).
 * Neither takes nor completes the entries. tl as for cx_exec_allreduce_host. */
cfx_status cx_device_allreduce(cx_exec *x, const cx_allreduce_batch *b, double *tl);

/* One non-allreduce response of a device tensor with this rank's entry (not completed here). */
cfx_status cx_device_single(cx_exec *x, const cx_response *r, cx_entry *e);

/* cx_device_allreduce, cx_device_single and cx_device_destroy as execute.h's interface. */
extern const cx_device_ops cx_device_path_ops;

/* Accepts NULL. Frees the device state (the NCCL communicator is destroyed, or aborted after a
 * failure). The background thread calls it as its loop ends. */
void cx_device_destroy(cx_device *d);

/* ---- planning (pure, host only; exposed for tests) -------------------------------------------- */

/* What one rank tells the others at set-up (fixed size, sent as bytes). */
typedef struct cx_device_info {
    uint8_t usable;   /* this rank has the CUDA device its tensors named, and it works */
    uint8_t nccl;     /* this build has the NCCL data path */
    char host[62];    /* the machine: kernel boot id, else the host name */
    char bus[64];     /* PCI bus id of the device ("0000:19:00.0"), one physical GPU per host */
} cx_device_info;

typedef enum cx_device_path {
    CX_DEVICE_PATH_STAGED = 1, /* through page-locked host memory and the host data path */
    CX_DEVICE_PATH_NCCL = 2    /* pack kernel, ncclAllReduce, unpack kernel on Conflux's stream */
} cx_device_path;

/* The path every rank takes, from every rank's info (the same answer on every rank); `why` gets
 * the reason for the host-staged path (naming the ranks), or "". */
cx_device_path cx_device_plan(const cx_device_info *all, int size, bool deterministic, char *why,
                              size_t why_len);

#endif /* CFX_DEVICE_EXEC_H */
