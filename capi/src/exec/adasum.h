/*
 * adasum - the Adasum allreduce (CFX_OP_ADASUM): the adaptive summation of every rank's copy of
 * each tensor, over the transport's point to point (transport.h sendrecv).
 *
 * Two vectors combine as adasum(a, b) = (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b: their sum
 * when they are orthogonal, the vector itself when they are equal. Every tensor of a fused batch
 * has its own dot product and norms, accumulated in float64 (kernels/dot.h); elements combine in
 * float64 and are rounded to the dtype after each combination. A zero vector keeps coefficient 1
 * (adasum(a, 0) = a), so a joined rank's zeros are the identity. Unlike Horovod, which also
 * treats |a|^2 < 1e-8 as zero, only an exact zero does: adasum(k a, k b) = k adasum(a, b) for
 * every k, however small the gradients are.
 *
 * The tree on n ranks, p the largest power of two <= n (Horovod's vector halving, distance
 * doubling, with the ranks beyond p folded in, so any n works):
 *  1. rank p + i (i < n - p) sends its batch to rank i, which combines: x_i <- adasum(x_i, x_p+i);
 *  2. ranks 0..p-1, levels L = 1, 2, 4, ... < p: rank r and r ^ L split their current range in
 *     halves; the one with bit L clear keeps the first half, the other the second, and each sends
 *     the half it gives up. The 2L ranks of r's aligned block then hold the pair (left block's
 *     vector, right block's vector) in disjoint pieces: they sum their partial dot products
 *     (recursive doubling), and each combines its piece;
 *  3. the levels in reverse: the pieces go back, so ranks 0..p-1 hold the whole result;
 *  4. rank i sends it to rank p + i.
 * On 4 ranks the result is adasum(adasum(x0, x1), adasum(x2, x3)); on 3, adasum(adasum(x0, x2), x1).
 * Each element is combined on one rank, so every rank ends with the same bits.
 *
 * Across hosts (the hierarchical path, a shared-memory segment per host): the host's ranks first
 * average their batches (exec/shm.h), then local rank j takes shard j of the batch and runs 1-4
 * over the hosts (the cross group), with each level's partial dot products summed over the host's
 * ranks as well (through the segment); last, the host's ranks gather their shards through the
 * segment (cx_shm_allgather_blocks). So: the average within a host, Adasum between hosts, and
 * every local rank carries its share of the cross-host bytes; nothing within a host goes through
 * the transport (over Gloo that would be TCP on the loopback).
 *
 * Called by the collective engine's background thread (execute.c) alone.
 */
#ifndef CFX_ADASUM_H
#define CFX_ADASUM_H

#include <stddef.h>

#include "conflux/conflux.h"
#include "exec/shm.h"
#include "protocol/queue.h"
#include "protocol/wire.h"
#include "transport/transport.h"

typedef struct cx_adasum cx_adasum;

/* What a batch of n allreduce responses (items, one dtype; this rank's entries, as for
 * cx_adasum_allreduce) needs, reserved in *a (made on first use, kept and grown): call it before
 * the batch's ready agreement. Fails with CFX_ERR_UNSUPPORTED naming the first tensor when dtype
 * is not a float type, or out of memory. */
cfx_status cx_adasum_reserve(cx_adasum **a, const cx_response *items, cx_entry *const *entries,
                             size_t n, cfx_dtype dtype);

/* Runs the batch, collective over every rank of t: entries[i]->input (times prescale) goes in,
 * the result (times postscale) lands in entries[i]->output; a NULL entry (a joined rank)
 * contributes zeros. shm != NULL: the hierarchical form (average on each host through shm, then
 * Adasum across hosts). Call after cx_adasum_reserve and the agreement. */
cfx_status cx_adasum_allreduce(cx_adasum *a, cx_transport *t, cx_shm *shm,
                               const cx_response *items, cx_entry *const *entries, size_t n,
                               cfx_dtype dtype, double prescale, double postscale);

/* NULL is a no-op. */
void cx_adasum_free(cx_adasum *a);

#endif /* CFX_ADASUM_H */
