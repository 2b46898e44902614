/*
 * subset - the agreement that makes a subset context (cfx_context_create_subset): every rank
 * passes its list of member ranks, every rank's list goes to every rank (an allgather the caller
 * runs through the context), and every rank then reaches the same verdict from the same rows:
 * the sorted members, or the first problem (a rank's list is empty, NULL, too long, names a rank
 * outside the context or one rank twice, or differs from rank 0's) as CFX_ERR_INVALID_ARGUMENT
 * naming the rank and both lists. So a bad list fails on every rank alike, never on one alone
 * while the others wait in the split.
 */
#ifndef CFX_SUBSET_H
#define CFX_SUBSET_H

#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

/* Ints in one rank's row of the allgather, for a context of `size` ranks. */
static inline size_t cx_subset_row(int size) { return (size_t)size + 1; }

/* This rank's row: the count (-1: ranks is NULL, -2: more than size), then the ranks as given. */
void cx_subset_encode(const int *ranks, size_t n, int size, int32_t *row);

/* The verdict from every rank's row (`all`: size rows back to back): the members of rank 0's list
 * in ascending order in sorted[] (room for 2 * cx_subset_row(size) ints: the second half is
 * scratch) and their number in *n, or CFX_ERR_INVALID_ARGUMENT starting with `fn`. */
cfx_status cx_subset_decide(const char *fn, const int32_t *all, int size, int *sorted, size_t *n);

#endif /* CFX_SUBSET_H */
