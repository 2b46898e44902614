/*
 * cases - the gradient-set scenarios, written once over the public ABI and run both on thread ranks
 * (tests/unit/test_gradset.c, the in-process transport) and under mpirun (tests/mpi/
 * test_mpi_gradset.c). Each takes a fresh context, runs one scenario on this rank and returns the
 * number of failed checks (printed with file:line and rank). Expected values are computed here
 * from what every rank contributed, never taken from the engine.
 */
#ifndef CFX_TEST_GRADSET_CASES_H
#define CFX_TEST_GRADSET_CASES_H

#include "conflux/conflux.h"

/* Registration in a different order on every rank, mixed dtypes, several buckets, ready in reverse
 * and in shuffled order, an unused gradient on one rank, three steps; owned or borrowed storage. */
int gs_case_steps(cfx_context *ctx, int owned);
/* accumulate_steps = 2: the first pass only counts; a third ready in a step is refused. */
int gs_case_accumulate(cfx_context *ctx);
/* A shape that differs on the last rank, then a gradient missing on rank 1: commit fails on every
 * rank with CFX_ERR_MISMATCH naming the gradient and the ranks; nothing hangs. */
int gs_case_mismatch(cfx_context *ctx);
/* Two threads per rank mark disjoint halves of the gradients ready at once. */
int gs_case_threads(cfx_context *ctx);
/* Integer gradients under SUM with a prescale (exact values). */
int gs_case_sum_int(cfx_context *ctx);
/* Rank 0 shuts down while the others wait on a step: every wait fails with CFX_ERR_SHUT_DOWN. */
int gs_case_shutdown_pending(cfx_context *ctx);
/* The plan's small first bucket (at most 1 MiB, or bucket_bytes if smaller) before larger ones:
 * gradients ready one by one in backward's order, averages checked, default and 96 KiB buckets. */
int gs_case_first_bucket(cfx_context *ctx);
/* Argument errors: bad options, data in an owned set, duplicate names, ready before commit. */
int gs_case_errors(cfx_context *ctx);

#endif
