/* combine16 - the once-rounded allreduce of packed 16-bit values (see combine16.h). */
#include "exec/combine16.h"

#include "base/split.h"
#include "kernels/compress.h"
#include "kernels/reduce.h"

/* Bytes before the scratch: the packed values, 16-byte aligned. */
static size_t packed_bytes(size_t count) { return (count * sizeof(uint16_t) + 15) / 16 * 16; }

static size_t largest_piece(size_t count, int members)
{
    return (count + (size_t)members - 1) / (size_t)members;
}

/* Every member's 16-bit values of one piece of `per` elements, 4-byte aligned. */
static size_t contributions_bytes(size_t per, int members)
{
    return (per * (size_t)members * sizeof(uint16_t) + 3) / 4 * 4;
}

size_t cx_combine16_bytes(size_t count, int members)
{
    if (members < 3) /* no scratch: the transport's allreduce */
        return packed_bytes(count);
    size_t per = largest_piece(count, members); /* then two float32 pieces */
    return packed_bytes(count) + contributions_bytes(per, members) + 2 * per * sizeof(float);
}

/* Member j's piece of the block: its first element, and its length in *len. */
static size_t piece(size_t count, int members, int j, size_t *len)
{
    size_t lo = cx_split_start(count, members, j);
    *len = cx_split_start(count, members, j + 1) - lo;
    return lo;
}

cfx_status cx_combine16(cx_transport *t, cx_group group, uint16_t *buf16, size_t count,
                        cfx_dtype wire, cfx_reduce_op op)
{
    int members = group == CX_GROUP_CROSS ? t->cross_size : t->size;
    int me = group == CX_GROUP_CROSS ? t->cross_rank : t->rank;
    if (members < 2)
        return CFX_OK;
    if (members == 2) /* one combine: the transport's 16-bit op rounds once */
        return group == CX_GROUP_CROSS ? t->ops->cross_allreduce(t, buf16, count, wire, op)
                                       : t->ops->allreduce(t, buf16, count, wire, op);
    if (op == CFX_OP_AVERAGE)
        op = CFX_OP_SUM;
    size_t per = largest_piece(count, members);
    /* member h's contribution to this member's piece at mine + h * per, then the float32 sums */
    uint16_t *mine = (uint16_t *)((char *)buf16 + packed_bytes(count));
    float *acc = (float *)((char *)mine + contributions_bytes(per, members));
    float *widened = acc + per;
    size_t len, lo = piece(count, members, me, &len);
    cfx_status st = CFX_OK;
    /* Reduce-scatter: at distance d, send piece me + d to its owner, receive piece me from
     * member me - d (the pairing every member makes at the same d). Empty pieces are skipped on
     * both sides alike. */
    for (int d = 1; d < members && !st; d++) {
        int to = (me + d) % members, from = (me - d + members) % members;
        size_t to_len, to_lo = piece(count, members, to, &to_len);
        st = t->ops->sendrecv(t, group, buf16 + to_lo, to_len * sizeof(uint16_t), to_len ? to : -1,
                              mine + (size_t)from * per, len * sizeof(uint16_t), len ? from : -1);
    }
    /* Member order, then one rounding: every owner combines alike. */
    for (int h = 0; h < members && !st && len; h++) {
        const uint16_t *c = h == me ? buf16 + lo : mine + (size_t)h * per;
        cx_compress_unpack(h ? widened : acc, c, len, CFX_FLOAT32, wire, 1.0);
        if (h)
            cx_reduce_into(acc, widened, len, CFX_FLOAT32, op);
    }
    if (!st && len)
        cx_compress_pack(buf16 + lo, acc, NULL, len, CFX_FLOAT32, wire, 1.0);
    /* Allgather: this member's rounded piece to every other member, theirs in. */
    for (int d = 1; d < members && !st; d++) {
        int to = (me + d) % members, from = (me - d + members) % members;
        size_t from_len, from_lo = piece(count, members, from, &from_len);
        st = t->ops->sendrecv(t, group, buf16 + lo, len * sizeof(uint16_t), len ? to : -1,
                              buf16 + from_lo, from_len * sizeof(uint16_t), from_len ? from : -1);
    }
    return st;
}
