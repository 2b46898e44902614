/*
 * gradset_plan (api) - the bucket plan of a gradient set, made once at commit from rank 0's
 * registration, so it is identical on every rank.
 *
 * Gradients in reverse registration order (the order backward produces them) are cut into buckets
 * of one dtype and device of at most bucket_bytes, the first of at most 1 MiB (a larger gradient is
 * a bucket of its own). Owned storage is one block of shared tensor memory; each bucket is a
 * contiguous, 64-byte aligned range of it, and its gradients lie in it back to back (the
 * framework's gradient buffers are views into it, so a bucket is reduced in place as one segment).
 * The loop reduces items: one per bucket for owned storage, one per gradient for borrowed buffers
 * and for Adasum (whose dot products are per gradient).
 */
#ifndef CFX_API_GRADSET_PLAN_H
#define CFX_API_GRADSET_PLAN_H

#include <stdint.h>

#include "conflux/conflux.h"
#include "engine/gradset.h"
#include "protocol/gradset_wire.h"

/* The longest name of a gradient set or of one of its gradients (bytes, without the terminator). */
#define CX_GRADSET_NAME_MAX 4096

/* Plans the buckets of `s` from rank 0's registration `order` (`count` gradients, validated
 * against this rank's: every name is one of s's gradients) and fills the set's buckets, storage,
 * residuals, items and entries. On failure what was allocated stays in `s` for its free. */
cfx_status cx_gradset_plan(cfx_gradset *s, const cx_gradset_reg *order, uint32_t count);

#endif /* CFX_API_GRADSET_PLAN_H */
