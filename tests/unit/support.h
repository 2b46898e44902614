/*
 * support - helpers shared by the unit tests: whole jobs of thread ranks on the in-process
 * transport, each with its own context, plus small tensor helpers.
 */
#ifndef CFX_TEST_SUPPORT_H
#define CFX_TEST_SUPPORT_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "base/config.h"
#include "conflux/conflux.h"

/* Body of one thread rank. Returns 0 on success; a failing assertion inside aborts the test. */
typedef int (*rank_fn)(cfx_context *ctx, int rank, int size, void *arg);

/* Runs `size` thread ranks, each with a context over one local world, configured from the
 * defaults and the environment, then `tweak` (may be NULL). Each rank's context is shut down and
 * freed after fn returns. Returns the number of ranks whose fn failed. */
int run_ranks(int size, rank_fn fn, void *arg, void (*tweak)(cx_config *cfg));

/* A 1-D tensor description over `data`. */
cfx_tensor tensor1d(void *data, int64_t *shape, int64_t n, cfx_dtype dtype);

/* Submits one allreduce and waits; returns the status. */
cfx_status allreduce_wait(cfx_context *ctx, const char *name, cfx_tensor *t, cfx_reduce_op op);

/* Inside a rank thread (cmocka's asserts are not thread-safe): report and fail the rank. */
#define RANK_CHECK(cond, ...)                                                               \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "%s:%d: rank %d: check failed: %s: ", __FILE__, __LINE__, rank,  \
                    #cond);                                                                 \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, "\n");                                                          \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

#endif
