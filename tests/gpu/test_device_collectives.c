/*
 * test_device_collectives - device tensors through the public ABI, end to end: the engine's
 * device path (NCCL, or host-staged through MPI) for grouped (fused) allreduce, average with
 * prescale/postscale, broadcast and allgather, with the producer's stream passed in the tensor and
 * the result read back on that same stream. Results are checked against sums of what every rank
 * contributed, computed here. Runs as one process (local transport) or under mpirun; ranks that
 * share one GPU are expected to take the host-staged path.
 * Skips (exit 77, with a reason) when no device is usable, or when this build of the engine does
 * not accept device tensors yet (CFX_ERR_UNSUPPORTED).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conflux/conflux.h"
#include "cuda_kernels.h"
#include "error.h"
#include "gpu_test.h"

static const char *const TEST = "test_device_collectives";

static float value(int rank, size_t i) { return (float)(rank + 1) + (float)(i % 7); }

int main(void)
{
    if (!(cfx_features() & CFX_FEATURE_CUDA))
        return printf("%s: skipped: no CUDA device (this libconflux was built without CUDA)\n", TEST),
               GPU_TEST_SKIP;
    if (cx_cuda_probe() != CFX_OK)
        return gpu_test_skip(TEST, cx_error_message());
    cfx_context *ctx = NULL;
    if (cfx_init(NULL, &ctx) != CFX_OK) {
        fprintf(stderr, "%s: cfx_init: %s\n", TEST, cfx_last_error());
        return 1;
    }
    int rank = cfx_rank(ctx), size = cfx_size(ctx);
    int ndev = cx_cuda_device_count();
    REQUIRE_OK(cx_cuda_set_device(cfx_local_rank(ctx) % ndev));
    CHECK(cfx_features() & CFX_FEATURE_CUDA_DEVICE, "features lack CFX_FEATURE_CUDA_DEVICE");

    void *stream = NULL;
    REQUIRE_OK(cx_cuda_stream_create(&stream));
    enum { NT = 3 };
    const size_t counts[NT] = {5, 4099, 100000};
    float *host[NT], *dev[NT];
    int64_t shapes[NT];
    cfx_tensor t[NT];
    for (int k = 0; k < NT; k++) {
        host[k] = malloc(counts[k] * sizeof(float));
        for (size_t i = 0; i < counts[k]; i++)
            host[k][i] = value(rank, i + (size_t)k);
        REQUIRE_OK(cx_cuda_malloc(counts[k] * sizeof(float), (void **)&dev[k]));
        REQUIRE_OK(cx_cuda_memcpy_async(dev[k], host[k], counts[k] * sizeof(float), stream));
        shapes[k] = (int64_t)counts[k];
        t[k] = (cfx_tensor){dev[k], &shapes[k], 1, CFX_FLOAT32, cfx_local_rank(ctx) % ndev, stream};
    }
    /* No host wait: Conflux must order itself after the copies on `stream`. */
    cfx_handle h = 0;
    cfx_status st = cfx_grouped_allreduce_async(ctx, "dev.sum", NT, t, NULL, CFX_OP_SUM, 1.0, 1.0, &h);
    if (st == CFX_ERR_UNSUPPORTED) {
        printf("%s: skipped: device tensors are not supported by this engine yet (%s)\n", TEST,
               cfx_last_error());
        cfx_context_free(ctx);
        return GPU_TEST_SKIP;
    }
    CHECK(st == CFX_OK, "grouped allreduce: %s", cfx_last_error());
    CHECK_OK(cfx_wait(ctx, h, 120.0));
    cfx_handle_release(ctx, h);
    for (int k = 0; k < NT; k++) {
        float *o = malloc(counts[k] * sizeof(float));
        REQUIRE_OK(cx_cuda_memcpy_async(o, dev[k], counts[k] * sizeof(float), stream));
        REQUIRE_OK(cx_cuda_stream_sync(stream));
        size_t bad = 0;
        for (size_t i = 0; i < counts[k]; i++) {
            float want = 0;
            for (int r = 0; r < size; r++)
                want += value(r, i + (size_t)k);
            bad += o[i] != want;
        }
        CHECK(bad == 0, "sum of tensor %d: %zu wrong elements", k, bad);
        free(o);
    }

    /* average with prescale 2 and postscale 0.5 of tensor 2 (in place): the mean of the sums */
    for (int k = 2; k < 3; k++)
        REQUIRE_OK(cx_cuda_memcpy_async(dev[k], host[k], counts[k] * sizeof(float), stream));
    CHECK_OK(cfx_allreduce_async(ctx, "dev.avg", &t[2], NULL, CFX_OP_AVERAGE, 2.0, 0.5, &h));
    CHECK_OK(cfx_wait(ctx, h, 120.0));
    cfx_handle_release(ctx, h);
    float *o = malloc(counts[2] * sizeof(float));
    REQUIRE_OK(cx_cuda_memcpy_async(o, dev[2], counts[2] * sizeof(float), stream));
    REQUIRE_OK(cx_cuda_stream_sync(stream));
    size_t bad = 0;
    for (size_t i = 0; i < counts[2]; i++) {
        float want = 0;
        for (int r = 0; r < size; r++)
            want += value(r, i + 2);
        want /= (float)size;
        bad += o[i] - want > 1e-4f * want || want - o[i] > 1e-4f * want;
    }
    CHECK(bad == 0, "average: %zu wrong elements", bad);

    /* broadcast tensor 1 from the last rank */
    REQUIRE_OK(cx_cuda_memcpy_async(dev[1], host[1], counts[1] * sizeof(float), stream));
    CHECK_OK(cfx_broadcast_async(ctx, "dev.bcast", &t[1], size - 1, &h));
    CHECK_OK(cfx_wait(ctx, h, 120.0));
    cfx_handle_release(ctx, h);
    REQUIRE_OK(cx_cuda_memcpy_async(o, dev[1], counts[1] * sizeof(float), stream));
    REQUIRE_OK(cx_cuda_stream_sync(stream));
    bad = 0;
    for (size_t i = 0; i < counts[1]; i++)
        bad += o[i] != value(size - 1, i + 1);
    CHECK(bad == 0, "broadcast: %zu wrong elements", bad);

    /* allgather of rank+1 rows of tensor 0's first elements */
    int64_t rows = rank + 1;
    cfx_tensor g = {dev[0], &rows, 1, CFX_FLOAT32, t[0].device, stream};
    REQUIRE_OK(cx_cuda_memcpy_async(dev[0], host[0], counts[0] * sizeof(float), stream));
    if (rows > (int64_t)counts[0])
        rows = (int64_t)counts[0];
    CHECK_OK(cfx_allgather_async(ctx, "dev.gather", &g, &h));
    CHECK_OK(cfx_wait(ctx, h, 120.0));
    cfx_tensor out;
    memset(&out, 0, sizeof out);
    CHECK_OK(cfx_handle_output(ctx, h, 0, &out));
    size_t total = 0;
    for (int r = 0; r < size; r++)
        total += (size_t)(r + 1 < (int)counts[0] ? r + 1 : (int)counts[0]);
    CHECK(out.ndim == 1 && out.shape && out.shape[0] == (int64_t)total, "allgather shape");
    if (out.ndim == 1 && out.shape && out.shape[0] == (int64_t)total && out.data) {
        float *go = malloc(total * sizeof(float));
        REQUIRE_OK(cx_cuda_memcpy_async(go, out.data, total * sizeof(float), stream));
        REQUIRE_OK(cx_cuda_stream_sync(stream));
        size_t pos = 0;
        bad = 0;
        for (int r = 0; r < size; r++)
            for (int i = 0; i < r + 1 && i < (int)counts[0]; i++)
                bad += go[pos++] != value(r, (size_t)i);
        CHECK(bad == 0, "allgather: %zu wrong elements", bad);
        free(go);
    }
    cfx_handle_release(ctx, h);

    free(o);
    for (int k = 0; k < NT; k++) {
        cx_cuda_free(dev[k]);
        free(host[k]);
    }
    cx_cuda_stream_destroy(stream);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    if (rank != 0 && !gpu_test_failures)
        return 0;
    return gpu_test_finish(TEST);
}
