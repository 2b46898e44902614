/*
 * test_gradset - gradient sets on thread ranks (the in-process transport): the shared scenarios of
 * tests/gradset/cases.c at 2, 3 and 4 ranks, and the proof that a steady-state step makes no heap
 * allocation (malloc, calloc and realloc counted process-wide while every rank steps).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../gradset/cases.h"
#include "support.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define COUNT_ALLOCATIONS 0 /* the sanitizers own malloc: no counting wrappers */
#else
#define COUNT_ALLOCATIONS 1
#endif

#if COUNT_ALLOCATIONS
/* Process-wide counting wrappers over glibc's allocator (interposed for libc's own calls too). */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
static atomic_int counting;
static atomic_long allocations;
void *malloc(size_t n)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add(&allocations, 1);
    return __libc_malloc(n);
}
void *calloc(size_t n, size_t m)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add(&allocations, 1);
    return __libc_calloc(n, m);
}
void *realloc(void *p, size_t n)
{
    if (atomic_load_explicit(&counting, memory_order_relaxed))
        atomic_fetch_add(&allocations, 1);
    return __libc_realloc(p, n);
}
#endif

typedef int (*case_fn)(cfx_context *ctx);
static int run_case(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)rank, (void)size;
    return (*(case_fn *)arg)(ctx);
}
static int steps_owned(cfx_context *ctx) { return gs_case_steps(ctx, 1); }
static int steps_borrowed(cfx_context *ctx) { return gs_case_steps(ctx, 0); }

static void each_size(case_fn fn)
{
    for (int size = 2; size <= 4; size++)
        assert_int_equal(run_ranks(size, run_case, &fn, NULL), 0);
}

static void owned_steps(void **state) { (void)state; each_size(steps_owned); }
static void borrowed_steps(void **state) { (void)state; each_size(steps_borrowed); }
static void accumulate(void **state) { (void)state; each_size(gs_case_accumulate); }
static void mismatch(void **state) { (void)state; each_size(gs_case_mismatch); }
static void threads(void **state) { (void)state; each_size(gs_case_threads); }
static void sum_int(void **state) { (void)state; each_size(gs_case_sum_int); }
static void shutdown_pending(void **state) { (void)state; each_size(gs_case_shutdown_pending); }
static void errors(void **state) { (void)state; each_size(gs_case_errors); }
static void first_bucket(void **state) { (void)state; each_size(gs_case_first_bucket); }

#if COUNT_ALLOCATIONS
enum { RANKS = 3, GRADS = 40, WARMUP = 5, MEASURED = 30 };
static pthread_barrier_t step_barrier;

static int steady_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)size;
    long *seen = arg;
    cfx_gradset_options o;
    cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    o.bucket_bytes = 4096;
    cfx_gradset *set = NULL;
    RANK_CHECK(cfx_gradset_create(ctx, "steady", &o, &set) == CFX_OK, "%s", cfx_last_error());
    float *bufs[GRADS];
    int32_t index[GRADS];
    for (int g = 0; g < GRADS; g++) {
        int p = (g + rank * 7) % GRADS; /* each rank registers in another order */
        int64_t n[1] = {100 + p};
        char name[32];
        snprintf(name, sizeof name, "p%d", p);
        cfx_tensor t = {NULL, n, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        RANK_CHECK(cfx_gradset_add(set, name, &t, &index[g]) == CFX_OK, "%s", cfx_last_error());
    }
    RANK_CHECK(cfx_gradset_commit(set) == CFX_OK, "%s", cfx_last_error());
    for (int g = 0; g < GRADS; g++)
        cfx_gradset_data(set, index[g], (void **)&bufs[g]);
    int bad = 0;
    for (int step = 0; step < WARMUP + MEASURED; step++) {
        if (step == WARMUP) { /* every rank is in its steady state: count from here */
            pthread_barrier_wait(&step_barrier);
            if (rank == 0)
                atomic_store(&counting, 1);
            pthread_barrier_wait(&step_barrier);
        }
        for (int g = GRADS - 1; g >= 0; g--) {
            bufs[g][0] = (float)(rank + step);
            bad += cfx_gradset_ready(set, index[g]) != CFX_OK;
        }
        bad += cfx_gradset_wait(set, 60.0) != CFX_OK;
    }
    pthread_barrier_wait(&step_barrier);
    if (rank == 0) {
        atomic_store(&counting, 0);
        *seen = atomic_load(&allocations);
    }
    pthread_barrier_wait(&step_barrier);
    RANK_CHECK(bad == 0, "a step failed: %s", cfx_last_error());
    /* The last step's value proves the steps really ran: the average of rank + step. */
    float want = (float)((RANKS - 1) / 2.0 + WARMUP + MEASURED - 1);
    RANK_CHECK(bufs[0][0] == want, "%g, expected %g", bufs[0][0], want);
    cfx_gradset_free(set);
    return 0;
}
#endif

static void no_allocation_per_step(void **state)
{
    (void)state;
#if COUNT_ALLOCATIONS
    long seen = -1;
    pthread_barrier_init(&step_barrier, NULL, RANKS);
    assert_int_equal(run_ranks(RANKS, steady_rank, &seen, NULL), 0);
    pthread_barrier_destroy(&step_barrier);
    if (seen != 0)
        fail_msg("%ld heap allocations in %d steady-state steps of %d ranks", seen, MEASURED, RANKS);
#else
    skip(); /* sanitizer builds replace malloc; the normal build proves this */
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(owned_steps),
        cmocka_unit_test(borrowed_steps),
        cmocka_unit_test(accumulate),
        cmocka_unit_test(mismatch),
        cmocka_unit_test(threads),
        cmocka_unit_test(sum_int),
        cmocka_unit_test(first_bucket),
        cmocka_unit_test(shutdown_pending),
        cmocka_unit_test(errors),
        cmocka_unit_test(no_allocation_per_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
