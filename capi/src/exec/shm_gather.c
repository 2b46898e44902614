/* shm_gather - the allgather of the local ranks' blocks through the segment's slots (shm.h:
 * cx_shm_allgather_blocks; Adasum's shards), a chunk of each block a round, one barrier a round
 * and one at the end. */
#include <string.h>

#include "exec/shm_barrier.h"

/* Round `off` (bytes into every block) of cx_shm_allgather_blocks: where local rank q's part of
 * it starts in the buffer, and its length (0 once q's block is done). */
static size_t gather_part(const cx_shm *s, int q, size_t count, size_t esize, size_t off,
                          size_t *at)
{
    size_t lo = cx_split_start(count, s->nlocal, q) * esize;
    size_t len = cx_split_start(count, s->nlocal, q + 1) * esize - lo;
    *at = lo + off;
    return off < len ? (len - off < s->chunk ? len - off : s->chunk) : 0;
}

cfx_status cx_shm_allgather_blocks(cx_shm *s, void *buf, size_t count, size_t esize)
{
    uint8_t *b = buf;
    size_t widest = (count + (size_t)s->nlocal - 1) / (size_t)s->nlocal; /* cx_split's largest */
    size_t rounds = (widest * esize + s->chunk - 1) / s->chunk, at;
    int k = 0;
    for (size_t r = 0; r < rounds; r++, k ^= 1) {
        size_t off = r * s->chunk, part = gather_part(s, s->me, count, esize, off, &at);
        if (part)
            memcpy(cx_shm_slot(s, k, s->me), b + at, part);
        cfx_status st = cx_shm_barrier(s);
        if (st)
            return st;
        for (int q = 0; q < s->nlocal; q++)
            if (q != s->me && (part = gather_part(s, q, count, esize, off, &at)))
                memcpy(b + at, cx_shm_slot(s, k, q), part);
    }
    /* A slot is rewritten (by the next round, or the next collective) only after a barrier that
     * every reader passed after reading it: the rounds alternate the slots, and this last one
     * covers both. */
    return rounds ? cx_shm_barrier(s) : CFX_OK;
}

