/* loops.c - implements loops.h on the public ABI. */
#include "loops.h"

#include <string.h>
#include <time.h>

static double elapsed_us(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e6 + (double)(b->tv_nsec - a->tv_nsec) * 1e-3;
}

int cfx_bench_allreduce_loop(void *ctx, int64_t n, double *us)
{
    float x = 1.0f;
    int64_t shape[1] = {1};
    cfx_tensor t;
    cfx_status st = CFX_OK;
    memset(&t, 0, sizeof t);
    t.data = &x;
    t.dtype = CFX_FLOAT32;
    t.ndim = 1;
    t.shape = shape;
    t.device = CFX_DEVICE_CPU;
    for (int64_t i = 0; i < n && st == CFX_OK; i++) {
        struct timespec a, b;
        cfx_handle h = 0;
        timespec_get(&a, TIME_UTC);
        st = cfx_allreduce_async(ctx, "ovh", &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h);
        if (st == CFX_OK) st = cfx_wait(ctx, h, -1.0);
        if (h) (void)cfx_handle_release(ctx, h);
        timespec_get(&b, TIME_UTC);
        us[i] = elapsed_us(&a, &b);
        x = 1.0f;
    }
    return (int)st;
}

int cfx_bench_gradset_loop(void *set, int32_t count, int64_t n, double *step_us, double *ready_us)
{
    cfx_status st = CFX_OK;
    for (int64_t k = 0; k < n && st == CFX_OK; k++) {
        struct timespec a, r, b;
        timespec_get(&a, TIME_UTC);
        for (int32_t g = count - 1; g >= 0 && st == CFX_OK; g--) st = cfx_gradset_ready(set, g);
        timespec_get(&r, TIME_UTC);
        if (st == CFX_OK) st = cfx_gradset_wait(set, -1.0);
        timespec_get(&b, TIME_UTC);
        step_us[k] = elapsed_us(&a, &b);
        if (ready_us) ready_us[k] = elapsed_us(&a, &r);
    }
    return (int)st;
}
