/*
 * split - the engine's one way to cut n elements into `parts` pieces as evenly as possible (piece
 * i is [cx_split_start(n, parts, i), cx_split_start(n, parts, i + 1))), so that every data path
 * that hands pieces to ranks, hosts or shards computes the same bounds.
 */
#ifndef CFX_SPLIT_H
#define CFX_SPLIT_H

#include <stddef.h>

/* Where piece i of n elements over `parts` starts (i == parts: n). The product is taken in 128
 * bits, so it cannot overflow for any size_t n. */
static inline size_t cx_split_start(size_t n, int parts, int i)
{
    return (size_t)((unsigned __int128)n * (unsigned)i / (unsigned)parts);
}

#endif /* CFX_SPLIT_H */
