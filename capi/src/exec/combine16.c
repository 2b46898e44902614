/* combine16 - the once-rounded allreduce of packed 16-bit values (see combine16.h). */
#include "exec/combine16.h"

#include "kernels/compress.h"
#include "kernels/reduce.h"

/* Member j's piece of n elements over `parts` members starts here (piece `parts` ends at n). */
static size_t piece_start(size_t n, int parts, int j)
{
    return (size_t)((unsigned __int128)n * (unsigned)j / (unsigned)parts);
}

static size_t largest_piece(size_t count, int members)
{
    return members > 0 ? (count + (size_t)members - 1) / (size_t)members : count;
}

/* The 16-bit contributions (one piece per member) first, then two float32 pieces. */
static size_t contributions_bytes(size_t count, int members)
{
    size_t b = largest_piece(count, members) * (size_t)members * sizeof(uint16_t);
    return (b + 3) / 4 * 4;
}

size_t cx_combine16_scratch_bytes(size_t count, int members)
{
    return contributions_bytes(count, members) + 2 * largest_piece(count, members) * sizeof(float);
}

cfx_status cx_combine16(cx_transport *t, cx_group group, uint16_t *buf16, size_t count,
                        cfx_dtype wire, cfx_reduce_op op, void *scratch)
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
    uint16_t *mine = scratch; /* member h's contribution to this member's piece at mine + h * per */
    float *acc = (float *)((char *)scratch + contributions_bytes(count, members));
    float *widened = acc + per;
    size_t lo = piece_start(count, members, me), len = piece_start(count, members, me + 1) - lo;
    cfx_status st = CFX_OK;
    /* Reduce-scatter: at distance d, send piece me + d to its owner, receive piece me from
     * member me - d (the pairing every member makes at the same d). Empty pieces are skipped on
     * both sides alike. */
    for (int d = 1; d < members && !st; d++) {
        int to = (me + d) % members, from = (me - d + members) % members;
        size_t to_lo = piece_start(count, members, to);
        size_t to_len = piece_start(count, members, to + 1) - to_lo;
        st = t->ops->sendrecv(t, group, buf16 + to_lo, to_len * sizeof(uint16_t), to_len ? to : -1,
                              mine + (size_t)from * per, len * sizeof(uint16_t), len ? from : -1);
    }
    if (st)
        return st;
    /* Member order, then one rounding: every owner combines alike. */
    for (int h = 0; h < members && len; h++) {
        const uint16_t *c = h == me ? buf16 + lo : mine + (size_t)h * per;
        cx_compress_unpack(h ? widened : acc, c, len, CFX_FLOAT32, wire, 1.0);
        if (h)
            cx_reduce_into(acc, widened, len, CFX_FLOAT32, op);
    }
    if (len)
        cx_compress_pack(buf16 + lo, acc, NULL, len, CFX_FLOAT32, wire, 1.0);
    /* Allgather: this member's rounded piece to every other member, theirs in. */
    for (int d = 1; d < members && !st; d++) {
        int to = (me + d) % members, from = (me - d + members) % members;
        size_t from_lo = piece_start(count, members, from);
        size_t from_len = piece_start(count, members, from + 1) - from_lo;
        st = t->ops->sendrecv(t, group, buf16 + lo, len * sizeof(uint16_t), len ? to : -1,
                              buf16 + from_lo, from_len * sizeof(uint16_t), from_len ? from : -1);
    }
    return st;
}
