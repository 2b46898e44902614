/*
 * fusion - decides which consecutive responses share one fusion buffer.
 *
 * Small tensors pay per-operation latency, so consecutive allreduce responses of the same dtype,
 * device, op and scale factors are packed into one buffer, up to the fusion threshold; so are
 * consecutive allgathers (one allgatherv moves every rank's packed inputs). A tensor of
 * at least the chunk size gains nothing from a fusion buffer (it is reduced in place, chunk by
 * chunk, and packing would only add a copy in and a copy out), so it runs alone; the caller passes
 * no such limit (INT64_MAX) for the shared-memory path, which reads every tensor where it lies.
 * The plan is a pure function of the response list and the agreed settings, so every rank
 * computes the same one.
 */
#ifndef CFX_FUSION_H
#define CFX_FUSION_H

#include <stddef.h>
#include <stdint.h>

#include "protocol/wire.h"

/* Bytes of a response's tensor on one rank (allreduce, broadcast, reducescatter). */
size_t cx_response_bytes(const cx_response *r);

/* Bytes of an allgather response's whole output (every rank's rows). */
size_t cx_allgather_bytes(const cx_response *r);

/* How many responses, starting at items[start], run together (>= 1): allreduces of one dtype, op
 * and scaling, or allgathers, each smaller than `chunk_bytes`, up to the threshold in total. */
size_t cx_fusion_batch(const cx_response *items, size_t count, size_t start,
                       int64_t fusion_threshold, int64_t chunk_bytes);

#endif /* CFX_FUSION_H */
