/*
 * test_wakeup - the background thread's spin-then-sleep logic (engine/loop.c, protocol/queue.c):
 * no wake-up is lost however submissions and the thread's spinning and sleeping interleave (lone
 * collectives and gradient-set steps with random pauses between them, every result checked; run
 * under TSan by the test command), whichever thread runs the cycles: the waiting one
 * (cx_loop_drive), several waiting ones at once, the background thread for a poller, for a context
 * with CFX_WAIT_RUNS_CYCLES=0 and for one that has bound a device; and an idle context uses almost
 * no CPU.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "support.h"
#include "engine/context.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define IDLE_CPU_BOUND 0.20 /* instrumented cycles cost more; a spinning thread would still be ~1.0 */
#else
#define IDLE_CPU_BOUND 0.05 /* the figure is ~0.01 (bench); a spinning thread would be ~1.0 */
#endif

static void pause_us(unsigned us)
{
    struct timespec ts = {0, (long)us * 1000};
    nanosleep(&ts, NULL);
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

enum { CALLS = 1500 };

static int lone_calls(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    unsigned seed = 77u + (unsigned)rank;
    int64_t shape[1];
    for (int i = 0; i < CALLS; i++) {
        double v = rank + i;
        cfx_tensor t = tensor1d(&v, shape, 1, CFX_FLOAT64);
        cfx_status st = allreduce_wait(ctx, "lone", &t, CFX_OP_SUM);
        RANK_CHECK(st == CFX_OK, "call %d: %s", i, cfx_last_error());
        double want = size * (size - 1) / 2.0 + (double)size * i;
        RANK_CHECK(v == want, "call %d: %g, expected %g", i, v, want);
        seed = seed * 1103515245u + 12345u;
        unsigned r = (seed >> 8) % 8;
        if (r < 3) /* inside the spin budget, past it, or long enough to sleep */
            pause_us(r == 0 ? 5 : r == 1 ? 60 : 400);
    }
    return 0;
}

/* Polls instead of waiting: the background thread runs the work (cfx_poll pays a lazy wake-up). */
static int polled_calls(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    int64_t shape[1];
    for (int i = 0; i < CALLS / 5; i++) {
        double v = 2.0 * rank + i;
        cfx_tensor t = tensor1d(&v, shape, 1, CFX_FLOAT64);
        cfx_handle h;
        RANK_CHECK(cfx_allreduce_async(ctx, "polled", &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h) == CFX_OK,
                   "call %d: %s", i, cfx_last_error());
        int done = 0;
        while (!done) {
            RANK_CHECK(cfx_poll(ctx, h, &done) == CFX_OK, "call %d: %s", i, cfx_last_error());
            if (!done)
                pause_us(i % 2 ? 1 : 30);
        }
        RANK_CHECK(cfx_handle_status(ctx, h) == CFX_OK, "call %d: %s", i, cfx_last_error());
        cfx_handle_release(ctx, h);
        double want = (double)size * (size - 1) + (double)size * i;
        RANK_CHECK(v == want, "call %d: %g, expected %g", i, v, want);
    }
    return 0;
}

/* Several threads of one rank wait at once, each for its own lone collectives: at most one of
 * them runs a cycle at a time, the others wait for it (or for the background thread). */
enum { WAITERS = 3 };

typedef struct waiter {
    cfx_context *ctx;
    int rank, size, index, failed;
} waiter;

static void *waiter_main(void *arg)
{
    waiter *w = arg;
    int rank = w->rank;
    char name[16];
    snprintf(name, sizeof name, "waiter%d", w->index);
    int64_t shape[1];
    unsigned seed = 5u + 31u * (unsigned)w->index + (unsigned)rank;
    for (int i = 0; i < CALLS / 3; i++) {
        double v = rank + 10.0 * w->index + i;
        cfx_tensor t = tensor1d(&v, shape, 1, CFX_FLOAT64);
        cfx_status st = allreduce_wait(w->ctx, name, &t, CFX_OP_SUM);
        double want = w->size * (w->size - 1) / 2.0 + w->size * (10.0 * w->index + i);
        if (st != CFX_OK || v != want) {
            fprintf(stderr, "rank %d, %s, call %d: status %d (%s), %g, expected %g\n", rank, name,
                    i, st, st ? cfx_last_error() : "", v, want);
            w->failed = 1;
            return NULL;
        }
        seed = seed * 1103515245u + 12345u;
        if ((seed >> 8) % 4 == 0)
            pause_us(((seed >> 12) % 3) * 40);
    }
    return NULL;
}

static int threaded_calls(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    pthread_t threads[WAITERS];
    waiter w[WAITERS];
    for (int k = 0; k < WAITERS; k++) {
        w[k] = (waiter){ctx, rank, size, k, 0};
        RANK_CHECK(pthread_create(&threads[k], NULL, waiter_main, &w[k]) == 0, "thread %d", k);
    }
    int failed = 0;
    for (int k = 0; k < WAITERS; k++) {
        pthread_join(threads[k], NULL);
        failed += w[k].failed;
    }
    RANK_CHECK(failed == 0, "%d of %d waiting threads failed", failed, WAITERS);
    return 0;
}

/* A rank that has bound a device leaves every cycle to the background thread (loop.h): waits
 * still complete. The binding is what api/submit.c records for the first device tensor. */
static int device_bound_calls(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    if (rank == 0) {
        atomic_store(&ctx->cuda_device_bound, 1);
        cx_loop_fence(ctx->loop);
    }
    return lone_calls(ctx, rank, size, NULL);
}

static void waits_run_no_cycles(cx_config *cfg) { cfg->wait_runs_cycles = 0; }

/* The shared-memory segment: the cycles' agreement goes through it (one barrier) instead of the
 * transport, so its waits are those of the segment's barrier. */
static void shm_agreement(cx_config *cfg) { cfg->shm = 1; }

static int gradset_steps(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    cfx_gradset *set = NULL;
    int64_t n[1] = {3};
    int32_t i0;
    RANK_CHECK(cfx_gradset_create(ctx, "wakeup", NULL, &set) == CFX_OK, "%s", cfx_last_error());
    RANK_CHECK(cfx_gradset_add(set, "g", &(cfx_tensor){NULL, n, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL},
                               &i0) == CFX_OK, "%s", cfx_last_error());
    RANK_CHECK(cfx_gradset_commit(set) == CFX_OK, "%s", cfx_last_error());
    float *g = NULL;
    cfx_gradset_data(set, i0, (void **)&g);
    unsigned seed = 99u + (unsigned)rank;
    for (int step = 0; step < CALLS / 3; step++) {
        for (int j = 0; j < 3; j++)
            g[j] = (float)(rank + step + j);
        seed = seed * 1103515245u + 12345u;
        if ((seed >> 8) % 4 == 0)
            pause_us(((seed >> 12) % 3) * 150);
        RANK_CHECK(cfx_gradset_ready(set, i0) == CFX_OK, "%s", cfx_last_error());
        RANK_CHECK(cfx_gradset_wait(set, 60.0) == CFX_OK, "step %d: %s", step, cfx_last_error());
        float want = (float)((size - 1) / 2.0 + step);
        RANK_CHECK(g[0] == want, "step %d: %g, expected %g", step, g[0], want);
    }
    cfx_gradset_free(set);
    return 0;
}

static int idle(cfx_context *ctx, int rank, int size, void *arg)
{
    double *share = arg;
    int64_t shape[1];
    double v = 1;
    cfx_tensor t = tensor1d(&v, shape, 1, CFX_FLOAT64);
    RANK_CHECK(allreduce_wait(ctx, "warm", &t, CFX_OP_SUM) == CFX_OK, "%s", cfx_last_error());
    RANK_CHECK(v == size, "%g", v);
    pause_us(20 * 1000); /* past the spin window */
    double c0 = cpu_s();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pause_us(999 * 1000); /* every rank: its main thread sleeps, its context idles */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double wall = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (rank == 0) /* the whole process: every rank's threads */
        *share = (cpu_s() - c0) / wall / size;
    return 0;
}

static void no_lost_wakeup_lone(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, lone_calls, NULL, NULL), 0);
    assert_int_equal(run_ranks(3, lone_calls, NULL, NULL), 0);
    assert_int_equal(run_ranks(3, lone_calls, NULL, shm_agreement), 0);
}

static void no_lost_wakeup_polled(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, polled_calls, NULL, NULL), 0);
    assert_int_equal(run_ranks(3, polled_calls, NULL, NULL), 0);
}

static void no_lost_wakeup_waiting_threads(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, threaded_calls, NULL, NULL), 0);
    assert_int_equal(run_ranks(3, threaded_calls, NULL, NULL), 0);
}

static void no_lost_wakeup_background_only(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, lone_calls, NULL, waits_run_no_cycles), 0);
    assert_int_equal(run_ranks(2, gradset_steps, NULL, waits_run_no_cycles), 0);
    assert_int_equal(run_ranks(3, device_bound_calls, NULL, NULL), 0);
}

static void no_lost_wakeup_gradset(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, gradset_steps, NULL, NULL), 0);
    assert_int_equal(run_ranks(3, gradset_steps, NULL, NULL), 0);
    assert_int_equal(run_ranks(2, gradset_steps, NULL, shm_agreement), 0);
}

static void idle_cpu_bounded(void **state)
{
    (void)state;
    void (*setups[])(cx_config *) = {NULL, shm_agreement};
    for (int k = 0; k < 2; k++) {
        const char *what = k ? "agreeing over shared memory" : "agreeing over the transport";
        double share = -1;
        assert_int_equal(run_ranks(2, idle, &share, setups[k]), 0);
        print_message("idle context, %s: %.4f of a core per rank (bound %.2f)\n", what, share,
                      IDLE_CPU_BOUND);
        assert_true(share >= 0);
        if (share > IDLE_CPU_BOUND)
            fail_msg("an idle context %s used %.3f of a core per rank (bound %.2f)", what, share,
                     IDLE_CPU_BOUND);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_lost_wakeup_lone),
        cmocka_unit_test(no_lost_wakeup_gradset),
        cmocka_unit_test(no_lost_wakeup_polled),
        cmocka_unit_test(no_lost_wakeup_waiting_threads),
        cmocka_unit_test(no_lost_wakeup_background_only),
        cmocka_unit_test(idle_cpu_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
