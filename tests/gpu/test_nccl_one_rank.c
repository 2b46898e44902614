/*
 * test_nccl_one_rank - the NCCL data plane on one rank and one GPU: communicator set-up from a
 * unique id, every collective on device memory (results against host references), the fused
 * device path the engine uses (pack with prescale -> ncclAllReduce -> unpack with postscale), the
 * dtype/op mapping, and the error paths (bad root, a dtype NCCL lacks, no device).
 * The mapping and the no-device behaviour are checked everywhere; without a usable device the test
 * then prints "skipped: no CUDA device (...)" and exits 77.
 */
#include <nccl.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_kernels.h"
#include "base/error.h"
#include "gpu_test.h"
#include "cuda/nccl_transport.h"
#include "kernels/reduce.h"

static const char *const TEST = "test_nccl_one_rank";

/* ncclBfloat16 is 9 from NCCL 2.10; before 2.19 nccl.h declares it only for CUDA compilers. */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
#define WANT_BF16 9
#else
#define WANT_BF16 (-1)
#endif

static int is_float(int dt)
{
    return dt == CFX_FLOAT16 || dt == CFX_BFLOAT16 || dt == CFX_FLOAT32 || dt == CFX_FLOAT64;
}

static void test_mapping(void)
{
    static const int dtypes[CFX_DTYPE_COUNT] = {
        [CFX_UINT8] = ncclUint8,     [CFX_INT8] = ncclInt8,       [CFX_UINT16] = -1,
        [CFX_INT16] = -1,            [CFX_INT32] = ncclInt32,     [CFX_INT64] = ncclInt64,
        [CFX_FLOAT16] = ncclFloat16, [CFX_BFLOAT16] = WANT_BF16,  [CFX_FLOAT32] = ncclFloat32,
        [CFX_FLOAT64] = ncclFloat64, [CFX_BOOL] = ncclUint8};
    /* sum, average, min, max, product; later ops are not one NCCL reduction */
    static const int ops[] = {ncclSum, ncclSum, ncclMin, ncclMax, ncclProd};
    static const int bool_ops[] = {ncclMax, ncclMax, ncclMin, ncclMax, ncclMin};
    const int nops = (int)(sizeof ops / sizeof ops[0]);
    for (int dt = 0; dt < CFX_DTYPE_COUNT; dt++) {
        for (int op = 0; op < CFX_OP_COUNT; op++) {
            int nd = -7, no = -7;
            cfx_status st = cx_nccl_map((cfx_dtype)dt, (cfx_reduce_op)op, &nd, &no);
            if (dtypes[dt] < 0 || op >= nops) {
                CHECK(st == CFX_ERR_UNSUPPORTED && nd == -7, "%s mapped", cfx_dtype_name((cfx_dtype)dt));
                CHECK(!cx_nccl_reducible((cfx_dtype)dt, (cfx_reduce_op)op), "%s reducible",
                      cfx_dtype_name((cfx_dtype)dt));
                continue;
            }
            int want_op = dt == CFX_BOOL ? bool_ops[op] : ops[op];
            CHECK(st == CFX_OK && nd == dtypes[dt] && no == want_op, "%s/%s -> %d/%d (status %d), "
                  "want %d/%d", cfx_dtype_name((cfx_dtype)dt), cfx_op_name((cfx_reduce_op)op), nd, no,
                  (int)st, dtypes[dt], want_op);
            /* float min/max: NCCL drops NaN, reduce.c propagates it; the engine stages them */
            bool want = !(is_float(dt) && (op == CFX_OP_MIN || op == CFX_OP_MAX));
            CHECK(cx_nccl_reducible((cfx_dtype)dt, (cfx_reduce_op)op) == want, "%s/%s: reducible "
                  "%d, want %d", cfx_dtype_name((cfx_dtype)dt), cfx_op_name((cfx_reduce_op)op),
                  (int)cx_nccl_reducible((cfx_dtype)dt, (cfx_reduce_op)op), (int)want);
        }
    }
    int nd, no;
    CHECK(cx_nccl_map((cfx_dtype)11, CFX_OP_SUM, &nd, &no) == CFX_ERR_INVALID_ARGUMENT, "dtype 11");
    CHECK(cx_nccl_map(CFX_FLOAT32, (cfx_reduce_op)CFX_OP_COUNT, &nd, &no) == CFX_ERR_INVALID_ARGUMENT,
          "op %d", CFX_OP_COUNT);
}

static void *dev_from(const void *h, size_t bytes)
{
    void *d = NULL;
    REQUIRE_OK(cx_cuda_malloc(bytes, &d));
    REQUIRE_OK(cx_cuda_memcpy_async(d, h, bytes, NULL));
    REQUIRE_OK(cx_cuda_stream_sync(NULL));
    return d;
}

static void back(void *h, const void *d, size_t bytes, cx_nccl *c)
{
    REQUIRE_OK(cx_nccl_wait(c, 60.0));
    REQUIRE_OK(cx_cuda_memcpy_async(h, d, bytes, cx_nccl_stream(c)));
    REQUIRE_OK(cx_cuda_stream_sync(cx_nccl_stream(c)));
}

static size_t mismatches(const float *a, const float *b, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
    return bad;
}

static void test_collectives(cx_nccl *c)
{
    const size_t n = (1 << 20) + 3;
    float *h = malloc(n * sizeof *h), *o = malloc(n * sizeof *o), *ref = malloc(n * sizeof *ref);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)(i % 1000) * 0.5f - 100.0f;
    float *d = dev_from(h, n * sizeof *h);
    float *d2 = NULL;
    REQUIRE_OK(cx_cuda_malloc(n * sizeof *d2, (void **)&d2));

    /* allreduce, out of place and in place; one rank: the input itself */
    CHECK_OK(cx_nccl_allreduce(c, d, d2, n, CFX_FLOAT32, CFX_OP_SUM));
    back(o, d2, n * sizeof *o, c);
    CHECK(mismatches(o, h, n) == 0, "allreduce out of place");
    CHECK_OK(cx_nccl_allreduce(c, d, d, n, CFX_FLOAT32, CFX_OP_MAX));
    back(o, d, n * sizeof *o, c);
    CHECK(mismatches(o, h, n) == 0, "allreduce in place");

    /* the engine's fused path: 3 tensors, prescale 0.5, allreduce, postscale 4 / size */
    size_t counts[3] = {1000, 1, n - 1001};
    cx_cuda_tensor t[3];
    uint64_t off = 0;
    for (int i = 0; i < 3; i++) {
        t[i].input = d + off;
        t[i].output = d2 + off;
        t[i].offset = off;
        t[i].count = counts[i];
        off += counts[i];
    }
    void *fusion = NULL;
    REQUIRE_OK(cx_cuda_malloc(n * sizeof(float), &fusion));
    cx_cuda_batch *b = NULL;
    REQUIRE_OK(cx_cuda_batch_create(&b));
    void *s = cx_nccl_stream(c);
    CHECK_OK(cx_cuda_batch_set(b, t, 3, CFX_FLOAT32, s));
    CHECK_OK(cx_cuda_batch_pack(b, fusion, 0.5, s));
    CHECK_OK(cx_nccl_allreduce(c, fusion, fusion, n, CFX_FLOAT32, CFX_OP_AVERAGE));
    CHECK_OK(cx_cuda_batch_unpack(b, fusion, 4.0 / cx_nccl_size(c), s));
    back(o, d2, n * sizeof *o, c);
    cx_scale_copy(ref, h, n, CFX_FLOAT32, 0.5);
    cx_scale(ref, n, CFX_FLOAT32, 4.0);
    CHECK(mismatches(o, ref, n) == 0, "fused pack -> allreduce -> unpack");
    cx_cuda_batch_destroy(b);
    cx_cuda_free(fusion);

    /* allgather (equal), broadcast, alltoall (self), reducescatter */
    size_t bytes = n * sizeof(float), displ = 0;
    CHECK_OK(cx_nccl_allgatherv(c, d, bytes, d2, &bytes, &displ));
    back(o, d2, bytes, c);
    CHECK(mismatches(o, h, n) == 0, "allgather");
    CHECK_OK(cx_nccl_broadcast(c, d, bytes, 0));
    back(o, d, bytes, c);
    CHECK(mismatches(o, h, n) == 0, "broadcast");
    CHECK_OK(cx_nccl_alltoallv(c, d, &bytes, &displ, d2, &bytes, &displ));
    back(o, d2, bytes, c);
    CHECK(mismatches(o, h, n) == 0, "alltoall");
    size_t cnt = n;
    CHECK_OK(cx_nccl_reduce_scatter(c, d, d2, &cnt, CFX_FLOAT32, CFX_OP_SUM));
    back(o, d2, bytes, c);
    CHECK(mismatches(o, h, n) == 0, "reducescatter");

    /* bool: pack normalises to 0/1, so NCCL's max is the host's or */
    unsigned char hb[64], ob[64];
    for (int i = 0; i < 64; i++)
        hb[i] = (unsigned char)(i % 3 == 0 ? 0 : i * 5);
    unsigned char *db = dev_from(hb, sizeof hb), *fb = NULL;
    REQUIRE_OK(cx_cuda_malloc(sizeof hb, (void **)&fb));
    cx_cuda_tensor tb = {db, db, 0, sizeof hb};
    REQUIRE_OK(cx_cuda_batch_create(&b));
    CHECK_OK(cx_cuda_batch_set(b, &tb, 1, CFX_BOOL, s));
    CHECK_OK(cx_cuda_batch_pack(b, fb, 1.0, s));
    CHECK_OK(cx_nccl_allreduce(c, fb, fb, sizeof hb, CFX_BOOL, CFX_OP_SUM));
    CHECK_OK(cx_cuda_batch_unpack(b, fb, 1.0, s));
    back(ob, db, sizeof ob, c);
    int badb = 0;
    for (int i = 0; i < 64; i++)
        badb += ob[i] != (hb[i] != 0);
    CHECK(badb == 0, "bool allreduce: %d wrong", badb);
    cx_cuda_batch_destroy(b);
    cx_cuda_free(db);
    cx_cuda_free(fb);

    /* errors that leave the communicator usable */
    CHECK(cx_nccl_broadcast(c, d, bytes, 1) == CFX_ERR_INVALID_ARGUMENT, "root 1 of 1 accepted");
    CHECK(cx_nccl_allreduce(c, d, d, 4, CFX_INT16, CFX_OP_SUM) == CFX_ERR_UNSUPPORTED, "int16 reduced");
    CHECK(!cx_nccl_failed(c), "the communicator was poisoned by a local argument error");
    CHECK_OK(cx_nccl_check(c));
    CHECK_OK(cx_nccl_wait(c, 60.0));

    cx_cuda_free(d);
    cx_cuda_free(d2);
    free(h);
    free(o);
    free(ref);
}

int main(void)
{
    test_mapping();
    CHECK(cx_nccl_version() >= 20000, "NCCL version %d", cx_nccl_version());
    unsigned char id[CX_NCCL_ID_BYTES];
    CHECK_OK(cx_nccl_get_unique_id(id));
    cx_nccl_comm_destroy(NULL);

    if (cx_cuda_probe() != CFX_OK) {
        char reason[CX_ERROR_MAX];
        snprintf(reason, sizeof reason, "%s", cx_error_message());
        /* Without a device the set-up must fail cleanly with a message, not crash or hang. */
        cx_nccl *c = (cx_nccl *)&id; /* any non-NULL value: it must be reset */
        CHECK(cx_nccl_comm_create(0, 1, id, 0, NULL, 0.0, &c) == CFX_ERR_INVALID_ARGUMENT && !c,
              "a set-up without a deadline was accepted");
        c = (cx_nccl *)&id;
        cfx_status st = cx_nccl_comm_create(0, 1, id, 0, NULL, 10.0, &c);
        CHECK((st == CFX_ERR_CUDA || st == CFX_ERR_NCCL) && c == NULL && cx_error_message()[0],
              "communicator without a device: status %d, message '%s'", (int)st, cx_error_message());
        if (gpu_test_failures)
            return gpu_test_finish(TEST);
        return gpu_test_skip(TEST, reason);
    }
    cx_nccl *c = NULL;
    void *stream = NULL;
    REQUIRE_OK(cx_cuda_set_device(0));
    REQUIRE_OK(cx_cuda_stream_create(&stream));
    REQUIRE_OK(cx_nccl_comm_create(0, 1, id, 0, stream, 60.0, &c));
    CHECK(cx_nccl_rank(c) == 0 && cx_nccl_size(c) == 1 && cx_nccl_device(c) == 0 &&
          cx_nccl_stream(c) == stream, "topology");
    test_collectives(c);
    /* An aborted communicator refuses work at once and is still destroyed cleanly. */
    cx_nccl_abort(c);
    CHECK(cx_nccl_failed(c), "an aborted communicator does not say so");
    CHECK(cx_nccl_broadcast(c, stream, 4, 0) == CFX_ERR_NCCL, "an aborted communicator took work");
    cx_nccl_comm_destroy(c);
    /* A second communicator on the same stream after the abort: set-up still works. */
    REQUIRE_OK(cx_nccl_get_unique_id(id));
    REQUIRE_OK(cx_nccl_comm_create(0, 1, id, 0, stream, 60.0, &c));
    CHECK(!cx_nccl_failed(c), "a fresh communicator says it failed");
    cx_nccl_comm_destroy(c);
    cx_cuda_stream_destroy(stream);
    return gpu_test_finish(TEST);
}
