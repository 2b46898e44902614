/*
 * crosslang.c - the C side of the cross-language test: one allreduce SUM and one AVERAGE of a fixed
 * float32 input through the C ABI, written as raw bytes so that run_crosslang.cmake can compare them
 * with what the Java, Lua and Python bindings produce from the same input.
 *
 * Input on rank r: x[i] = (float)sin(i * 0.1 + r), i < 1000. Output file <prefix>.<rank>.bin holds
 * input, sum, average (1000 float32 each, native byte order).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

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

int main(int argc, char **argv)
{
    static float x[N], sum[N], avg[N];
    cfx_context *ctx = NULL;
    char path[4096];
    FILE *f;
    int rank, i;
    if (argc != 2) {
        fprintf(stderr, "usage: crosslang_c OUT_PREFIX\n");
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
