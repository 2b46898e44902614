/*
 * Whole-engine tests on the in-process transport: jobs of 1-8 thread ranks, each with its own
 * context, checked against expectations computed here from what every rank contributed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/reduce.h"
#include "support.h"

/* The elementwise ops (Adasum is not: tests/unit/test_adasum.c, tests/mpi/test_mpi_adasum.c). */
#define ELEMENTWISE_OPS (CFX_OP_PRODUCT + 1)

static const int rank_counts[] = {1, 2, 3, 5, 8};

/* Rank r's value for element i: small integers, so every dtype and every op is exact. */
static double input_value(int r, size_t i, cfx_dtype dtype, cfx_reduce_op op)
{
    if (dtype == CFX_BOOL)
        return (double)((r + i) % 3 != 0);
    if (op == CFX_OP_PRODUCT)
        return (double)((r + i) % 2 + 1);           /* 1 or 2: products stay small */
    int v = (int)((r * 7 + i * 3) % 11);
    if (dtype == CFX_UINT8 || dtype == CFX_UINT16)
        return (double)v;
    return (double)(v - 5);
}

static void store(void *buf, size_t i, cfx_dtype dtype, double v)
{
    switch (dtype) {
    case CFX_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case CFX_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case CFX_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case CFX_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case CFX_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case CFX_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case CFX_FLOAT16: ((uint16_t *)buf)[i] = cx_f32_to_f16((float)v); break;
    case CFX_BFLOAT16: ((uint16_t *)buf)[i] = cx_f32_to_bf16((float)v); break;
    case CFX_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case CFX_FLOAT64: ((double *)buf)[i] = v; break;
    case CFX_BOOL: ((uint8_t *)buf)[i] = v != 0; break;
    }
}

static double load(const void *buf, size_t i, cfx_dtype dtype)
{
    switch (dtype) {
    case CFX_UINT8: return ((const uint8_t *)buf)[i];
    case CFX_INT8: return ((const int8_t *)buf)[i];
    case CFX_UINT16: return ((const uint16_t *)buf)[i];
    case CFX_INT16: return ((const int16_t *)buf)[i];
    case CFX_INT32: return ((const int32_t *)buf)[i];
    case CFX_INT64: return (double)((const int64_t *)buf)[i];
    case CFX_FLOAT16: return cx_f16_to_f32(((const uint16_t *)buf)[i]);
    case CFX_BFLOAT16: return cx_bf16_to_f32(((const uint16_t *)buf)[i]);
    case CFX_FLOAT32: return ((const float *)buf)[i];
    case CFX_FLOAT64: return ((const double *)buf)[i];
    case CFX_BOOL: return ((const uint8_t *)buf)[i];
    }
    return 0;
}

/* The expected result, computed independently of the engine. */
static double expected_value(int size, size_t i, cfx_dtype dtype, cfx_reduce_op op)
{
    double acc = input_value(0, i, dtype, op);
    for (int r = 1; r < size; r++) {
        double v = input_value(r, i, dtype, op);
        switch (op) {
        case CFX_OP_SUM:
        case CFX_OP_AVERAGE: acc = dtype == CFX_BOOL ? (acc || v) : acc + v; break;
        case CFX_OP_MIN: acc = v < acc ? v : acc; break;
        case CFX_OP_MAX: acc = v > acc ? v : acc; break;
        case CFX_OP_PRODUCT: acc = dtype == CFX_BOOL ? (acc && v) : acc * v; break;
        }
    }
    if (op == CFX_OP_AVERAGE) {
        /* Documented (kernels/reduce.h): the sum times 1/size, in float32 for the half types,
         * in double and rounded once for float32 and float64, in double (then truncated toward
         * zero) for integers. */
        double inv = 1.0 / size;
        if (dtype == CFX_FLOAT16 || dtype == CFX_BFLOAT16)
            acc = (double)((float)acc * (float)inv);
        else if (dtype == CFX_FLOAT32)
            acc = (double)(float)((double)(float)acc * inv);
        else if (dtype == CFX_FLOAT64)
            acc = acc * inv;
        else
            acc = (double)(long long)(acc * inv);
    }
    return acc;
}

/* ---- every dtype x op, with several tensors per step so fusion and the cache both run ---- */

#define NTENSORS 6
static const size_t lengths[NTENSORS] = {0, 1, 7, 100, 1000, 70000};

static int dtype_op_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    for (int d = 0; d < CFX_DTYPE_COUNT; d++) {
        for (int o = 0; o < ELEMENTWISE_OPS; o++) {
            cfx_dtype dtype = (cfx_dtype)d;
            cfx_reduce_op op = (cfx_reduce_op)o;
            if (dtype == CFX_BOOL && op == CFX_OP_AVERAGE)
                continue;
            for (int step = 0; step < 2; step++) {
                void *bufs[NTENSORS];
                int64_t shapes[NTENSORS][1];
                cfx_handle hs[NTENSORS];
                /* Submit in a rank-dependent order: the coordinator must still line them up. */
                for (int k = 0; k < NTENSORS; k++) {
                    int t = (k + rank) % NTENSORS;
                    size_t n = lengths[t];
                    bufs[t] = malloc(n * cfx_dtype_size(dtype) + 1);
                    for (size_t i = 0; i < n; i++)
                        store(bufs[t], i, dtype, input_value(rank, i, dtype, op));
                    cfx_tensor tensor = tensor1d(bufs[t], shapes[t], (int64_t)n, dtype);
                    char name[64];
                    snprintf(name, sizeof name, "%s.%s.%d", cfx_dtype_name(dtype), cfx_op_name(op), t);
                    cfx_status st = cfx_allreduce_async(ctx, name, &tensor, NULL, op, 1.0, 1.0, &hs[t]);
                    RANK_CHECK(st == CFX_OK, "enqueue %s: %s", name, cfx_last_error());
                }
                for (int t = 0; t < NTENSORS; t++) {
                    cfx_status st = cfx_wait(ctx, hs[t], 60);
                    RANK_CHECK(st == CFX_OK, "%s %s tensor %d: %s", cfx_dtype_name(dtype),
                               cfx_op_name(op), t, cfx_last_error());
                    cfx_handle_release(ctx, hs[t]);
                    for (size_t i = 0; i < lengths[t]; i++) {
                        double got = load(bufs[t], i, dtype);
                        double want = expected_value(size, i, dtype, op);
                        if (dtype == CFX_FLOAT16 || dtype == CFX_BFLOAT16)
                            want = load((store(bufs[t], i, dtype, want), bufs[t]), i, dtype);
                        RANK_CHECK(got == want, "%s %s size %d tensor %d element %zu: got %g, want %g",
                                   cfx_dtype_name(dtype), cfx_op_name(op), size, t, i, got, want);
                    }
                    free(bufs[t]);
                }
            }
        }
    }
    return 0;
}

static void every_dtype_and_op(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++)
        assert_int_equal(run_ranks(rank_counts[k], dtype_op_rank, NULL, NULL), 0);
}

/* Small fusion threshold and chunk: fused batches split, big tensors chunked. */
static void small_buffers(cx_config *cfg)
{
    cfg->fusion_threshold = 4096;
    cfg->chunk_bytes = 1024;
}

static void dtype_op_small_buffers(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(3, dtype_op_rank, NULL, small_buffers), 0);
}

static void shm_path(cx_config *cfg)
{
    cfg->shm = 1;
    cfg->chunk_bytes = 4096; /* many chunks, both buffers of the double buffering */
}

/* A cache whose agreement words (1 + 2 per 64 entries) exceed the segment's rows: the agreement
 * goes through the transport while the data still takes the segment. */
static void shm_path_big_cache(cx_config *cfg)
{
    shm_path(cfg);
    cfg->cache_capacity = 40000;
}

/* The shared-memory data path with thread ranks (each maps the segment like a process would); the
 * agreement of every cycle goes through the segment too, except with the big cache. */
static void dtype_op_shared_memory(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, dtype_op_rank, NULL, shm_path), 0);
    assert_int_equal(run_ranks(3, dtype_op_rank, NULL, shm_path), 0);
    assert_int_equal(run_ranks(3, dtype_op_rank, NULL, shm_path_big_cache), 0);
}

static void no_cache(cx_config *cfg) { cfg->cache_capacity = 0; }
static void tiny_cache(cx_config *cfg) { cfg->cache_capacity = 3; }

static void dtype_op_without_cache(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, dtype_op_rank, NULL, no_cache), 0);
    assert_int_equal(run_ranks(3, dtype_op_rank, NULL, tiny_cache), 0); /* constant eviction */
}

/* ---- prescale, postscale, out of place ---- */

static int scaled_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    double in[5], out[5];
    for (int i = 0; i < 5; i++)
        in[i] = rank + i;
    int64_t shape[1];
    cfx_tensor t = tensor1d(in, shape, 5, CFX_FLOAT64);
    cfx_handle h;
    RANK_CHECK(cfx_allreduce_async(ctx, "scaled", &t, out, CFX_OP_AVERAGE, 2.0, 3.0, &h) == CFX_OK,
               "%s", cfx_last_error());
    RANK_CHECK(cfx_wait(ctx, h, 60) == CFX_OK, "%s", cfx_last_error());
    cfx_handle_release(ctx, h);
    for (int i = 0; i < 5; i++) {
        double sum = 0;
        for (int r = 0; r < size; r++)
            sum += 2.0 * (r + i);
        RANK_CHECK(out[i] == 3.0 * sum / size, "element %d: %g vs %g", i, out[i], 3.0 * sum / size);
        RANK_CHECK(in[i] == rank + i, "input %d modified", i);
    }
    return 0;
}

static void scale_factors_out_of_place(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(3, scaled_rank, NULL, NULL), 0);
}

/* ---- mismatch: every rank gets the error naming the tensor and both values ---- */

static int mismatch_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    float f[4] = {1, 2, 3, 4};
    int32_t i4[4] = {1, 2, 3, 4};
    int64_t shape[1];
    cfx_tensor t = rank == 1 ? tensor1d(i4, shape, 4, CFX_INT32) : tensor1d(f, shape, 4, CFX_FLOAT32);
    cfx_status st = allreduce_wait(ctx, "grad.bad", &t, CFX_OP_SUM);
    RANK_CHECK(st == CFX_ERR_MISMATCH, "status %d: %s", st, cfx_last_error());
    const char *msg = cfx_last_error();
    RANK_CHECK(strstr(msg, "grad.bad") && strstr(msg, "float32") && strstr(msg, "int32") &&
                   strstr(msg, "rank 1"), "message: %s", msg);
    /* Shapes, then ops. */
    cfx_tensor s = tensor1d(f, shape, rank == 0 ? 3 : 4, CFX_FLOAT32);
    st = allreduce_wait(ctx, "grad.shape", &s, CFX_OP_SUM);
    RANK_CHECK(st == CFX_ERR_MISMATCH && strstr(cfx_last_error(), "[3]") &&
                   strstr(cfx_last_error(), "[4]"), "shape: %d %s", st, cfx_last_error());
    cfx_tensor o = tensor1d(f, shape, 4, CFX_FLOAT32);
    st = allreduce_wait(ctx, "grad.op", &o, rank == 0 ? CFX_OP_MAX : CFX_OP_SUM);
    RANK_CHECK(st == CFX_ERR_MISMATCH && strstr(cfx_last_error(), "max"), "op: %d %s", st,
               cfx_last_error());
    /* The job goes on. */
    float g[2] = {(float)rank, 1};
    cfx_tensor ok = tensor1d(g, shape, 2, CFX_FLOAT32);
    st = allreduce_wait(ctx, "grad.good", &ok, CFX_OP_SUM);
    RANK_CHECK(st == CFX_OK && g[1] == (float)size, "after mismatch: %d %s", st, cfx_last_error());
    return 0;
}

static void mismatch_errors(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, mismatch_rank, NULL, NULL), 0);
    assert_int_equal(run_ranks(4, mismatch_rank, NULL, NULL), 0);
}

/* ---- cache invalidation: same name, new shape on every rank / on one rank ---- */

static int reshape_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    float buf[16];
    int64_t shape[1];
    for (int n = 4; n <= 16; n += 4) {
        for (int rep = 0; rep < 3; rep++) {
            for (int i = 0; i < n; i++)
                buf[i] = (float)(rank + i);
            cfx_tensor t = tensor1d(buf, shape, n, CFX_FLOAT32);
            RANK_CHECK(allreduce_wait(ctx, "reshaped", &t, CFX_OP_SUM) == CFX_OK, "%s", cfx_last_error());
            for (int i = 0; i < n; i++)
                RANK_CHECK(buf[i] == (float)(size * i + size * (size - 1) / 2), "n %d elem %d", n, i);
        }
    }
    /* Only rank 0 changes: a mismatch, found although the other ranks hit the cache. */
    for (int i = 0; i < 16; i++)
        buf[i] = 1;
    cfx_tensor t = tensor1d(buf, shape, rank == 0 ? 8 : 16, CFX_FLOAT32);
    cfx_status st = allreduce_wait(ctx, "reshaped", &t, CFX_OP_SUM);
    RANK_CHECK(size == 1 ? st == CFX_OK : st == CFX_ERR_MISMATCH, "status %d %s", st, cfx_last_error());
    return 0;
}

static void cache_invalidation(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++)
        assert_int_equal(run_ranks(rank_counts[k], reshape_rank, NULL, NULL), 0);
}

/* ---- local argument errors ---- */

static int bad_args_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    float f[4] = {0};
    int64_t shape[2] = {4, 1};
    cfx_tensor t = {f, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h;
    RANK_CHECK(cfx_allreduce_async(NULL, "x", &t, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_NOT_INITIALIZED, "null ctx");
    RANK_CHECK(cfx_allreduce_async(ctx, "x", NULL, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT, "null tensor");
    RANK_CHECK(cfx_allreduce_async(ctx, "x", &t, NULL, CFX_OP_SUM, 1, 1, NULL) == CFX_ERR_INVALID_ARGUMENT, "null out");
    RANK_CHECK(cfx_allreduce_async(ctx, "x", &t, NULL, (cfx_reduce_op)9, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT &&
                   strstr(cfx_last_error(), "op 9"), "bad op: %s", cfx_last_error());
    RANK_CHECK(cfx_allreduce_async(ctx, "", &t, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT, "empty name");
    cfx_tensor bad = t;
    bad.dtype = 42;
    RANK_CHECK(cfx_allreduce_async(ctx, "x", &bad, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT &&
                   strstr(cfx_last_error(), "dtype 42"), "bad dtype: %s", cfx_last_error());
    bad = t;
    bad.ndim = 33;
    RANK_CHECK(cfx_allreduce_async(ctx, "x", &bad, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT, "ndim");
    int64_t neg[1] = {-3};
    bad = t;
    bad.shape = neg;
    RANK_CHECK(cfx_allreduce_async(ctx, "x", &bad, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT &&
                   strstr(cfx_last_error(), "-3"), "negative: %s", cfx_last_error());
    int64_t huge[2] = {INT64_MAX / 2, 16};
    bad = t;
    bad.shape = huge;
    bad.ndim = 2;
    RANK_CHECK(cfx_allreduce_async(ctx, "x", &bad, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT &&
                   strstr(cfx_last_error(), "overflow"), "overflow: %s", cfx_last_error());
    bad = t;
    bad.data = NULL;
    RANK_CHECK(cfx_allreduce_async(ctx, "x", &bad, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT, "null data");
    bad = t;
    bad.dtype = CFX_BOOL;
    RANK_CHECK(cfx_allreduce_async(ctx, "x", &bad, NULL, CFX_OP_AVERAGE, 1, 1, &h) == CFX_ERR_INVALID_ARGUMENT, "bool avg");
    RANK_CHECK(cfx_broadcast_async(ctx, "b", &t, 99, &h) == CFX_ERR_INVALID_ARGUMENT &&
                   strstr(cfx_last_error(), "99"), "root: %s", cfx_last_error());
    int64_t splits[1] = {4};
    RANK_CHECK(cfx_alltoall_async(ctx, "a", &t, splits, 1, &h) == (size == 1 ? CFX_OK : CFX_ERR_INVALID_ARGUMENT),
               "splits: %s", cfx_last_error());
    if (size == 1) {
        RANK_CHECK(cfx_wait(ctx, h, 10) == CFX_OK, "alltoall size 1: %s", cfx_last_error());
        cfx_handle_release(ctx, h);
    }
    /* Handles: stale, twice released, never issued. */
    RANK_CHECK(cfx_wait(ctx, 0, 0) == CFX_ERR_STALE_HANDLE, "handle 0");
    RANK_CHECK(cfx_wait(ctx, 0xdeadbeef12ull, 0) == CFX_ERR_STALE_HANDLE, "random handle");
    /* A second in-flight tensor of the same name is refused at the call. The last rank submits
     * only after a barrier, so the first "h" is certainly still in flight elsewhere. */
    bool holder = size == 1 || rank != size - 1;
    if (!holder) {
        cfx_handle b;
        RANK_CHECK(cfx_barrier_async(ctx, &b) == CFX_OK && cfx_wait(ctx, b, 60) == CFX_OK, "barrier");
        cfx_handle_release(ctx, b);
    }
    RANK_CHECK(cfx_allreduce_async(ctx, "h", &t, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_OK, "%s", cfx_last_error());
    if (holder && size > 1) {
        cfx_handle h2;
        cfx_status dup = cfx_allreduce_async(ctx, "h", &t, NULL, CFX_OP_SUM, 1, 1, &h2);
        RANK_CHECK(dup == CFX_ERR_DUPLICATE_NAME && strstr(cfx_last_error(), "'h'"), "dup: %d %s",
                   dup, cfx_last_error());
        cfx_handle b;
        RANK_CHECK(cfx_barrier_async(ctx, &b) == CFX_OK && cfx_wait(ctx, b, 60) == CFX_OK, "barrier");
        cfx_handle_release(ctx, b);
    }
    RANK_CHECK(cfx_wait(ctx, h, 60) == CFX_OK, "%s", cfx_last_error());
    RANK_CHECK(cfx_handle_release(ctx, h) == CFX_OK, "release");
    RANK_CHECK(cfx_handle_release(ctx, h) == CFX_ERR_STALE_HANDLE, "second release");
    RANK_CHECK(cfx_handle_status(ctx, h) == CFX_ERR_STALE_HANDLE, "status after release");
    RANK_CHECK(cfx_handle_message(ctx, h) == NULL, "message after release");
    return 0;
}

static void local_argument_errors(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(1, bad_args_rank, NULL, NULL), 0);
    assert_int_equal(run_ranks(3, bad_args_rank, NULL, NULL), 0);
}

/* ---- wait timeout, then completion once the other ranks submit ---- */

static int timeout_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    float v[3] = {1, 1, 1};
    int64_t shape[1];
    cfx_tensor t = tensor1d(v, shape, 3, CFX_FLOAT32);
    cfx_handle h;
    if (rank == 0) {
        RANK_CHECK(cfx_allreduce_async(ctx, "late", &t, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_OK, "%s", cfx_last_error());
        RANK_CHECK(cfx_wait(ctx, h, 0.05) == CFX_ERR_TIMEOUT, "expected a timeout");
        int done = 1;
        RANK_CHECK(cfx_poll(ctx, h, &done) == CFX_OK && done == 0, "poll");
        RANK_CHECK(cfx_handle_status(ctx, h) == CFX_ERR_IN_PROGRESS, "status");
    }
    /* Everyone meets at a barrier after rank 0's timeout; then the others submit. */
    cfx_handle b;
    RANK_CHECK(cfx_barrier_async(ctx, &b) == CFX_OK && cfx_wait(ctx, b, 60) == CFX_OK, "barrier %s", cfx_last_error());
    cfx_handle_release(ctx, b);
    if (rank != 0)
        RANK_CHECK(cfx_allreduce_async(ctx, "late", &t, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_OK, "%s", cfx_last_error());
    RANK_CHECK(cfx_wait(ctx, h, 60) == CFX_OK && v[2] == (float)size, "late: %s", cfx_last_error());
    cfx_handle_release(ctx, h);
    return 0;
}

static void wait_timeout(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(3, timeout_rank, NULL, NULL), 0);
}

/* ---- shutdown while another rank waits ---- */

static int shutdown_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    (void)size;
    float v[2] = {1, 2};
    int64_t shape[1];
    cfx_tensor t = tensor1d(v, shape, 2, CFX_FLOAT32);
    if (rank == 1) {
        usleep(50000);
        RANK_CHECK(cfx_shutdown(ctx) == CFX_OK, "shutdown");
        cfx_handle h;
        RANK_CHECK(cfx_allreduce_async(ctx, "after", &t, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_ERR_SHUT_DOWN,
                   "enqueue after shutdown");
        return 0;
    }
    cfx_handle h;
    RANK_CHECK(cfx_allreduce_async(ctx, "never", &t, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_OK, "%s", cfx_last_error());
    cfx_status st = cfx_wait(ctx, h, 30);
    RANK_CHECK(st == CFX_ERR_SHUT_DOWN && strstr(cfx_last_error(), "never") &&
                   strstr(cfx_last_error(), "[1]"), "got %d: %s", st, cfx_last_error());
    RANK_CHECK(!cfx_is_running(ctx), "context still running");
    return 0;
}

static void shutdown_while_waiting(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, shutdown_rank, NULL, NULL), 0);
    assert_int_equal(run_ranks(3, shutdown_rank, NULL, NULL), 0);
}

/* ---- stall: a tensor one rank never submits fails at the deadline, naming that rank ---- */

static void quick_stall(cx_config *cfg)
{
    cfg->stall_warning_s = 0.3;
    cfg->stall_timeout_s = 1.0;
}

static int stall_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    float v[2] = {1, 2};
    int64_t shape[1];
    cfx_tensor t = tensor1d(v, shape, 2, CFX_FLOAT32);
    /* Twice: once uncached, once after the name entered the cache. */
    for (int round = 0; round < 2; round++) {
        char name[32];
        snprintf(name, sizeof name, "stall.%d", round);
        if (round == 1) {
            RANK_CHECK(allreduce_wait(ctx, name, &t, CFX_OP_SUM) == CFX_OK, "warm-up: %s", cfx_last_error());
        }
        cfx_handle h = 0;
        if (rank != size - 1)
            RANK_CHECK(cfx_allreduce_async(ctx, name, &t, NULL, CFX_OP_SUM, 1, 1, &h) == CFX_OK, "%s", cfx_last_error());
        if (rank != size - 1) {
            cfx_status st = cfx_wait(ctx, h, 30);
            char missing[32];
            snprintf(missing, sizeof missing, "[%d]", size - 1);
            RANK_CHECK(st == CFX_ERR_STALL && strstr(cfx_last_error(), name) &&
                           strstr(cfx_last_error(), missing), "round %d: %d %s", round, st, cfx_last_error());
            cfx_handle_release(ctx, h);
        } else {
            usleep(1500000); /* past the others' deadline, so only the missing tensor stalls */
        }
        cfx_handle b;
        RANK_CHECK(cfx_barrier_async(ctx, &b) == CFX_OK && cfx_wait(ctx, b, 60) == CFX_OK, "barrier");
        cfx_handle_release(ctx, b);
    }
    return 0;
}

static void stall_deadline(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(3, stall_rank, NULL, quick_stall), 0);
}

/* ---- deterministic mode: bitwise the same whatever the fusion threshold and order ---- */

typedef struct det_arg {
    uint32_t result[3][5000];
    int variant;
} det_arg;

static void det_small(cx_config *cfg) { cfg->deterministic = 1; cfg->fusion_threshold = 2048; cfg->chunk_bytes = 512; }
static void det_large(cx_config *cfg) { cfg->deterministic = 1; cfg->fusion_threshold = 1 << 20; cfg->chunk_bytes = 1 << 16; }
static void det_shm(cx_config *cfg) { det_small(cfg); cfg->shm = 1; }

static int det_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)size;
    det_arg *a = arg;
    float *bufs[8];
    cfx_handle hs[8];
    int64_t shapes[8][1];
    for (int k = 0; k < 8; k++) {
        int t = a->variant == 1 ? 7 - k : k;
        bufs[t] = malloc(625 * sizeof(float));
        for (int i = 0; i < 625; i++)
            bufs[t][i] = 1.0f / (float)(1 + rank * 131 + i * 7 + t) + (float)rank * 1e-3f;
        cfx_tensor tensor = tensor1d(bufs[t], shapes[t], 625, CFX_FLOAT32);
        char name[16];
        snprintf(name, sizeof name, "det.%d", t);
        RANK_CHECK(cfx_allreduce_async(ctx, name, &tensor, NULL, CFX_OP_SUM, 1, 1, &hs[t]) == CFX_OK, "%s", cfx_last_error());
    }
    for (int t = 0; t < 8; t++) {
        RANK_CHECK(cfx_wait(ctx, hs[t], 60) == CFX_OK, "%s", cfx_last_error());
        cfx_handle_release(ctx, hs[t]);
        if (rank == 0)
            memcpy(&a->result[a->variant][t * 625], bufs[t], 625 * sizeof(float));
        free(bufs[t]);
    }
    return 0;
}

static void deterministic_mode(void **state)
{
    (void)state;
    det_arg *a = calloc(1, sizeof *a);
    a->variant = 0;
    assert_int_equal(run_ranks(5, det_rank, a, det_small), 0);
    a->variant = 1;
    assert_int_equal(run_ranks(5, det_rank, a, det_large), 0);
    assert_memory_equal(a->result[0], a->result[1], sizeof a->result[0]);
    a->variant = 2; /* the shared-memory path keeps the guarantee */
    assert_int_equal(run_ranks(5, det_rank, a, det_shm), 0);
    assert_memory_equal(a->result[0], a->result[2], sizeof a->result[0]);
    free(a);
}

/* ---- allgather, alone and fused: rows differ per rank (zero too), dtypes differ per tensor ---- */

static int allgather_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    enum { N = 5 };
    int64_t shapes[N][2];
    cfx_tensor ts[N];
    void *bufs[N];
    for (int i = 0; i < N; i++) {
        cfx_dtype dtype = i % 2 ? CFX_INT16 : CFX_FLOAT64;
        int64_t rows = (rank + i) % 3; /* 0, 1 or 2 rows */
        shapes[i][0] = rows;
        shapes[i][1] = i + 1;
        bufs[i] = malloc((size_t)(rows * (i + 1)) * cfx_dtype_size(dtype) + 1);
        for (int64_t k = 0; k < rows * (i + 1); k++)
            store(bufs[i], (size_t)k, dtype, (double)(rank * 100 + i * 10 + k));
        ts[i] = (cfx_tensor){bufs[i], shapes[i], 2, (int32_t)dtype, CFX_DEVICE_CPU, NULL};
    }
    cfx_handle h;
    RANK_CHECK(cfx_grouped_allgather_async(ctx, "gather", N, ts, &h) == CFX_OK, "%s", cfx_last_error());
    RANK_CHECK(cfx_wait(ctx, h, 60) == CFX_OK, "%s", cfx_last_error());
    for (int i = 0; i < N; i++) {
        cfx_tensor out;
        const int64_t *splits;
        RANK_CHECK(cfx_handle_output(ctx, h, (size_t)i, &out) == CFX_OK, "%s", cfx_last_error());
        RANK_CHECK(cfx_handle_splits(ctx, h, (size_t)i, &splits) == CFX_OK, "%s", cfx_last_error());
        int64_t total = 0;
        size_t k = 0;
        for (int r = 0; r < size; r++) {
            int64_t rows = (r + i) % 3;
            RANK_CHECK(splits[r] == rows, "tensor %d rank %d: %lld rows, want %lld", i, r,
                       (long long)splits[r], (long long)rows);
            for (int64_t e = 0; e < rows * (i + 1); e++, k++) {
                double got = load(out.data, k, (cfx_dtype)out.dtype);
                RANK_CHECK(got == (double)(r * 100 + i * 10 + e), "tensor %d from rank %d element %lld: %g",
                           i, r, (long long)e, got);
            }
            total += rows;
        }
        RANK_CHECK(out.ndim == 2 && out.shape[0] == total && out.shape[1] == i + 1, "shape of %d", i);
        free(bufs[i]);
    }
    cfx_handle_release(ctx, h);
    return 0;
}

static void allgather_fused_and_alone(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof rank_counts / sizeof *rank_counts; k++)
        assert_int_equal(run_ranks(rank_counts[k], allgather_rank, NULL, NULL), 0);
    assert_int_equal(run_ranks(3, allgather_rank, NULL, small_buffers), 0); /* some unfused */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_dtype_and_op),
        cmocka_unit_test(dtype_op_small_buffers),
        cmocka_unit_test(dtype_op_without_cache),
        cmocka_unit_test(dtype_op_shared_memory),
        cmocka_unit_test(scale_factors_out_of_place),
        cmocka_unit_test(allgather_fused_and_alone),
        cmocka_unit_test(mismatch_errors),
        cmocka_unit_test(cache_invalidation),
        cmocka_unit_test(local_argument_errors),
        cmocka_unit_test(wait_timeout),
        cmocka_unit_test(shutdown_while_waiting),
        cmocka_unit_test(stall_deadline),
        cmocka_unit_test(deterministic_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
