/*
 * gloo_job - a Conflux job that needs no MPI of its own, for launchers other than mpirun
 * (cfxrun --transport gloo, torchrun): public ABI only. Every result is checked against what each
 * rank contributed, computed here (rank r's values are a formula of r, so every rank knows them).
 *
 *   gloo_job SIZE                 collectives; exit 0 when every check passed on this rank
 *   gloo_job SIZE --until-failure allreduces until one fails (a peer was killed or stopped by the
 *                                 test); prints the status, the message and the seconds from the
 *                                 last good step to the error and to cfx_shutdown's return
 *   gloo_job SIZE --leave         after one checked allreduce all but the last rank end the
 *                                 world and check that cfx_shutdown + cfx_context_free wait for no
 *                                 goodbye; the last rank sees its world end and exits without
 *                                 cfx_shutdown (a store the launcher serves outlives the world)
 *   gloo_job SIZE --time          rank 0 prints the median time of a lone 4-byte allreduce (500
 *                                 calls) and of a 64 MiB float32 allreduce (5 calls), for comparing
 *                                 launchers and transports on one machine (not a test)
 * Lines start with "gloo_job: rank R" so a driver can read them among the ranks' output.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conflux/conflux.h"

static int failures;
static int my_rank = -1;

#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        if (!(cond)) {                                                   \
            failures++;                                                  \
            printf("gloo_job: rank %d: check failed at line %d: ", my_rank, __LINE__); \
            printf(__VA_ARGS__);                                         \
            printf("\n");                                                \
        }                                                                \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static cfx_tensor vec(void *data, const int64_t *shape, cfx_dtype dtype)
{
    cfx_tensor t = {.data = data, .shape = shape, .ndim = 1, .dtype = dtype,
                    .device = CFX_DEVICE_CPU};
    return t;
}

static cfx_status finish(cfx_context *ctx, cfx_handle h)
{
    cfx_status st = cfx_wait(ctx, h, 120.0);
    if (st)
        printf("gloo_job: rank %d: %s: %s\n", my_rank, cfx_status_string(st), cfx_last_error());
    cfx_handle_release(ctx, h);
    return st;
}

static void collectives(cfx_context *ctx, int n)
{
    enum { N = 100003 }; /* odd, and above the shared-memory chunking thresholds of small runs */
    static float f[N];
    static double d[N];
    static int32_t k[N];
    const int64_t shape[1] = {N};
    for (int i = 0; i < N; i++) {
        f[i] = (float)((my_rank + 1) * (i % 7));
        d[i] = (double)(my_rank + 1) * 0.5 + i;
        k[i] = my_rank * (i % 11) - i % 3;
    }
    cfx_tensor tf = vec(f, shape, CFX_FLOAT32), td = vec(d, shape, CFX_FLOAT64),
               tk = vec(k, shape, CFX_INT32);
    cfx_handle h;
    if (!cfx_allreduce_async(ctx, "sum.f32", &tf, f, CFX_OP_SUM, 1.0, 1.0, &h) && !finish(ctx, h))
        for (int i = 0; i < N; i++)
            if (f[i] != (float)(n * (n + 1) / 2 * (i % 7))) {
                CHECK(0, "sum.f32[%d] = %g, expected %d", i, f[i], n * (n + 1) / 2 * (i % 7));
                break;
            }
    if (!cfx_allreduce_async(ctx, "avg.f64", &td, d, CFX_OP_AVERAGE, 1.0, 1.0, &h) && !finish(ctx, h))
        for (int i = 0; i < N; i++) {
            double want = 0;
            for (int r = 0; r < n; r++)
                want += (double)(r + 1) * 0.5 + i;
            want /= n;
            if (fabs(d[i] - want) > 1e-9 * fabs(want) + 1e-12) {
                CHECK(0, "avg.f64[%d] = %.17g, expected %.17g", i, d[i], want);
                break;
            }
        }
    if (!cfx_allreduce_async(ctx, "max.i32", &tk, k, CFX_OP_MAX, 1.0, 1.0, &h) && !finish(ctx, h))
        for (int i = 0; i < N; i++) {
            int32_t want = INT32_MIN;
            for (int r = 0; r < n; r++)
                want = r * (i % 11) - i % 3 > want ? r * (i % 11) - i % 3 : want;
            if (k[i] != want) {
                CHECK(0, "max.i32[%d] = %d, expected %d", i, k[i], want);
                break;
            }
        }
    /* Broadcast from the last rank. */
    int64_t b[5];
    const int64_t bshape[1] = {5};
    for (int i = 0; i < 5; i++)
        b[i] = my_rank * 100 + i;
    cfx_tensor tb = vec(b, bshape, CFX_INT64);
    if (!cfx_broadcast_async(ctx, "bcast", &tb, n - 1, &h) && !finish(ctx, h))
        for (int i = 0; i < 5; i++)
            CHECK(b[i] == (int64_t)(n - 1) * 100 + i, "bcast[%d] = %lld", i, (long long)b[i]);
    /* Allgather: rank r gives r + 1 rows of value r. */
    float g[64];
    const int64_t gshape[1] = {my_rank + 1};
    for (int i = 0; i <= my_rank; i++)
        g[i] = (float)my_rank;
    cfx_tensor tg = vec(g, gshape, CFX_FLOAT32);
    if (!cfx_allgather_async(ctx, "gather", &tg, &h)) {
        cfx_status st = cfx_wait(ctx, h, 120.0);
        cfx_tensor out;
        CHECK(st == CFX_OK, "allgather: %s", cfx_last_error());
        if (!st && !cfx_handle_output(ctx, h, 0, &out)) {
            CHECK(out.shape[0] == n * (n + 1) / 2, "allgather rows %lld", (long long)out.shape[0]);
            const float *o = out.data;
            int at = 0;
            for (int r = 0; r < n; r++)
                for (int i = 0; i <= r; i++, at++)
                    CHECK(o[at] == (float)r, "allgather row %d = %g, expected %d", at, o[at], r);
        }
        cfx_handle_release(ctx, h);
    }
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median seconds of `calls` blocking allreduces of `count` float32. */
static double median_allreduce_s(cfx_context *ctx, float *buf, int64_t count, int calls)
{
    const int64_t shape[1] = {count};
    cfx_tensor t = vec(buf, shape, CFX_FLOAT32);
    double *times = calloc((size_t)calls, sizeof *times);
    for (int i = 0; i < calls; i++) {
        cfx_handle h;
        double start = now_s();
        if (cfx_allreduce_async(ctx, "timed", &t, buf, CFX_OP_SUM, 1.0, 1.0, &h) || finish(ctx, h))
            failures++;
        times[i] = now_s() - start;
    }
    qsort(times, (size_t)calls, sizeof *times, compare_doubles);
    double median = times[calls / 2];
    free(times);
    return median;
}

static int timings(cfx_context *ctx)
{
    enum { BIG = 16 << 20 }; /* 64 MiB of float32 */
    float *big = calloc(BIG, sizeof *big);
    float one = 1;
    median_allreduce_s(ctx, &one, 1, 50); /* warm-up: the cache learns the name */
    double lone = median_allreduce_s(ctx, &one, 1, 500);
    median_allreduce_s(ctx, big, BIG, 1);
    double large = median_allreduce_s(ctx, big, BIG, 5);
    if (my_rank == 0)
        printf("gloo_job: size %d: lone 4 B allreduce median %.1f us; 64 MiB allreduce median "
               "%.1f ms (%.2f GB/s of tensor)\n", cfx_size(ctx), lone * 1e6, large * 1e3,
               (double)BIG * 4 / large / 1e9);
    free(big);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    return failures ? 1 : 0;
}

static int until_failure(cfx_context *ctx)
{
    enum { N = 1 << 16 };
    static float f[N];
    const int64_t shape[1] = {N};
    cfx_tensor t = vec(f, shape, CFX_FLOAT32);
    double last_good = now_s();
    for (int step = 0;; step++) {
        cfx_handle h = 0;
        cfx_status st = cfx_allreduce_async(ctx, "step", &t, f, CFX_OP_SUM, 1.0, 1.0, &h);
        if (!st)
            st = cfx_wait(ctx, h, 600.0);
        if (st) {
            double failed = now_s();
            printf("gloo_job: rank %d failed after %.2f s: %s: %s\n", my_rank, failed - last_good,
                   cfx_status_string(st), st == CFX_ERR_TIMEOUT ? "" : (h ? cfx_handle_message(ctx, h)
                                                                       : cfx_last_error()));
            fflush(stdout);
            cfx_shutdown(ctx);
            printf("gloo_job: rank %d shutdown returned after %.2f s\n", my_rank, now_s() - failed);
            fflush(stdout);
            return 3;
        }
        cfx_handle_release(ctx, h);
        last_good = now_s();
        printf("gloo_job: rank %d pid %ld step %d\n", my_rank, (long)getpid(), step);
        fflush(stdout);
        usleep(50000);
    }
}

static int leave_without_goodbye(cfx_context *ctx, int n)
{
    float x = (float)(my_rank + 1);
    const int64_t shape[1] = {1};
    cfx_tensor t = vec(&x, shape, CFX_FLOAT32);
    cfx_handle h = 0;
    cfx_status st = cfx_allreduce_async(ctx, "before.leaving", &t, &x, CFX_OP_SUM, 1.0, 1.0, &h);
    if (!st)
        st = finish(ctx, h);
    CHECK(!st, "allreduce: %s", cfx_status_string(st));
    CHECK(x == (float)(n * (n + 1) / 2), "allreduce gave %g, expected %d", x, n * (n + 1) / 2);
    if (my_rank == n - 1) {
        /* An allreduce nobody else submits: it ends when the others' shutdown ends the world
         * (no peer lost), and this rank leaves without its own cfx_shutdown. */
        h = 0;
        st = cfx_allreduce_async(ctx, "after.the.end", &t, &x, CFX_OP_SUM, 1.0, 1.0, &h);
        if (!st)
            st = finish(ctx, h);
        CHECK(st != CFX_OK && st != CFX_ERR_TIMEOUT, "the world did not end: %s",
              cfx_status_string(st));
        printf("gloo_job: rank %d leaves without cfx_shutdown (%s)\n", my_rank,
               cfx_status_string(st));
        fflush(stdout);
        _exit(failures ? 1 : 0);
    }
    /* Ending the world must not wait for the last rank's goodbye: not for the rendezvous deadline
     * (the test sets it long), which is what a wait for a goodbye that never comes would take. */
    const char *deadline = getenv("CFX_RENDEZVOUS_TIMEOUT_S");
    double bound = (deadline ? atof(deadline) : 60.0) / 2;
    double start = now_s();
    CHECK(cfx_shutdown(ctx) == CFX_OK, "shutdown: %s", cfx_last_error());
    cfx_context_free(ctx);
    double took = now_s() - start;
    printf("gloo_job: rank %d ended its world in %.2f s\n", my_rank, took);
    CHECK(took < bound, "cfx_shutdown + cfx_context_free took %.2f s (bound %.0f s): it waited for "
          "the goodbye of a rank that left", took, bound);
    printf("gloo_job: rank %d of %d %s\n", my_rank, n, failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: gloo_job SIZE [--until-failure|--leave|--time]\n");
        return 2;
    }
    int want = atoi(argv[1]);
    cfx_context *ctx = NULL;
    cfx_status st = cfx_init(NULL, &ctx);
    if (st) {
        printf("gloo_job: cfx_init failed: %s: %s\n", cfx_status_string(st), cfx_last_error());
        return 1;
    }
    my_rank = cfx_rank(ctx);
    int n = cfx_size(ctx);
    CHECK(n == want, "size %d, expected %d", n, want);
    if (argc > 2 && !strcmp(argv[2], "--until-failure"))
        return until_failure(ctx);
    if (argc > 2 && !strcmp(argv[2], "--leave"))
        return leave_without_goodbye(ctx, n);
    if (argc > 2 && !strcmp(argv[2], "--time"))
        return timings(ctx);
    collectives(ctx, n);
    int local_size = cfx_local_size(ctx);
    CHECK(cfx_shutdown(ctx) == CFX_OK, "shutdown: %s", cfx_last_error());
    cfx_context_free(ctx);
    printf("gloo_job: rank %d of %d %s (local size %d)\n", my_rank, n, failures ? "FAILED" : "ok",
           local_size);
    return failures ? 1 : 0;
}
