/*
 * case_check - the check of the shared multi-rank scenarios (tests/{gradset,subset,adasum}/cases.c),
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

#endif
