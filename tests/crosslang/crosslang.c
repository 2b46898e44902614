/*
 * crosslang.c - the C side of the cross-language test: one allreduce SUM and one AVERAGE of a fixed
 * float32 input through the C ABI, written as raw bytes so that run_crosslang.cmake can compare them
 * with what the Java, Lua and Python bindings produce from the same input.
 *
 * Input on rank r: x[i] = (float)sin(i * 0.1 + r), i < 1000. Output file <prefix>.<rank>.bin holds
 * input, sum, average (1000 float32 each, native byte order).
 *
 * With `gradset` before OUT_PREFIX: the gradient set of the mixed job (run_crosslang.cmake), whose
 * ranks run different languages. Every program registers the same four gradients (canonical order k:
 * xg.w float32 [3,4], xg.b float64 [5], xg.n int32 [6], xg.v float32 [2,3,2]) in an order rotated
 * by its rank, op SUM, 64-byte buckets, owned storage. Step s (0..2) on rank r writes element i of
 * gradient k as v = (r+1)*(k+1) + 3*i + 7*s - 20 (integers; floats v/4, exact), marks the gradients
 * ready in reverse order of registration (gradient k == s skipped: reduced as it is) and waits; each
 * result is checked against the sum over ranks computed here, then written in canonical order
 * (native byte order): <prefix>.<rank>.bin holds the 3 steps' results.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conflux/conflux.h"

#define N 1000

static int check(cfx_status s, const char *what)
{
    if (s != CFX_OK) {
        fprintf(stderr, "crosslang_c: %s: %s (%s)\n", what, cfx_status_string(s), cfx_last_error());
        exit(1);
    }
    return 0;
}

static void allreduce(cfx_context *ctx, const char *name, const float *in, float *out, cfx_reduce_op op)
{
    int64_t shape[1] = {N};
    cfx_tensor t = {(void *)in, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    check(cfx_allreduce_async(ctx, name, &t, out, op, 1.0, 1.0, &h), name);
    check(cfx_wait(ctx, h, -1.0), name);
    check(cfx_handle_release(ctx, h), "release");
}

#define XG_N 4
#define XG_STEPS 3
static const char *const xg_name[XG_N] = {"xg.w", "xg.b", "xg.n", "xg.v"};
static const cfx_dtype xg_dtype[XG_N] = {CFX_FLOAT32, CFX_FLOAT64, CFX_INT32, CFX_FLOAT32};
static const int xg_ndim[XG_N] = {2, 1, 1, 3};
static const int64_t xg_shape[XG_N][3] = {{3, 4}, {5}, {6}, {2, 3, 2}};
static const int xg_count[XG_N] = {12, 5, 6, 12};

static int gradset_main(const char *prefix)
{
    cfx_context *ctx = NULL;
    cfx_gradset *gs = NULL;
    cfx_gradset_options opts;
    void *data[XG_N];
    int32_t index[XG_N];
    int order[XG_N];
    char path[4096];
    FILE *f;
    int rank, size, j, k, i, s, q, ranksum = 0;
    check(cfx_init(NULL, &ctx), "cfx_init");
    rank = cfx_rank(ctx);
    size = cfx_size(ctx);
    for (q = 0; q < size; q++)
        ranksum += q + 1;
    check(cfx_gradset_options_init(&opts, CFX_GRADSET_OPTIONS_VERSION), "options");
    opts.op = CFX_OP_SUM;
    opts.bucket_bytes = 64;
    check(cfx_gradset_create(ctx, "xl.gs", &opts, &gs), "cfx_gradset_create");
    for (j = 0; j < XG_N; j++) {
        k = order[j] = (j + rank) % XG_N;
        cfx_tensor t = {NULL, (int64_t *)xg_shape[k], xg_ndim[k], xg_dtype[k], CFX_DEVICE_CPU, NULL};
        check(cfx_gradset_add(gs, xg_name[k], &t, &index[k]), xg_name[k]);
    }
    check(cfx_gradset_commit(gs), "cfx_gradset_commit");
    for (k = 0; k < XG_N; k++)
        check(cfx_gradset_data(gs, index[k], &data[k]), "cfx_gradset_data");
    snprintf(path, sizeof path, "%s.%d.bin", prefix, rank);
    f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "crosslang_c: cannot write %s\n", path);
        return 1;
    }
    for (s = 0; s < XG_STEPS; s++) {
        for (k = 0; k < XG_N; k++)
            for (i = 0; i < xg_count[k]; i++) {
                int v = (rank + 1) * (k + 1) + 3 * i + 7 * s - 20;
                if (xg_dtype[k] == CFX_FLOAT32)
                    ((float *)data[k])[i] = (float)v / 4;
                else if (xg_dtype[k] == CFX_FLOAT64)
                    ((double *)data[k])[i] = (double)v / 4;
                else
                    ((int32_t *)data[k])[i] = v;
            }
        for (j = XG_N - 1; j >= 0; j--)
            if (order[j] != s)
                check(cfx_gradset_ready(gs, index[order[j]]), "cfx_gradset_ready");
        check(cfx_gradset_wait(gs, 60.0), "cfx_gradset_wait");
        for (k = 0; k < XG_N; k++) {
            for (i = 0; i < xg_count[k]; i++) {
                int want = ranksum * (k + 1) + size * (3 * i + 7 * s - 20);
                double got = xg_dtype[k] == CFX_FLOAT32   ? ((float *)data[k])[i] * 4.0
                             : xg_dtype[k] == CFX_FLOAT64 ? ((double *)data[k])[i] * 4.0
                                                          : ((int32_t *)data[k])[i];
                if (got != want) {
                    double unit = xg_dtype[k] == CFX_INT32 ? 1.0 : 4.0;
                    fprintf(stderr, "crosslang_c: rank %d step %d %s[%d] = %g, expected %g\n", rank, s,
                            xg_name[k], i, got / unit, want / unit);
                    return 1;
                }
            }
            if (fwrite(data[k], (size_t)xg_count[k] * (xg_dtype[k] == CFX_FLOAT64 ? 8 : 4), 1, f) != 1)
                return 1;
        }
    }
    if (fclose(f) != 0)
        return 1;
    cfx_gradset_free(gs);
    check(cfx_shutdown(ctx), "cfx_shutdown");
    cfx_context_free(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    static float x[N], sum[N], avg[N];
    cfx_context *ctx = NULL;
    char path[4096];
    FILE *f;
    int rank, i;
    if (argc == 3 && strcmp(argv[1], "gradset") == 0)
        return gradset_main(argv[2]);
    if (argc != 2) {
        fprintf(stderr, "usage: crosslang_c [gradset] OUT_PREFIX\n");
        return 2;
    }
    check(cfx_init(NULL, &ctx), "cfx_init");
    rank = cfx_rank(ctx);
    for (i = 0; i < N; i++)
        x[i] = (float)sin(i * 0.1 + rank);
    allreduce(ctx, "xl.sum", x, sum, CFX_OP_SUM);
    allreduce(ctx, "xl.avg", x, avg, CFX_OP_AVERAGE);
    snprintf(path, sizeof path, "%s.%d.bin", argv[1], rank);
    f = fopen(path, "wb");
    if (!f || fwrite(x, sizeof x, 1, f) != 1 || fwrite(sum, sizeof sum, 1, f) != 1 ||
        fwrite(avg, sizeof avg, 1, f) != 1 || fclose(f) != 0) {
        fprintf(stderr, "crosslang_c: cannot write %s\n", path);
        return 1;
    }
    check(cfx_shutdown(ctx), "cfx_shutdown");
    cfx_context_free(ctx);
    return 0;
}
