/*
 * case_check - the check of the shared multi-rank scenarios (tests/{gradset,subset,adasum,compress}/cases.c),
 * which run both on thread ranks and under mpirun: a failed check prints file:line, the rank of
 * `ctx` and the values, counts in the scenario's `failures` and goes on, so every rank keeps taking
 * part in the collectives that follow.
 */
#ifndef CFX_TEST_CASE_CHECK_H
#define CFX_TEST_CASE_CHECK_H

#include <stdio.h>

#include "conflux/conflux.h"

#define CASE_CHECK(cond, ...)                                                               \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: rank %d: check failed: %s: ", __FILE__, __LINE__,        \
                    cfx_rank(ctx), #cond);                                                  \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, "\n");                                                          \
            failures++;                                                                     \
        }                                                                                   \
    } while (0)
#define CASE_OK(expr) CASE_CHECK((expr) == CFX_OK, "%s: %s", #expr, cfx_last_error())

/* The end of a scenario whose checks are local (argument refusals, no collective): one rank's
 * shutdown stops every rank's context, so a rank that finished its checks first must not return
 * (and shut its context down) while another is still making them, whose calls would then fail with
 * "the context has been shut down" instead of the refusal they check. Returns the failures. */
static inline int case_settle(cfx_context *ctx)
{
    int failures = 0;
    cfx_handle h = 0;
    CASE_OK(cfx_barrier_async(ctx, &h));
    CASE_OK(cfx_wait(ctx, h, 60.0));
    cfx_handle_release(ctx, h);
    return failures;
}

#endif
