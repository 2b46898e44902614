/*
 * combine16 - the allreduce of packed 16-bit values (wire compression, kernels/compress.h) over one
 * group of a transport, rounded once: every element is the 16-bit rounding of the float32
 * combination of the group's contributions, whatever the group's size.
 *
 * An allreduce on the transport's 16-bit type rounds after each combine (its MPI op widens, adds
 * and rounds back), so with more than two members an element would be rounded once per member
 * beyond the first, in an order the MPI library picks. Here, for groups of three or more, member j
 * owns piece j of the buffer: every member sends each owner its 16-bit piece (pairwise exchange,
 * the bytes of a ring reduce-scatter), the owner widens the contributions and combines them in
 * float32 in member order, rounds once and sends the 16-bit result to every member (the bytes of
 * a ring allgather). Each element is combined on one member, so every member ends with the same
 * bits. Two members take the transport's allreduce: one combine, one rounding, the same bits.
 *
 * Called by exec/execute.c (the MPI path, the world group) and exec/shm_cross.c (the cross-host leg of
 * the hierarchical path, the cross group), on the background thread.
 */
#ifndef CFX_COMBINE16_H
#define CFX_COMBINE16_H

#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"
#include "transport/transport.h"

/* The bytes of a buffer for `count` packed values over a group of `members`: the values come first
 * (what the caller packs and unpacks), then what the combine needs for itself. A buffer made for
 * the largest count serves every smaller one. */
size_t cx_combine16_bytes(size_t count, int members);

/* buf16[0..count) = op over the members of `group` of their buf16 (values of `wire`, CFX_FLOAT16
 * or CFX_BFLOAT16), in place; AVERAGE combines as SUM (the caller scales). buf16 holds at least
 * cx_combine16_bytes(count, members) bytes, aligned as malloc aligns. Every member calls it with
 * the same count. */
cfx_status cx_combine16(cx_transport *t, cx_group group, uint16_t *buf16, size_t count,
                        cfx_dtype wire, cfx_reduce_op op);

#endif /* CFX_COMBINE16_H */
