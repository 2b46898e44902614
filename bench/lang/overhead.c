/*
 * overhead.c - per-call cost of a 1-element float32 allreduce (enqueue + wait + release) through
 * the C ABI: the baseline for Overhead.java and overhead.lua (run together by run.sh).
 * Usage: overhead_c [iterations] [warmup]. Rank 0 prints one line: "c <median_us> <p10_us> <p90_us>".
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "conflux/conflux.h"

static double now(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int iters = argc > 1 ? atoi(argv[1]) : 5000, warm = argc > 2 ? atoi(argv[2]) : 1000, i;
    double *t = malloc(sizeof *t * (size_t)iters);
    float x = 1.0f;
    int64_t shape[1] = {1};
    cfx_tensor tensor = {&x, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_context *ctx = NULL;
    if (!t || cfx_init(NULL, &ctx) != CFX_OK) {
        fprintf(stderr, "overhead_c: init failed: %s\n", cfx_last_error());
        return 1;
    }
    for (i = -warm; i < iters; i++) {
        cfx_handle h = 0;
        double t0 = now();
        if (cfx_allreduce_async(ctx, "ovh", &tensor, NULL, CFX_OP_SUM, 1.0, 1.0, &h) != CFX_OK ||
            cfx_wait(ctx, h, -1.0) != CFX_OK) {
            fprintf(stderr, "overhead_c: allreduce failed: %s\n", cfx_last_error());
            return 1;
        }
        cfx_handle_release(ctx, h);
        if (i >= 0)
            t[i] = now() - t0;
        x = 1.0f;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp);
    if (cfx_rank(ctx) == 0)
        printf("c %.2f %.2f %.2f\n", t[iters / 2] * 1e6, t[iters / 10] * 1e6, t[iters * 9 / 10] * 1e6);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    free(t);
    return 0;
}
