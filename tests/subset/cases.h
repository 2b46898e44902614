/*
 * cases - subset contexts (cfx_context_create_subset), written once over the public ABI and run on
 * thread ranks (tests/unit/test_subset.c) and under mpirun (tests/mpi/test_mpi_subset.c). Each takes
 * a fresh context and returns the number of failed checks on this rank; expected sums are computed
 * here from what each member contributed.
 */
#ifndef CFX_TEST_SUBSET_CASES_H
#define CFX_TEST_SUBSET_CASES_H

#include "conflux/conflux.h"

/* The even ranks, and every rank but 0: membership, numbering, allreduce sums. */
int ss_case_members(cfx_context *ctx);
/* Two overlapping subsets used in turn and at once from one thread. */
int ss_case_overlapping(cfx_context *ctx);
/* A subset made and freed again and again (lists in any order). */
int ss_case_repeated(cfx_context *ctx);
/* A gradient set on a subset; a subset of a subset. */
int ss_case_gradset(cfx_context *ctx);
/* Bad and disagreeing lists fail on every rank, naming the rank and value; the context goes on. */
int ss_case_errors(cfx_context *ctx);
/* The parent shuts down: its subset's calls fail with CFX_ERR_SHUT_DOWN. */
int ss_case_parent_shutdown(cfx_context *ctx);

#endif
