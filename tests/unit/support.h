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

/* The start of a thread rank's job for run_world_threads: which world, which rank. */
typedef struct world_rank {
    struct cx_local_world *world;
    int rank;
} world_rank;

/* Runs fn on n thread ranks of a fresh local world (transport/transport_local.h); thread r gets
 * the job at (char *)jobs + r * job_size, whose first member is a world_rank filled in here. For
 * tests that make each rank's context themselves (each with its own configuration). */
void run_world_threads(int n, void *(*fn)(void *), void *jobs, size_t job_size);

/* In a run_world_threads job: this rank's context over its world from `cfg` (status = the
 * configuration's status so far; nothing is made unless it is CFX_OK). Returns the status, with
 * the failure's message in msg ("" on success). */
cfx_status open_world_rank(const world_rank *at, const cx_config *cfg, cfx_status status,
                           struct cfx_context **out, char *msg, size_t len);

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
