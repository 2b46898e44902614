/*
 * shm - the intra-node shared-memory allreduce, its two-level (hierarchical) form, the one-host
 * agreement, and an in-place allgather of the local ranks' blocks (Adasum's shards).
 *
 * The ranks of one host map one POSIX shared-memory segment: a double-buffered input slot of one
 * chunk per local rank, a double-buffered result area, and a barrier. A reduction runs chunk by
 * chunk, and local rank i owns block i of each chunk: every rank copies the other ranks' blocks
 * of its chunk into its slot (its own block stays where it is); after a barrier, rank i reduces
 * block i, in rank order, from the peers' slots and straight from its own tensors into the result
 * area (the reduction work is split across the local ranks), and copies that block out at once;
 * the other blocks are copied out after the next barrier, which is the next chunk's (after its
 * copy in) or, after the last chunk, one more: one barrier a chunk. Chunks are cache-sized, so
 * the data stays in cache between the copy in, the reduction and the copy out; the slots and the
 * result area are double-buffered, which is what lets one barrier serve two chunks (a rank
 * rewrites a slot or a result only after a barrier that every reader of it passed after
 * reading). Leaving the own block in place saves 1/n of the copy in; a prescale or a joined rank
 * (no tensor: the identity) stages it like the rest. The barrier spins, yields, then
 * sleeps on a futex the last arriver wakes.
 * Because each element is combined in local-rank order by one rank, the result is bitwise the
 * same on every rank and independent of fusion packing and chunking.
 *
 * The direct path: when every local rank's tensors of a batch (inputs and outputs) lie in its
 * shared pool (cfx_alloc, shared_pool.h), there is nothing to copy. The first such batch has every
 * rank map the others' pools (agreed over the segment: all or none, for good); then rank i reduces
 * block i of the whole batch, strip by strip, straight from every rank's tensors and writes the
 * result into every rank's output, with one barrier at the end. Each rank offers the direct path
 * in the segment before the first barrier of a batch and all read the offers after it, so all
 * ranks of a host take the same path; ranks that mix pooled and private tensors, a prescale or a
 * joined rank take the copies. Across hosts the direct path keeps the copy path's chunks, blocks
 * and cross-host calls, so each host chooses on its own. The reduction order is the same, so are
 * the results.
 *
 * Hierarchical mode (the job spans hosts): after the local reduction, each local rank allreduces
 * its own block across hosts over MPI (the cross communicator), so every local rank drives its own
 * share of the inter-node traffic, then the local copy out distributes the result.
 *
 * When every rank of the job is on this host, the segment also carries the control plane's
 * per-cycle AND of words (cx_shm_allreduce_and): rows of words a rank and the same barrier.
 *
 * Set up collectively at context creation over the transport's control plane; used by the
 * thread that runs the cycles alone.
 */
#ifndef CFX_SHM_H
#define CFX_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"
#include "transport/transport.h"

typedef struct cx_shm cx_shm;

/* Maps this host's segment (collective over every rank of `t`). `chunk_bytes` is the slot size.
 * A barrier waits at most `timeout_s` (0: no limit) for a late local rank, and gives up at once on
 * one whose process ended: CFX_ERR_PEER_LOST naming its rank and host, from then on for every call
 * on this segment (its barrier's state is lost).
 * `direct_map_fail` (CFX_TEST_DIRECT_MAP_FAIL, tests only; 0 = none): bit L set, local rank L
 * cannot map its peers' pools, so the direct path turns off. */
cfx_status cx_shm_create(cx_transport *t, size_t chunk_bytes, double timeout_s,
                         uint64_t direct_map_fail, cx_shm **out);
void cx_shm_destroy(cx_shm *s);

/* CFX_OK, or CFX_ERR_PEER_LOST once a barrier gave up on a peer. */
cfx_status cx_shm_failure(const cx_shm *s);

/* The words a rank may bring to one cx_shm_allreduce_and. */
#define CX_SHM_AND_MAX_WORDS 512

/* The control plane's AND-allreduce (words[i] = AND over the local ranks of words[i]) through the
 * segment: one barrier, no transport call. The whole AND for a job whose ranks all share this
 * host; the host's part of it across hosts (shm_layer.c). *done false (nothing done) when `count`
 * exceeds CX_SHM_AND_MAX_WORDS; count is the same on every rank, so all then take the transport's
 * AND instead. */
cfx_status cx_shm_allreduce_and(cx_shm *s, uint64_t *words, size_t count, bool *done);

/* The direct path: 0 not tried yet (no batch had every rank's tensors in shared tensor memory),
 * 1 on, -1 off for good (*why says why: some rank could not map another's pool). */
int cx_shm_direct_state(const cx_shm *s, const char **why);

/* One stretch of the logical buffer a reduction covers: `count` elements read from `src` (NULL:
 * the op's identity, for a rank that has joined) and written back to `dst` (NULL: discarded). */
typedef struct cx_segment {
    const void *src;
    void *dst;
    size_t count;
} cx_segment;

/* Allreduce of the concatenation of `segs` over the local ranks; with `hierarchical`, across
 * hosts too (through t->ops->cross_allreduce). The tensors are copied straight into the shared
 * slots with `prescale` applied and straight out with `postscale` applied: no fusion buffer and no
 * separate scaling pass. */
cfx_status cx_shm_allreduce(cx_shm *s, cx_transport *t, const cx_segment *segs, size_t nsegs,
                            cfx_dtype dtype, cfx_reduce_op op, double prescale, double postscale,
                            bool hierarchical);

/* The same, with the cross-host leg compressed: `wire` >= 0 is the 16-bit dtype it travels in
 * (cx_compression_leg; float32/float64 tensors only), -1 the tensors' own. `residual` (NULL, or
 * one element per element of the batch: error feedback) is read and rewritten where this rank
 * packs, its own blocks. */
cfx_status cx_shm_allreduce_wire(cx_shm *s, cx_transport *t, const cx_segment *segs,
                                 size_t nsegs, cfx_dtype dtype, cfx_reduce_op op, double prescale,
                                 double postscale, bool hierarchical, int wire, void *residual);

/* Allgather of blocks in place: local rank i holds block i (elements [cx_split_start(count,
 * nlocal, i), cx_split_start(count, nlocal, i + 1)) of `buf`, `esize` bytes each); afterwards
 * every local rank holds all of `buf`. Through the slots, a chunk of each block a round, one
 * barrier a round and one at the end. */
cfx_status cx_shm_allgather_blocks(cx_shm *s, void *buf, size_t count, size_t esize);

#endif /* CFX_SHM_H */
