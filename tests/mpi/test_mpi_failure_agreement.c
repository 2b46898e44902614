/*
 * Failure agreement under mpirun: a rank whose local work fails before a collective (injected with
 * CFX_TEST_FAIL=RANKS:PREFIX, which fails that rank's ready agreement for batches whose first
 * tensor starts with PREFIX) must neither make its peers wait for it nor let them finish with a
 * wrong result. Every rank fails the batch with the same status and a message naming the failing
 * rank; no rank enters the collective (in-place tensors keep their inputs everywhere); the next
 * collectives pair up and give the right sums. Allreduce alone, fused, repeated (cache hits) and
 * over several chunks; broadcast, allgather (also fused), alltoall and reducescatter; two failing
 * ranks at once. Run with the shared-memory path, the MPI path and the deterministic ordered path.
 */
#include <stdlib.h>
#include <string.h>

#include "mpitest.h"

static float val(int rank, size_t i) { return (float)(rank + 1) + (float)(i % 5); }

static float sum_over_ranks(size_t i)
{
    float s = 0;
    for (int r = 0; r < mt_size; r++)
        s += val(r, i);
    return s;
}

/* Opens a context whose ranks `ranks` (e.g. "1" or "0,3") fail batches starting with "fail.". */
static cfx_context *open_failing(const char *ranks)
{
    char v[64];
    snprintf(v, sizeof v, "%s:fail.", ranks);
    setenv("CFX_TEST_FAIL", v, 1);
    cfx_context *ctx = mt_open();
    unsetenv("CFX_TEST_FAIL");
    return ctx;
}

/* The handle failed on this rank with the injected status, naming the failing rank and tensor. */
static void expect_agreed(cfx_context *ctx, cfx_handle h, const char *tensor, int failing,
                          const char *also)
{
    cfx_status st = mt_wait(ctx, h);
    const char *m = cfx_handle_message(ctx, h);
    char want[96], injected[64];
    snprintf(want, sizeof want, "rank %d could not take part", failing);
    snprintf(injected, sizeof injected, "injected failure on rank %d", failing);
    CHECK(st == CFX_ERR_OUT_OF_MEMORY, "%s: status %s (%s), want the failing rank's "
          "CFX_ERR_OUT_OF_MEMORY on every rank", tensor, cfx_status_string(st), m ? m : "");
    CHECK(m && strstr(m, want) && strstr(m, injected) && strstr(m, tensor),
          "%s: message does not name the tensor and rank %d: %s", tensor, failing, m ? m : "(none)");
    CHECK(!also || (m && strstr(m, also)), "%s: message lacks '%s': %s", tensor, also,
          m ? m : "(none)");
    CHECK_OK(cfx_handle_release(ctx, h));
}

static void fill(float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = val(mt_rank, i);
}

static size_t wrong_sums(const float *v, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += v[i] != sum_over_ranks(i);
    return bad;
}

static size_t changed(const float *v, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += v[i] != val(mt_rank, i);
    return bad;
}

/* One in-place allreduce of v (n elements) named `name`. */
static cfx_handle allreduce(cfx_context *ctx, const char *name, float *v, size_t n, int64_t *shape)
{
    *shape = (int64_t)n;
    cfx_tensor t = {v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    CHECK_OK(cfx_allreduce_async(ctx, name, &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
    return h;
}

static void test_allreduce_last_rank_fails(void **state)
{
    (void)state;
    char last[16];
    snprintf(last, sizeof last, "%d", mt_size - 1);
    cfx_context *ctx = open_failing(last);
    enum { N = 1000, BIG = 700000 }; /* BIG: several 1 MiB chunks */
    float *v = malloc(BIG * sizeof *v);
    int64_t shape;
    for (int round = 0; round < 3; round++) { /* rounds 2 and 3 are cache hits */
        fill(v, N);
        expect_agreed(ctx, allreduce(ctx, "fail.lone", v, N, &shape), "fail.lone", mt_size - 1, NULL);
        CHECK(changed(v, N) == 0, "round %d: a failed batch changed %zu elements of the input: some "
              "rank entered the collective", round, changed(v, N));
        fill(v, N);
        CHECK_OK(mt_wait(ctx, allreduce(ctx, "ok.lone", v, N, &shape)));
        CHECK(wrong_sums(v, N) == 0, "round %d: the allreduce after a failed one has %zu wrong "
              "sums (the ranks paired the wrong collectives?)", round, wrong_sums(v, N));
    }
    fill(v, BIG);
    expect_agreed(ctx, allreduce(ctx, "fail.big", v, BIG, &shape), "fail.big", mt_size - 1, NULL);
    CHECK(changed(v, BIG) == 0, "a failed multi-chunk batch changed %zu elements", changed(v, BIG));

    /* A grouped (fused) batch: every tensor of it fails on every rank. */
    enum { NT = 3 };
    float g[NT][64];
    int64_t gs[NT];
    cfx_tensor ts[NT];
    for (int k = 0; k < NT; k++) {
        fill(g[k], 64);
        gs[k] = 64;
        ts[k] = (cfx_tensor){g[k], &gs[k], 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    }
    cfx_handle h = 0;
    CHECK_OK(cfx_grouped_allreduce_async(ctx, "fail.group", NT, ts, NULL, CFX_OP_SUM, 1, 1, &h));
    expect_agreed(ctx, h, "fail.group", mt_size - 1, NULL);
    for (int k = 0; k < NT; k++)
        CHECK(changed(g[k], 64) == 0, "fused tensor %d changed by a failed batch", k);
    CHECK_OK(cfx_grouped_allreduce_async(ctx, "ok.group", NT, ts, NULL, CFX_OP_SUM, 1, 1, &h));
    CHECK_OK(mt_wait(ctx, h));
    CHECK_OK(cfx_handle_release(ctx, h));
    for (int k = 0; k < NT; k++)
        CHECK(wrong_sums(g[k], 64) == 0, "fused tensor %d after the failure: wrong sums", k);
    free(v);
    mt_close(ctx);
    mt_finish();
}

/* Two ranks fail at once: the lowest one's status and reason, and both are named. */
static void test_two_ranks_fail(void **state)
{
    (void)state;
    char ranks[32];
    snprintf(ranks, sizeof ranks, "0,%d", mt_size - 1);
    cfx_context *ctx = open_failing(ranks);
    float v[100];
    int64_t shape;
    fill(v, 100);
    char both[64];
    snprintf(both, sizeof both, "ranks 0 and %d failed", mt_size - 1);
    expect_agreed(ctx, allreduce(ctx, "fail.two", v, 100, &shape), "fail.two", 0, both);
    CHECK(changed(v, 100) == 0, "a failed batch changed the input");
    CHECK_OK(mt_wait(ctx, allreduce(ctx, "ok.two", v, 100, &shape)));
    CHECK(wrong_sums(v, 100) == 0, "wrong sums after two ranks failed a batch");
    mt_close(ctx);
    mt_finish();
}

/* Every other collective: rank 1 fails (not the broadcast root), all ranks fail the response,
 * then the same collective under another name gives the right result. */
static void test_other_collectives(void **state)
{
    (void)state;
    cfx_context *ctx = open_failing("1");
    enum { N = 12 };
    float v[N];
    int64_t shape = N;
    cfx_tensor t = {v, &shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;

    fill(v, N);
    CHECK_OK(cfx_broadcast_async(ctx, "fail.bcast", &t, 0, &h));
    expect_agreed(ctx, h, "fail.bcast", 1, NULL);
    CHECK(changed(v, N) == 0, "a failed broadcast changed the tensor on rank %d", mt_rank);
    CHECK_OK(cfx_broadcast_async(ctx, "ok.bcast", &t, 0, &h));
    CHECK_OK(mt_wait(ctx, h));
    CHECK_OK(cfx_handle_release(ctx, h));
    for (size_t i = 0; i < N; i++)
        CHECK(v[i] == val(0, i), "broadcast element %zu: %g, want %g", i, v[i], val(0, i));

    /* allgather, twice in a row (the two may fuse: either way both fail everywhere) */
    fill(v, N);
    cfx_handle a = 0, b = 0;
    CHECK_OK(cfx_allgather_async(ctx, "fail.ag1", &t, &a));
    CHECK_OK(cfx_allgather_async(ctx, "fail.ag2", &t, &b));
    expect_agreed(ctx, a, "fail.ag", 1, NULL); /* fused, the message names the first */
    expect_agreed(ctx, b, "fail.ag", 1, NULL);
    CHECK_OK(cfx_allgather_async(ctx, "ok.ag", &t, &h));
    CHECK_OK(mt_wait(ctx, h));
    cfx_tensor out;
    memset(&out, 0, sizeof out);
    CHECK_OK(cfx_handle_output(ctx, h, 0, &out));
    CHECK(out.ndim == 1 && out.shape && out.shape[0] == (int64_t)N * mt_size, "allgather shape");
    if (out.ndim == 1 && out.shape && out.shape[0] == (int64_t)N * mt_size)
        for (int r = 0; r < mt_size; r++)
            for (size_t i = 0; i < N; i++)
                CHECK(((const float *)out.data)[(size_t)r * N + i] == val(r, i),
                      "allgather: rank %d element %zu", r, i);
    CHECK_OK(cfx_handle_release(ctx, h));

    /* alltoall: one row of 12 / size... each rank sends `size` rows of 1 element */
    float send[4 * 4], *recv = NULL;
    int64_t ashape = mt_size;
    for (int j = 0; j < mt_size; j++)
        send[j] = (float)(mt_rank * 10 + j);
    cfx_tensor at = {send, &ashape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_alltoall_async(ctx, "fail.a2a", &at, NULL, 0, &h));
    expect_agreed(ctx, h, "fail.a2a", 1, NULL);
    CHECK_OK(cfx_alltoall_async(ctx, "ok.a2a", &at, NULL, 0, &h));
    CHECK_OK(mt_wait(ctx, h));
    memset(&out, 0, sizeof out);
    CHECK_OK(cfx_handle_output(ctx, h, 0, &out));
    recv = out.data;
    CHECK(out.shape && out.shape[0] == mt_size, "alltoall rows");
    if (recv && out.shape && out.shape[0] == mt_size)
        for (int j = 0; j < mt_size; j++)
            CHECK(recv[j] == (float)(j * 10 + mt_rank), "alltoall from rank %d: %g", j, recv[j]);
    CHECK_OK(cfx_handle_release(ctx, h));

    /* reducescatter of size * 3 rows */
    float rs[4 * 3];
    int64_t rshape = mt_size * 3;
    fill(rs, (size_t)rshape);
    cfx_tensor rt = {rs, &rshape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_reducescatter_async(ctx, "fail.rs", &rt, CFX_OP_SUM, 1, 1, &h));
    expect_agreed(ctx, h, "fail.rs", 1, NULL);
    CHECK_OK(cfx_reducescatter_async(ctx, "ok.rs", &rt, CFX_OP_SUM, 1, 1, &h));
    CHECK_OK(mt_wait(ctx, h));
    memset(&out, 0, sizeof out);
    CHECK_OK(cfx_handle_output(ctx, h, 0, &out));
    CHECK(out.shape && out.shape[0] == 3, "reducescatter rows");
    if (out.data && out.shape && out.shape[0] == 3)
        for (size_t i = 0; i < 3; i++)
            CHECK(((const float *)out.data)[i] == sum_over_ranks((size_t)mt_rank * 3 + i),
                  "reducescatter element %zu", i);
    CHECK_OK(cfx_handle_release(ctx, h));

    /* a barrier has nothing to prepare: it is not failed by the injection */
    CHECK_OK(cfx_barrier_async(ctx, &h));
    CHECK_OK(mt_wait(ctx, h));
    CHECK_OK(cfx_handle_release(ctx, h));
    mt_close(ctx);
    mt_finish();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_last_rank_fails),
        cmocka_unit_test(test_two_ranks_fail),
        cmocka_unit_test(test_other_collectives),
    };
    return MT_RUN(argc, argv, tests);
}
