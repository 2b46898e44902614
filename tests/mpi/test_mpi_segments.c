/*
 * Segments of a batch on the shared-memory path under mpirun: the engine describes a batch by where
 * its tensors lie, and a tensor that continues the previous one in memory (input and output alike)
 * extends the previous segment, so a gradient set's owned bucket is one segment however many
 * gradients it holds. The direct path reads a peer's segment i through that peer's offer, so every
 * local rank must have cut the batch alike; these tests make the cuts differ on purpose.
 *
 * Each batch is one grouped allreduce (one response, so one batch) of three tensors A, B, C of
 * lengths N, 2N, N in shared tensor memory (cfx_alloc):
 * - alike: every rank lays A, B, C out back to back (one segment): the direct path (the run's log
 *   line "allreduce path direct" is required by the harness);
 * - different cuts with the same number of segments: even ranks lay A|B back to back and C apart,
 *   odd ranks A apart and B|C back to back: two segments of N+2N and N on one side, N and 2N+N on
 *   the other. The engine must see that the cuts differ and take the copies;
 * - alike again afterwards: the direct path is still there.
 * Results are checked against the sum of what every rank contributed.
 */
#include <stdlib.h>
#include <string.h>

#include "mpitest.h"

enum { N = 5000 };

/* Rank r's value of element i of tensor t: small integers, every sum exact in float32. */
static float value(int r, int t, size_t i) { return (float)((r + 1) * (t + 2) + (int)(i % 97)); }

static float expected(int t, size_t i)
{
    float sum = 0;
    for (int r = 0; r < mt_size; r++)
        sum += value(r, t, i);
    return sum;
}

/* One grouped allreduce of A (N), B (2N), C (N) at a, b, c, checked. */
static void reduce_group(cfx_context *ctx, const char *name, float *a, float *b, float *c)
{
    float *data[3] = {a, b, c};
    int64_t len[3] = {N, 2 * N, N};
    cfx_tensor t[3];
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < (size_t)len[k]; i++)
            data[k][i] = value(mt_rank, k, i);
        t[k] = (cfx_tensor){data[k], &len[k], 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    }
    cfx_handle h = 0;
    CHECK_OK(cfx_grouped_allreduce_async(ctx, name, 3, t, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
    mt_wait_expect(ctx, h, CFX_OK, name);
    for (int k = 0; k < 3; k++) {
        int bad = 0;
        for (size_t i = 0; i < (size_t)len[k]; i++)
            if (data[k][i] != expected(k, i) && bad++ < 3)
                CHECK(0, "%s: tensor %d element %zu is %g, expected %g", name, k, i,
                      (double)data[k][i], (double)expected(k, i));
    }
}

static void cuts(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    float *block = NULL, *apart = NULL;
    CHECK_OK(cfx_alloc(4 * N * sizeof(float), (void **)&block));
    CHECK_OK(cfx_alloc(4 * N * sizeof(float), (void **)&apart));
    if (block && apart) {
        reduce_group(ctx, "seg.alike", block, block + N, block + 3 * N);
        if (mt_rank % 2 == 0) /* A|B back to back, C apart */
            reduce_group(ctx, "seg.differ", block, block + N, apart);
        else /* A apart, B|C back to back */
            reduce_group(ctx, "seg.differ", apart, block + N, block + 3 * N);
        reduce_group(ctx, "seg.alike_again", block, block + N, block + 3 * N);
    }
    CHECK_OK(cfx_free(block));
    CHECK_OK(cfx_free(apart));
    mt_close(ctx);
    mt_finish();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(cuts)};
    return MT_RUN(argc, argv, tests);
}
