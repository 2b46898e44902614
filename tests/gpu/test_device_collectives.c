/*
 * test_device_collectives - device tensors through the public ABI, end to end: the engine's
 * device path (device_exec.c: NCCL with one rank per GPU, else host-staged through MPI) for
 * grouped (fused) allreduce, average with prescale/postscale, a lone large tensor, int16 (which
 * NCCL cannot reduce: host-staged batch), broadcast and allgather (host-staged, host output); the
 * producer's stream ordering (kernels write the gradient on the caller's stream right before the
 * call, with no host wait); a tensor submitted on the CPU by rank 0 and on the GPU by the others
 * (CFX_ERR_MISMATCH on every rank). Results are checked against sums of what every rank
 * contributed, computed here. Runs as one process (local transport: the one-rank NCCL path) or
 * under mpirun (ranks that share one GPU take the host-staged path).
 * Skips (exit 77, with a reason) when no device is usable or CUDA is not built.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conflux/conflux.h"
#include "cuda/cuda_kernels.h"
#include "base/error.h"
#include "gpu_test.h"

static const char *const TEST = "test_device_collectives";

static float value(int rank, size_t i) { return (float)(rank + 1) + (float)(i % 7); }

/* Allreduces the device tensor `t` in place, waits, and copies its `bytes` back into `host`. */
static void allreduce_and_fetch(cfx_context *ctx, const char *name, cfx_tensor *t, double pre,
                                double post, void *host, size_t bytes, void *stream)
{
    cfx_handle hd = 0;
    CHECK_OK(cfx_allreduce_async(ctx, name, t, NULL, CFX_OP_SUM, pre, post, &hd));
    CHECK_OK(cfx_wait(ctx, hd, 120.0));
    cfx_handle_release(ctx, hd);
    REQUIRE_OK(cx_cuda_memcpy_async(host, t->data, bytes, stream));
    REQUIRE_OK(cx_cuda_stream_sync(stream));
}

/* Kernels write the gradient on `stream` right before the call, and the host never waits: the
 * engine must order its reads after them (producer-stream event). 40 scale kernels by 2 and 0.5
 * over 16 Mi floats leave the values unchanged (exact in float32) but take long enough that an
 * engine reading early sees half-scaled values; a last kernel multiplies by 3. */
static void test_producer_stream(cfx_context *ctx, void *stream, int device)
{
    int rank = cfx_rank(ctx), size = cfx_size(ctx);
    const size_t n = (size_t)16 << 20;
    float *h = malloc(n * sizeof *h), *d = NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = value(rank, i);
    REQUIRE_OK(cx_cuda_malloc(n * sizeof *h, (void **)&d));
    REQUIRE_OK(cx_cuda_memcpy_async(d, h, n * sizeof *h, stream));
    REQUIRE_OK(cx_cuda_stream_sync(stream));
    for (int k = 0; k < 40; k++)
        REQUIRE_OK(cx_cuda_scale(d, d, n, CFX_FLOAT32, k % 2 ? 0.5 : 2.0, stream));
    REQUIRE_OK(cx_cuda_scale(d, d, n, CFX_FLOAT32, 3.0, stream));
    int64_t shape = (int64_t)n;
    cfx_tensor t = {d, &shape, 1, CFX_FLOAT32, device, stream};
    allreduce_and_fetch(ctx, "dev.ordered", &t, 1.0, 1.0, h, n * sizeof *h, stream);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < size; r++)
            want += 3.0f * value(r, i);
        bad += h[i] != want;
    }
    CHECK(bad == 0, "producer-stream ordering: %zu of %zu elements wrong (read before the "
          "producer's kernels finished?)", bad, n);
    cx_cuda_free(d);
    free(h);
}

/* A lone tensor (reduced in place on the NCCL path, prescale 0.5 then postscale 4) and an int16
 * batch (NCCL has no int16 reduction: the host-staged path, even when NCCL is up). */
static void test_lone_tensor_and_int16(cfx_context *ctx, void *stream, int device)
{
    int rank = cfx_rank(ctx), size = cfx_size(ctx);
    const size_t n = 3 * 1024 * 1024 + 5;
    float *h = malloc(n * sizeof *h), *d = NULL;
    for (size_t i = 0; i < n; i++)
        h[i] = value(rank, i);
    REQUIRE_OK(cx_cuda_malloc(n * sizeof *h, (void **)&d));
    REQUIRE_OK(cx_cuda_memcpy_async(d, h, n * sizeof *h, stream));
    int64_t shape = (int64_t)n;
    cfx_tensor t = {d, &shape, 1, CFX_FLOAT32, device, stream};
    allreduce_and_fetch(ctx, "dev.lone", &t, 0.5, 4.0, h, n * sizeof *h, stream);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0;
        for (int r = 0; r < size; r++)
            want += 0.5f * value(r, i);
        bad += h[i] != 4.0f * want;
    }
    CHECK(bad == 0, "lone tensor with prescale 0.5, postscale 4: %zu wrong elements", bad);

    enum { NI = 1000 };
    int16_t hi[NI], *di = NULL;
    for (int i = 0; i < NI; i++)
        hi[i] = (int16_t)(rank * 100 + i % 50 - 25);
    REQUIRE_OK(cx_cuda_malloc(sizeof hi, (void **)&di));
    REQUIRE_OK(cx_cuda_memcpy_async(di, hi, sizeof hi, stream));
    int64_t ishape = NI;
    cfx_tensor ti = {di, &ishape, 1, CFX_INT16, device, stream};
    allreduce_and_fetch(ctx, "dev.int16", &ti, 1.0, 1.0, hi, sizeof hi, stream);
    bad = 0;
    for (int i = 0; i < NI; i++) {
        int want = 0;
        for (int r = 0; r < size; r++)
            want += r * 100 + i % 50 - 25;
        bad += hi[i] != (int16_t)want;
    }
    CHECK(bad == 0, "int16 (host-staged) sum: %zu wrong elements", bad);
    cx_cuda_free(di);
    cx_cuda_free(d);
    free(h);
}

/* Rank 0 submits the tensor from host memory, the others from the GPU: every rank gets
 * CFX_ERR_MISMATCH naming the device kinds (needs 2 ranks or more). */
static void test_mixed_kinds(cfx_context *ctx, void *stream, int device)
{
    int rank = cfx_rank(ctx), size = cfx_size(ctx);
    if (size < 2) {
        printf("%s: mixed CPU/GPU submission needs 2 ranks or more: not checked at size 1\n", TEST);
        return;
    }
    float h[16] = {0}, *d = NULL;
    REQUIRE_OK(cx_cuda_malloc(sizeof h, (void **)&d));
    REQUIRE_OK(cx_cuda_memcpy_async(d, h, sizeof h, stream));
    int64_t shape = 16;
    cfx_tensor t = rank == 0 ? (cfx_tensor){h, &shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL}
                             : (cfx_tensor){d, &shape, 1, CFX_FLOAT32, device, stream};
    cfx_handle hd = 0;
    CHECK_OK(cfx_allreduce_async(ctx, "dev.mixed", &t, NULL, CFX_OP_SUM, 1.0, 1.0, &hd));
    cfx_status st = cfx_wait(ctx, hd, 120.0);
    const char *m = cfx_handle_message(ctx, hd);
    CHECK(st == CFX_ERR_MISMATCH, "mixed CPU/GPU submission on rank %d: %s (%s), want "
          "CFX_ERR_MISMATCH", rank, cfx_status_string(st), m ? m : "");
    CHECK(m && strstr(m, "mismatched device") && strstr(m, "CPU") && strstr(m, "CUDA device"),
          "mixed CPU/GPU message on rank %d: %s", rank, m ? m : "(none)");
    cfx_handle_release(ctx, hd);
    REQUIRE_OK(cx_cuda_stream_sync(stream));
    cx_cuda_free(d);
}

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
    REQUIRE_OK(st); /* a CUDA build with a device accepts device tensors */
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
    CHECK(out.device == CFX_DEVICE_CPU, "allgather of a device tensor: output device %d (host "
          "memory expected, docs/gpu.md)", out.device);
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
    test_producer_stream(ctx, stream, t[0].device);
    test_lone_tensor_and_int16(ctx, stream, t[0].device);
    test_mixed_kinds(ctx, stream, t[0].device);
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
