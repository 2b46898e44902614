/*
 * The other collectives through the public ABI under mpirun: allgather (dim 0 differing per rank,
 * zero rows on some ranks, grouped), broadcast from every root, alltoall with default and explicit
 * splits, reducescatter with every op and uneven dim 0 (grouped too), barrier, join (uneven data:
 * joined ranks contribute the op's identity; collectives other than allreduce fail with
 * CFX_ERR_JOINED), and the validation of each (mismatched shape rule, root, op; bad splits).
 * Expected results are computed here from each rank's known input.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mpitest.h"

/* The elementwise ops (Adasum is not: tests/unit/test_adasum.c, tests/mpi/test_mpi_adasum.c). */
#define ELEMENTWISE_OPS (CFX_OP_PRODUCT + 1)

static const cfx_dtype all_dtypes[CFX_DTYPE_COUNT] = {
    CFX_UINT8, CFX_INT8, CFX_UINT16, CFX_INT16, CFX_INT32, CFX_INT64,
    CFX_FLOAT16, CFX_BFLOAT16, CFX_FLOAT32, CFX_FLOAT64, CFX_BOOL};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Element e of row `row` of rank r's tensor t: exact in every dtype (bool: 0 or 1). */
static double row_value(cfx_dtype dt, int r, int t, int64_t row, size_t e)
{
    long v = (r * 19 + (long)row * 7 + (long)e * 3 + t) % 50;
    return dt == CFX_BOOL ? (double)(v % 2) : (double)v;
}

/* ---- allgather ------------------------------------------------------------------------------ */

static int64_t ag_rows(int r, int step, int t)
{
    if (t == 100)
        return 0; /* every rank contributes nothing */
    if (t == 101)
        return r == 0 ? 0 : 2; /* rank 0 contributes nothing */
    return (r + step + t) % 3 == 1 ? 0 : r + 1 + step;
}

/* Checks output `index` of an allgather handle: shape, splits and data against every rank's rows. */
static void check_allgather_output(cfx_context *ctx, cfx_handle h, size_t index, cfx_dtype dt, int t,
                                   int step, int ndim, const int64_t *inner, const char *what)
{
    size_t row_elems = 1;
    for (int k = 1; k < ndim; k++)
        row_elems *= (size_t)inner[k - 1];
    int64_t total = 0;
    for (int r = 0; r < mt_size; r++)
        total += ag_rows(r, step, t);
    cfx_tensor o;
    memset(&o, 0, sizeof o);
    CHECK_OK(cfx_handle_output(ctx, h, index, &o));
    CHECK(o.dtype == (int32_t)dt && o.ndim == ndim && o.device == CFX_DEVICE_CPU,
          "%s: output dtype %d ndim %d device %d", what, o.dtype, o.ndim, o.device);
    if (o.ndim != ndim || !o.shape)
        return;
    CHECK(o.shape[0] == total, "%s: output dim 0 is %lld, expected %lld", what, (long long)o.shape[0],
          (long long)total);
    for (int k = 1; k < ndim; k++)
        CHECK(o.shape[k] == inner[k - 1], "%s: output dim %d is %lld", what, k, (long long)o.shape[k]);
    const int64_t *splits = NULL;
    CHECK_OK(cfx_handle_splits(ctx, h, index, &splits));
    for (int r = 0; splits && r < mt_size; r++)
        CHECK(splits[r] == ag_rows(r, step, t), "%s: splits[%d] = %lld, expected %lld", what, r,
              (long long)splits[r], (long long)ag_rows(r, step, t));
    size_t bytes = (size_t)total * row_elems * cfx_dtype_size(dt);
    unsigned char *copy = malloc(bytes + 1);
    CHECK_OK(cfx_handle_output_copy(ctx, h, index, copy, bytes));
    if (bytes > 0)
        CHECK(cfx_handle_output_copy(ctx, h, index, copy, bytes - 1) != CFX_OK,
              "%s: output_copy into a too small buffer succeeded", what);
    CHECK(bytes == 0 || (o.data && memcmp(o.data, copy, bytes) == 0), "%s: output_copy differs from "
          "the output", what);
    int64_t row = 0;
    int bad = 0;
    for (int r = 0; r < mt_size; r++)
        for (int64_t k = 0; k < ag_rows(r, step, t); k++, row++)
            for (size_t e = 0; e < row_elems; e++) {
                double got = mt_get(copy, dt, (size_t)row * row_elems + e);
                double want = row_value(dt, r, t, k, e);
                if (got != want && bad++ < 3)
                    CHECK(0, "%s: row %lld (rank %d row %lld) element %zu: got %g, expected %g", what,
                          (long long)row, r, (long long)k, e, got, want);
            }
    CHECK(mt_identical_across_ranks(copy, bytes), "%s: output differs across ranks", what);
    free(copy);
}

static void *ag_input(cfx_dtype dt, int t, int step, size_t row_elems)
{
    int64_t rows = ag_rows(mt_rank, step, t);
    void *buf = malloc((size_t)rows * row_elems * cfx_dtype_size(dt) + 1);
    for (int64_t k = 0; k < rows; k++)
        for (size_t e = 0; e < row_elems; e++)
            mt_put(buf, dt, (size_t)k * row_elems + e, row_value(dt, mt_rank, t, k, e));
    return buf;
}

/* Every dtype, dim 0 differing per rank (zero on some), all submitted at once in a rank-dependent
 * order, two steps under the same names with different row counts. */
static void test_allgather(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    enum { NT = CFX_DTYPE_COUNT + 2 };
    int64_t inner[2] = {2, 3};
    for (int step = 0; step < 2; step++) {
        void *in[NT];
        cfx_handle h[NT];
        int tid[NT], order[NT];
        cfx_dtype dt[NT];
        for (int k = 0; k < NT; k++) {
            tid[k] = k < CFX_DTYPE_COUNT ? k : 100 + (k - CFX_DTYPE_COUNT);
            dt[k] = k < CFX_DTYPE_COUNT ? all_dtypes[k] : CFX_FLOAT32;
            in[k] = ag_input(dt[k], tid[k], step, 6);
            order[k] = k;
        }
        uint64_t seed = (uint64_t)(mt_rank * 3 + step + 1);
        mt_shuffle(order, NT, &seed);
        for (int j = 0; j < NT; j++) {
            int k = order[j];
            int64_t shape[3] = {ag_rows(mt_rank, step, tid[k]), 2, 3};
            cfx_tensor x = {in[k], shape, 3, (int32_t)dt[k], CFX_DEVICE_CPU, NULL};
            char name[32];
            snprintf(name, sizeof name, "ag.%d", tid[k]);
            CHECK_OK(cfx_allgather_async(ctx, name, &x, &h[k]));
        }
        for (int k = 0; k < NT; k++) {
            char what[64];
            snprintf(what, sizeof what, "step %d allgather %s t%d", step, cfx_dtype_name(dt[k]), tid[k]);
            cfx_status st = mt_wait(ctx, h[k]);
            const char *m = cfx_handle_message(ctx, h[k]);
            CHECK(st == CFX_OK, "%s: %s: %s", what, cfx_status_string(st), m ? m : "(null)");
            size_t count = 0;
            CHECK_OK(cfx_handle_output_count(ctx, h[k], &count));
            CHECK(count == 1, "%s: %zu outputs", what, count);
            check_allgather_output(ctx, h[k], 0, dt[k], tid[k], step, 3, inner, what);
            CHECK(cfx_handle_output_count(ctx, h[k], &count) == CFX_OK &&
                  cfx_handle_splits(ctx, h[k], 1, &(const int64_t *){NULL}) != CFX_OK,
                  "%s: splits of output 1 accepted", what);
            CHECK_OK(cfx_handle_release(ctx, h[k]));
            free(in[k]);
        }
    }
    /* A 1-D allgather larger than the default chunk. */
    int64_t n = 300000 + mt_rank;
    int32_t *big = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        big[i] = (int32_t)(mt_rank * 1000000 + i);
    cfx_tensor bx = {big, &n, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
    cfx_handle hb = 0;
    CHECK_OK(cfx_allgather_async(ctx, "ag.big", &bx, &hb));
    CHECK_OK(mt_wait(ctx, hb));
    cfx_tensor o;
    memset(&o, 0, sizeof o);
    CHECK_OK(cfx_handle_output(ctx, hb, 0, &o));
    int64_t total = (int64_t)mt_size * 300000 + mt_size * (mt_size - 1) / 2, pos = 0;
    CHECK(o.ndim == 1 && o.shape && o.shape[0] == total, "ag.big: output shape");
    if (o.ndim == 1 && o.shape && o.shape[0] == total && o.data)
        for (int r = 0; r < mt_size; r++)
            for (int64_t i = 0; i < 300000 + r; i++, pos++)
                if (((int32_t *)o.data)[pos] != (int32_t)(r * 1000000 + i)) {
                    CHECK(0, "ag.big[%lld] = %d", (long long)pos, ((int32_t *)o.data)[pos]);
                    r = mt_size;
                    break;
                }
    CHECK_OK(cfx_handle_release(ctx, hb));
    free(big);
    mt_close(ctx);
    mt_finish();
}

static void test_grouped_allgather(void **state)
{
    (void)state;
    for (int pass = 0; pass < 2; pass++) {
        cfx_context *ctx = pass == 0 ? mt_open() : mt_open_opts(-1, -1, -1, 1); /* cache < group */
        for (int step = 0; step < 2; step++) {
            int64_t in0[1] = {4}, in2[2] = {2, 2};
            void *a = ag_input(CFX_FLOAT32, 0, step, 4), *b = ag_input(CFX_INT16, 1, step, 1),
                 *c = ag_input(CFX_FLOAT64, 2, step, 4);
            int64_t sa[2] = {ag_rows(mt_rank, step, 0), 4}, sb[1] = {ag_rows(mt_rank, step, 1)},
                    sc[3] = {ag_rows(mt_rank, step, 2), 2, 2};
            cfx_tensor in[3] = {{a, sa, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL},
                                {b, sb, 1, CFX_INT16, CFX_DEVICE_CPU, NULL},
                                {c, sc, 3, CFX_FLOAT64, CFX_DEVICE_CPU, NULL}};
            cfx_handle h = 0;
            CHECK_OK(cfx_grouped_allgather_async(ctx, "agg", 3, in, &h));
            mt_wait_expect(ctx, h, CFX_OK, "grouped allgather (wait only)");
            /* mt_wait_expect released it: submit again to inspect the outputs. */
            CHECK_OK(cfx_grouped_allgather_async(ctx, "agg", 3, in, &h));
            CHECK_OK(mt_wait(ctx, h));
            size_t count = 0;
            CHECK_OK(cfx_handle_output_count(ctx, h, &count));
            CHECK(count == 3, "grouped allgather: %zu outputs", count);
            check_allgather_output(ctx, h, 0, CFX_FLOAT32, 0, step, 2, in0, "agg.0");
            check_allgather_output(ctx, h, 1, CFX_INT16, 1, step, 1, NULL, "agg.1");
            check_allgather_output(ctx, h, 2, CFX_FLOAT64, 2, step, 3, in2, "agg.2");
            CHECK_OK(cfx_handle_release(ctx, h));
            free(a), free(b), free(c);
        }
        mt_close(ctx);
    }
    mt_finish();
}

/* The shape rule and dtype are validated: every rank gets CFX_ERR_MISMATCH naming both values. */
static void test_allgather_mismatch(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    float f[16] = {0};
    int64_t s23[2] = {2, 3}, s24[2] = {2, 4}, s2[1] = {2};
    int odd = mt_rank != 0;
    cfx_tensor a = {f, odd ? s24 : s23, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_tensor b = {f, s2, 1, odd ? CFX_INT32 : CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_tensor c = {f, odd ? s2 : s23, odd ? 1 : 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h[3];
    CHECK_OK(cfx_allgather_async(ctx, "agm.shape", &a, &h[0]));
    CHECK_OK(cfx_allgather_async(ctx, "agm.dtype", &b, &h[1]));
    CHECK_OK(cfx_allgather_async(ctx, "agm.ndim", &c, &h[2]));
    const char *subs[3][3] = {{"agm.shape", "[2, 3]", "[2, 4]"}, {"agm.dtype", "float32", "int32"},
                              {"agm.ndim", "[2, 3]", "[2]"}};
    for (int k = 0; k < 3; k++) {
        cfx_status st = mt_wait(ctx, h[k]);
        const char *m = cfx_handle_message(ctx, h[k]);
        CHECK(st == CFX_ERR_MISMATCH, "%s: %s (%s)", subs[k][0], cfx_status_string(st), m ? m : "(null)");
        CHECK(mt_contains(m, subs[k][0]) && mt_contains(m, subs[k][1]) && mt_contains(m, subs[k][2]),
              "%s: message lacks '%s'/'%s': %s", subs[k][0], subs[k][1], subs[k][2], m ? m : "(null)");
        size_t count = 9;
        if (cfx_handle_output_count(ctx, h[k], &count) == CFX_OK)
            CHECK(count == 0 || count == 1, "failed allgather reports %zu outputs", count);
        CHECK_OK(cfx_handle_release(ctx, h[k]));
    }
    /* The job goes on, with the same name. */
    int64_t rows = mt_rank + 1;
    int64_t sh[2] = {rows, 3};
    for (int i = 0; i < 16; i++)
        f[i] = (float)mt_rank;
    cfx_tensor g = {f, sh, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle hg = 0;
    CHECK_OK(cfx_allgather_async(ctx, "agm.shape", &g, &hg));
    CHECK_OK(mt_wait(ctx, hg));
    cfx_tensor o;
    memset(&o, 0, sizeof o);
    CHECK_OK(cfx_handle_output(ctx, hg, 0, &o));
    CHECK(o.shape && o.shape[0] == mt_size * (mt_size + 1) / 2 && o.shape[1] == 3,
          "allgather after a mismatch: wrong shape");
    if (o.data && o.shape && o.shape[0] == mt_size * (mt_size + 1) / 2)
        CHECK(((float *)o.data)[3 * (o.shape[0] - 1)] == (float)(mt_size - 1), "allgather after mismatch: data");
    CHECK_OK(cfx_handle_release(ctx, hg));
    mt_close(ctx);
    mt_finish();
}

/* ---- broadcast ------------------------------------------------------------------------------ */

static void test_broadcast(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    enum { N = 15 };
    for (int step = 0; step < 2; step++)
        for (int root = 0; root < mt_size; root++) {
            unsigned char buf[CFX_DTYPE_COUNT][N * 8], want[CFX_DTYPE_COUNT][N * 8];
            cfx_handle h[CFX_DTYPE_COUNT];
            int64_t shape[2] = {5, 3};
            for (int d = 0; d < CFX_DTYPE_COUNT; d++) {
                cfx_dtype dt = all_dtypes[d];
                for (int i = 0; i < N; i++)
                    mt_put(want[d], dt, (size_t)i, row_value(dt, root, d + step, 0, (size_t)i));
                if (mt_rank == root)
                    memcpy(buf[d], want[d], N * cfx_dtype_size(dt));
                else
                    memset(buf[d], 0x5A + mt_rank, sizeof buf[d]);
                cfx_tensor x = {buf[d], shape, 2, (int32_t)dt, CFX_DEVICE_CPU, NULL};
                char name[48];
                snprintf(name, sizeof name, "bc.%s.%d", cfx_dtype_name(dt), root);
                CHECK_OK(cfx_broadcast_async(ctx, name, &x, root, &h[d]));
            }
            for (int d = 0; d < CFX_DTYPE_COUNT; d++) {
                mt_wait_expect(ctx, h[d], CFX_OK, "broadcast");
                CHECK(memcmp(buf[d], want[d], N * cfx_dtype_size(all_dtypes[d])) == 0,
                      "step %d broadcast %s from root %d: data differs from the root's",
                      step, cfx_dtype_name(all_dtypes[d]), root);
            }
        }
    /* Scalar, zero-size and a large broadcast (several chunks) from the last rank. */
    double s = mt_rank == mt_size - 1 ? 42.5 : -1;
    cfx_tensor ts = {&s, NULL, 0, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
    int64_t z[2] = {0, 7};
    cfx_tensor tz = {NULL, z, 2, CFX_INT32, CFX_DEVICE_CPU, NULL};
    int64_t nbig = 700000;
    float *big = malloc(sizeof(float) * (size_t)nbig);
    for (int64_t i = 0; i < nbig; i++)
        big[i] = mt_rank == mt_size - 1 ? (float)i : -1.0f;
    cfx_tensor tb = {big, &nbig, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h1, h2, h3;
    CHECK_OK(cfx_broadcast_async(ctx, "bc.scalar", &ts, mt_size - 1, &h1));
    CHECK_OK(cfx_broadcast_async(ctx, "bc.zero", &tz, mt_size - 1, &h2));
    CHECK_OK(cfx_broadcast_async(ctx, "bc.big", &tb, mt_size - 1, &h3));
    mt_wait_expect(ctx, h1, CFX_OK, "scalar broadcast");
    mt_wait_expect(ctx, h2, CFX_OK, "zero-size broadcast");
    mt_wait_expect(ctx, h3, CFX_OK, "large broadcast");
    CHECK(s == 42.5, "scalar broadcast: %g", s);
    for (int64_t i = 0; i < nbig; i++)
        if (big[i] != (float)i) {
            CHECK(0, "large broadcast [%lld] = %g", (long long)i, (double)big[i]);
            break;
        }
    free(big);
    mt_close(ctx);
    mt_finish();
}

/* Ranks name different roots: every rank gets CFX_ERR_MISMATCH naming both; data untouched. */
static void test_broadcast_root_mismatch(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    int32_t v[4] = {mt_rank, mt_rank, mt_rank, mt_rank};
    int64_t shape[1] = {4};
    cfx_tensor t = {v, shape, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    int root = mt_rank == 0 ? 0 : 1;
    CHECK_OK(cfx_broadcast_async(ctx, "bc.rootmm", &t, root, &h));
    cfx_status st = mt_wait(ctx, h);
    const char *m = cfx_handle_message(ctx, h);
    CHECK(st == CFX_ERR_MISMATCH, "root mismatch: %s (%s)", cfx_status_string(st), m ? m : "(null)");
    CHECK(mt_contains(m, "bc.rootmm") && mt_contains(m, "root 0") && mt_contains(m, "root 1"),
          "root mismatch message lacks the tensor or the roots: %s", m ? m : "(null)");
    CHECK_OK(cfx_handle_release(ctx, h));
    CHECK(v[0] == mt_rank && v[3] == mt_rank, "a failed broadcast changed the data");
    CHECK_OK(cfx_broadcast_async(ctx, "bc.rootmm", &t, 1, &h));
    mt_wait_expect(ctx, h, CFX_OK, "broadcast after a root mismatch");
    CHECK(v[0] == 1 && v[3] == 1, "broadcast after root mismatch: %d", v[0]);
    mt_close(ctx);
    mt_finish();
}

/* ---- alltoall ------------------------------------------------------------------------------- */

static int64_t a2a_split(int mode, int from, int to)
{
    if (mode == 0)
        return 2;
    if (mode == 2 && from == 0)
        return 0; /* rank 0 sends nothing at all */
    return (from + 2 * to) % 3; /* zeros included */
}

static void run_alltoall(cfx_context *ctx, int mode, cfx_dtype dt, int t)
{
    int64_t d0 = 0;
    int64_t *splits = malloc(sizeof(int64_t) * (size_t)mt_size);
    for (int j = 0; j < mt_size; j++)
        d0 += splits[j] = a2a_split(mode, mt_rank, j);
    enum { W = 3 };
    void *in = malloc((size_t)d0 * W * cfx_dtype_size(dt) + 1);
    for (int64_t k = 0; k < d0; k++)
        for (size_t e = 0; e < W; e++)
            mt_put(in, dt, (size_t)k * W + e, row_value(dt, mt_rank, t, k, e));
    int64_t shape[2] = {d0, W};
    cfx_tensor x = {in, shape, 2, (int32_t)dt, CFX_DEVICE_CPU, NULL};
    char name[48];
    snprintf(name, sizeof name, "a2a.%d.%s", mode, cfx_dtype_name(dt));
    cfx_handle h = 0;
    CHECK_OK(cfx_alltoall_async(ctx, name, &x, mode == 0 ? NULL : splits, mode == 0 ? 0 : (size_t)mt_size, &h));
    cfx_status st = mt_wait(ctx, h);
    const char *m = cfx_handle_message(ctx, h);
    CHECK(st == CFX_OK, "%s: %s (%s)", name, cfx_status_string(st), m ? m : "(null)");
    int64_t recv = 0;
    for (int r = 0; r < mt_size; r++)
        recv += a2a_split(mode, r, mt_rank);
    cfx_tensor o;
    memset(&o, 0, sizeof o);
    size_t count = 0;
    CHECK_OK(cfx_handle_output_count(ctx, h, &count));
    CHECK(count == 1, "%s: %zu outputs", name, count);
    CHECK_OK(cfx_handle_output(ctx, h, 0, &o));
    CHECK(o.ndim == 2 && o.shape && o.shape[0] == recv && o.shape[1] == W && o.dtype == (int32_t)dt,
          "%s: output ndim %d dim0 %lld (expected %lld)", name, o.ndim, o.shape ? (long long)o.shape[0] : -1LL,
          (long long)recv);
    const int64_t *rs = NULL;
    CHECK_OK(cfx_handle_splits(ctx, h, 0, &rs));
    for (int r = 0; rs && r < mt_size; r++)
        CHECK(rs[r] == a2a_split(mode, r, mt_rank), "%s: received splits[%d] = %lld, expected %lld", name, r,
              (long long)rs[r], (long long)a2a_split(mode, r, mt_rank));
    if (o.data && o.shape && o.shape[0] == recv) {
        int64_t row = 0;
        int bad = 0;
        for (int r = 0; r < mt_size; r++) {
            int64_t first = 0; /* rank r's first row for this rank */
            for (int j = 0; j < mt_rank; j++)
                first += a2a_split(mode, r, j);
            for (int64_t k = 0; k < a2a_split(mode, r, mt_rank); k++, row++)
                for (size_t e = 0; e < W; e++) {
                    double got = mt_get(o.data, dt, (size_t)row * W + e);
                    double want = row_value(dt, r, t, first + k, e);
                    if (got != want && bad++ < 3)
                        CHECK(0, "%s: received row %lld (rank %d row %lld) [%zu] = %g, expected %g", name,
                              (long long)row, r, (long long)(first + k), e, got, want);
                }
        }
    }
    CHECK_OK(cfx_handle_release(ctx, h));
    free(in);
    free(splits);
}

static void test_alltoall(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    cfx_dtype dts[4] = {CFX_FLOAT32, CFX_INT16, CFX_UINT8, CFX_FLOAT64};
    for (int step = 0; step < 2; step++) /* names reused */
        for (int mode = 0; mode < 3; mode++)
            for (int d = 0; d < 4; d++)
                run_alltoall(ctx, mode, dts[d], d + step);

    /* Bad splits are refused at the call. */
    float f[64] = {0};
    int64_t s1[2] = {2 * mt_size + 1, 2}, s2[2] = {4, 2};
    cfx_tensor odd = {f, s1, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_tensor four = {f, s2, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    int64_t sp[8] = {4, 0, 0, 0, 0, 0, 0, 0};
    cfx_handle h = 0;
    CHECK_ST(cfx_alltoall_async(ctx, "a2a.bad", &odd, NULL, 0, &h), CFX_ERR_INVALID_ARGUMENT);
    CHECK_ST(cfx_alltoall_async(ctx, "a2a.bad", &four, sp, (size_t)mt_size + 1, &h), CFX_ERR_INVALID_ARGUMENT);
    CHECK_ST(cfx_alltoall_async(ctx, "a2a.bad", &four, sp, (size_t)mt_size - 1, &h), CFX_ERR_INVALID_ARGUMENT);
    sp[0] = 5, sp[1] = -1;
    CHECK_ST(cfx_alltoall_async(ctx, "a2a.bad", &four, sp, (size_t)mt_size, &h), CFX_ERR_INVALID_ARGUMENT);
    sp[0] = 3, sp[1] = 0;
    CHECK_ST(cfx_alltoall_async(ctx, "a2a.bad", &four, sp, (size_t)mt_size, &h), CFX_ERR_INVALID_ARGUMENT);
    CHECK(strstr(mt_last_error_copy(), "3") && strstr(mt_last_error_copy(), "4"),
          "splits-sum message lacks the values: %s", mt_last_error_copy());

    /* Mismatched trailing dims across ranks: a mismatch on every rank. */
    int64_t t3[2] = {mt_size, 3}, t4[2] = {mt_size, 4};
    cfx_tensor mm = {f, mt_rank ? t4 : t3, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_alltoall_async(ctx, "a2a.mm", &mm, NULL, 0, &h));
    cfx_status st = mt_wait(ctx, h);
    const char *m = cfx_handle_message(ctx, h);
    CHECK(st == CFX_ERR_MISMATCH && mt_contains(m, "a2a.mm"), "alltoall shape mismatch: %s (%s)",
          cfx_status_string(st), m ? m : "(null)");
    CHECK_OK(cfx_handle_release(ctx, h));
    /* And a good one after. */
    run_alltoall(ctx, 1, CFX_INT32, 9);
    mt_close(ctx);
    mt_finish();
}

/* ---- reducescatter -------------------------------------------------------------------------- */

static int64_t rs_rows(int64_t d0, int r) { return d0 / mt_size + (r < d0 % mt_size ? 1 : 0); }
static int64_t rs_start(int64_t d0, int r)
{
    return (int64_t)r * (d0 / mt_size) + (r < d0 % mt_size ? r : d0 % mt_size);
}

typedef struct rs_case {
    cfx_dtype dt;
    cfx_reduce_op op;
    int64_t d0;
    double pre, post;
    int t;
    void *in;
    cfx_handle h;
} rs_case;

static void rs_fill(rs_case *c, size_t w)
{
    size_t n = (size_t)c->d0 * w;
    c->in = malloc(n * cfx_dtype_size(c->dt) + 1);
    for (size_t i = 0; i < n; i++)
        mt_put(c->in, c->dt, i, mt_value(c->dt, c->op, mt_rank, c->t, i));
}

static void rs_check(cfx_context *ctx, rs_case *c, size_t index, size_t w, const char *what)
{
    cfx_tensor o;
    memset(&o, 0, sizeof o);
    CHECK_OK(cfx_handle_output(ctx, c->h, index, &o));
    int64_t rows = rs_rows(c->d0, mt_rank), start = rs_start(c->d0, mt_rank);
    CHECK(o.ndim == 2 && o.shape && o.shape[0] == rows && o.shape[1] == (int64_t)w && o.dtype == (int32_t)c->dt,
          "%s: output ndim %d dim0 %lld, expected %lld rows of %zu", what, o.ndim,
          o.shape ? (long long)o.shape[0] : -1LL, (long long)rows, w);
    if (!(o.shape && o.shape[0] == rows && (rows == 0 || o.data)))
        return;
    int bad = 0;
    for (size_t k = 0; k < (size_t)rows * w; k++) {
        size_t gi = (size_t)start * w + k;
        double want = mt_expected(c->dt, c->op, c->t, gi, c->pre, c->post);
        double got = mt_get(o.data, c->dt, k);
        if (!mt_close_enough(c->dt, got, want, c->op == CFX_OP_AVERAGE || c->post != 1.0 ? 2.0 : 0.0) &&
            bad++ < 3)
            CHECK(0, "%s: element %zu (global %zu): got %g, expected %g", what, k, gi, got, want);
    }
}

/* Every dtype x every op with uneven dim 0 (2n+1 rows: the first rank gets one more), dim 0 smaller
 * than the ranks, zero rows, scale factors; all at once; two steps under the same names. */
static void test_reducescatter(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    enum { W = 3 };
    size_t cap = (size_t)CFX_DTYPE_COUNT * ELEMENTWISE_OPS + 16, nc = 0;
    rs_case *cs = calloc(cap, sizeof *cs);
    for (int step = 0; step < 2; step++) {
        nc = 0;
        for (int d = 0; d < CFX_DTYPE_COUNT; d++)
            for (int op = 0; op < ELEMENTWISE_OPS; op++) {
                if (all_dtypes[d] == CFX_BOOL && op == CFX_OP_AVERAGE)
                    continue;
                cs[nc++] = (rs_case){all_dtypes[d], (cfx_reduce_op)op, 2 * mt_size + 1, 1.0, 1.0,
                                     d * 5 + op + step, NULL, 0};
            }
        cs[nc++] = (rs_case){CFX_FLOAT32, CFX_OP_SUM, 1, 1.0, 1.0, 1, NULL, 0};
        cs[nc++] = (rs_case){CFX_INT32, CFX_OP_MAX, mt_size - 1, 1.0, 1.0, 2, NULL, 0};
        cs[nc++] = (rs_case){CFX_FLOAT64, CFX_OP_SUM, 0, 1.0, 1.0, 3, NULL, 0};
        cs[nc++] = (rs_case){CFX_FLOAT32, CFX_OP_SUM, 3 * mt_size, 0.5, 3.0, 4, NULL, 0};
        cs[nc++] = (rs_case){CFX_INT32, CFX_OP_SUM, 3 * mt_size + 2, 3.0, 2.0, 5, NULL, 0};
        cs[nc++] = (rs_case){CFX_INT32, CFX_OP_AVERAGE, 3 * mt_size + 1, 2.0, 3.0, 6, NULL, 0};
        cs[nc++] = (rs_case){CFX_FLOAT16, CFX_OP_AVERAGE, 2 * mt_size - 1, 1.0, 2.0, 7, NULL, 0};
        cs[nc++] = (rs_case){CFX_FLOAT32, CFX_OP_SUM, 100003, 1.0, 1.0, 8, NULL, 0}; /* > a chunk */
        for (size_t k = 0; k < nc; k++) {
            rs_case *c = &cs[k];
            rs_fill(c, W);
            int64_t shape[2] = {c->d0, W};
            cfx_tensor x = {c->in, shape, 2, (int32_t)c->dt, CFX_DEVICE_CPU, NULL};
            char name[64];
            snprintf(name, sizeof name, "rs.%zu", k);
            CHECK_OK(cfx_reducescatter_async(ctx, name, &x, c->op, c->pre, c->post, &c->h));
        }
        for (size_t k = 0; k < nc; k++) {
            rs_case *c = &cs[k];
            char what[96];
            snprintf(what, sizeof what, "step %d reducescatter %s %s d0 %lld pre %g post %g", step,
                     cfx_dtype_name(c->dt), cfx_op_name(c->op), (long long)c->d0, c->pre, c->post);
            cfx_status st = mt_wait(ctx, c->h);
            const char *m = cfx_handle_message(ctx, c->h);
            CHECK(st == CFX_OK, "%s: %s (%s)", what, cfx_status_string(st), m ? m : "(null)");
            if (st == CFX_OK)
                rs_check(ctx, c, 0, W, what);
            CHECK_OK(cfx_handle_release(ctx, c->h));
            free(c->in);
        }
    }
    free(cs);

    /* Mismatched op: a mismatch on every rank naming both ops. */
    float f[12] = {0};
    int64_t s[2] = {4, 3};
    cfx_tensor t = {f, s, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    CHECK_OK(cfx_reducescatter_async(ctx, "rs.mm", &t, mt_rank ? CFX_OP_MIN : CFX_OP_SUM, 1, 1, &h));
    cfx_status st = mt_wait(ctx, h);
    const char *m = cfx_handle_message(ctx, h);
    CHECK(st == CFX_ERR_MISMATCH && mt_contains(m, "rs.mm") && mt_contains(m, "sum") && mt_contains(m, "min"),
          "reducescatter op mismatch: %s (%s)", cfx_status_string(st), m ? m : "(null)");
    CHECK_OK(cfx_handle_release(ctx, h));
    mt_close(ctx);
    mt_finish();
}

/* Grouped reducescatter, with the default response cache and with one smaller than the group
 * (steps after the first then mix cached and uncached members; a short wait makes a hang fail
 * fast). */
static void test_grouped_reducescatter(void **state)
{
    (void)state;
    for (int pass = 0; pass < 2; pass++) {
        cfx_context *ctx = pass == 0 ? mt_open() : mt_open_opts(-1, -1, -1, 2);
        enum { W = 2 };
        for (int step = 0; step < 3; step++) {
            rs_case cs[3] = {{CFX_FLOAT32, CFX_OP_SUM, 2 * mt_size + 1, 1.0, 2.0, 0 + step, NULL, 0},
                             {CFX_INT64, CFX_OP_SUM, 1, 1.0, 2.0, 1 + step, NULL, 0},
                             {CFX_FLOAT64, CFX_OP_SUM, 5 * mt_size, 1.0, 2.0, 2 + step, NULL, 0}};
            cfx_tensor in[3];
            int64_t shapes[3][2];
            for (int k = 0; k < 3; k++) {
                rs_fill(&cs[k], W);
                shapes[k][0] = cs[k].d0;
                shapes[k][1] = W;
                in[k] = (cfx_tensor){cs[k].in, shapes[k], 2, (int32_t)cs[k].dt, CFX_DEVICE_CPU, NULL};
            }
            cfx_handle h = 0;
            CHECK_OK(cfx_grouped_reducescatter_async(ctx, "rsg", 3, in, CFX_OP_SUM, 1.0, 2.0, &h));
            cfx_status st = cfx_wait(ctx, h, 3.0);
            CHECK(st == CFX_OK, "grouped reducescatter (%s cache), step %d: %s",
                  pass ? "capacity-2" : "default", step, cfx_status_string(st));
            size_t count = 0;
            if (st == CFX_OK) {
                CHECK_OK(cfx_handle_output_count(ctx, h, &count));
                CHECK(count == 3, "grouped reducescatter: %zu outputs", count);
            }
            for (int k = 0; k < 3 && st == CFX_OK; k++) {
                cs[k].h = h;
                char what[32];
                snprintf(what, sizeof what, "step %d rsg.%d", step, k);
                rs_check(ctx, &cs[k], (size_t)k, W, what);
            }
            CHECK_OK(cfx_handle_release(ctx, h));
            for (int k = 0; k < 3; k++)
                free(cs[k].in);
            int ok = st == CFX_OK, all = 0;
            MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
            if (!all)
                break; /* a hung group: the shutdown below fails it */
        }
        mt_close(ctx);
    }
    mt_finish();
}

/* Names reused with a different, consistent description each step (root, splits, dim 0): the
 * response cache must not answer with the previous step's. */
static void test_changed_descriptions_across_steps(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    for (int step = 0; step < 4; step++) {
        /* broadcast: the root moves every step */
        int root = step % mt_size;
        int32_t b[3] = {mt_rank * 10, mt_rank * 10 + 1, mt_rank * 10 + 2};
        int64_t s3[1] = {3};
        cfx_tensor tb = {b, s3, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
        cfx_handle h = 0;
        CHECK_OK(cfx_broadcast_async(ctx, "chg.bc", &tb, root, &h));
        mt_wait_expect(ctx, h, CFX_OK, "broadcast with a new root");
        CHECK(b[0] == root * 10 && b[2] == root * 10 + 2, "step %d: broadcast from root %d gave %d %d %d",
              step, root, b[0], b[1], b[2]);

        /* alltoall: rank r sends (r + j + step) % 3 rows to rank j */
        int64_t d0 = 0, sp[8];
        for (int j = 0; j < mt_size; j++)
            d0 += sp[j] = (mt_rank + j + step) % 3;
        float a[64];
        for (int64_t k = 0; k < d0; k++)
            a[k] = (float)(mt_rank * 100 + k);
        int64_t sa[1] = {d0};
        cfx_tensor ta = {a, sa, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        CHECK_OK(cfx_alltoall_async(ctx, "chg.a2a", &ta, sp, (size_t)mt_size, &h));
        CHECK_OK(mt_wait(ctx, h));
        cfx_tensor o;
        memset(&o, 0, sizeof o);
        CHECK_OK(cfx_handle_output(ctx, h, 0, &o));
        int64_t want_rows = 0;
        for (int r = 0; r < mt_size; r++)
            want_rows += (r + mt_rank + step) % 3;
        CHECK(o.shape && o.shape[0] == want_rows, "step %d: alltoall received %lld rows, expected %lld", step,
              o.shape ? (long long)o.shape[0] : -1LL, (long long)want_rows);
        if (o.shape && o.shape[0] == want_rows && o.data) {
            int64_t row = 0;
            for (int r = 0; r < mt_size; r++) {
                int64_t first = 0;
                for (int j = 0; j < mt_rank; j++)
                    first += (r + j + step) % 3;
                for (int64_t k = 0; k < (r + mt_rank + step) % 3; k++, row++)
                    CHECK(((float *)o.data)[row] == (float)(r * 100 + first + k),
                          "step %d: alltoall row %lld = %g", step, (long long)row, (double)((float *)o.data)[row]);
            }
        }
        CHECK_OK(cfx_handle_release(ctx, h));

        /* reducescatter: dim 0 changes every step */
        int64_t rd0 = mt_size + step, sr[2] = {rd0, 2};
        int32_t rbuf[64];
        for (int64_t i = 0; i < rd0 * 2; i++)
            rbuf[i] = (int32_t)(mt_rank + i);
        cfx_tensor tr = {rbuf, sr, 2, CFX_INT32, CFX_DEVICE_CPU, NULL};
        CHECK_OK(cfx_reducescatter_async(ctx, "chg.rs", &tr, CFX_OP_SUM, 1, 1, &h));
        CHECK_OK(mt_wait(ctx, h));
        memset(&o, 0, sizeof o);
        CHECK_OK(cfx_handle_output(ctx, h, 0, &o));
        int64_t rows = rs_rows(rd0, mt_rank), start = rs_start(rd0, mt_rank);
        CHECK(o.shape && o.shape[0] == rows, "step %d: reducescatter of %lld rows gave %lld, expected %lld",
              step, (long long)rd0, o.shape ? (long long)o.shape[0] : -1LL, (long long)rows);
        if (o.shape && o.shape[0] == rows && o.data)
            for (int64_t i = 0; i < rows * 2; i++)
                CHECK(((int32_t *)o.data)[i] == (int32_t)(mt_size * (mt_size - 1) / 2 + mt_size * (start * 2 + i)),
                      "step %d: reducescatter [%lld] = %d", step, (long long)i, ((int32_t *)o.data)[i]);
        CHECK_OK(cfx_handle_release(ctx, h));

        /* allreduce: dtype, prescale and shape change under one name */
        double dv[4] = {1, 2, 3, 4};
        float fv[4] = {1, 2, 3, 4};
        int64_t s4[1] = {4 - step % 2};
        cfx_tensor tv = {step % 2 ? (void *)fv : (void *)dv, s4, 1, step % 2 ? CFX_FLOAT32 : CFX_FLOAT64,
                         CFX_DEVICE_CPU, NULL};
        CHECK_OK(cfx_allreduce_async(ctx, "chg.ar", &tv, NULL, CFX_OP_SUM, 1.0 + step, 1.0, &h));
        mt_wait_expect(ctx, h, CFX_OK, "allreduce with a new dtype/prescale/shape");
        for (int i = 0; i < s4[0]; i++) {
            double got = step % 2 ? fv[i] : dv[i];
            CHECK(got == (1.0 + step) * mt_size * (i + 1), "step %d: chg.ar[%d] = %g", step, i, got);
        }
    }
    mt_close(ctx);
    mt_finish();
}

/* NULL names: generated per kind and counted per context, so ranks submitting in the same order
 * meet; allreduces, allgathers and broadcasts interleave. */
static void test_generated_names(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    int32_t a[3] = {mt_rank, mt_rank + 1, mt_rank + 2};
    int64_t b[2] = {mt_rank, 7};
    float c[2] = {(float)mt_rank, (float)mt_rank};
    int64_t s1[1] = {1};
    cfx_tensor ta[3], tb = {b, s1, 1, CFX_INT64, CFX_DEVICE_CPU, NULL};
    cfx_tensor tc = {c, (int64_t[]){2}, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle ha[3], hg = 0, hc = 0;
    for (int k = 0; k < 3; k++) {
        ta[k] = (cfx_tensor){&a[k], NULL, 0, CFX_INT32, CFX_DEVICE_CPU, NULL};
        CHECK_OK(cfx_allreduce_async(ctx, NULL, &ta[k], NULL, CFX_OP_SUM, 1, 1, &ha[k]));
        if (k == 0)
            CHECK_OK(cfx_allgather_async(ctx, NULL, &tb, &hg));
        if (k == 1)
            CHECK_OK(cfx_broadcast_async(ctx, NULL, &tc, mt_size - 1, &hc));
    }
    for (int k = 0; k < 3; k++) {
        mt_wait_expect(ctx, ha[k], CFX_OK, "allreduce with a generated name");
        CHECK(a[k] == mt_size * (mt_size - 1) / 2 + mt_size * k, "generated-name allreduce %d = %d", k, a[k]);
    }
    CHECK_OK(mt_wait(ctx, hg));
    int64_t got[8] = {0};
    CHECK_OK(cfx_handle_output_copy(ctx, hg, 0, got, sizeof(int64_t) * (size_t)mt_size));
    for (int r = 0; r < mt_size; r++)
        CHECK(got[r] == r, "generated-name allgather [%d] = %lld", r, (long long)got[r]);
    CHECK_OK(cfx_handle_release(ctx, hg));
    mt_wait_expect(ctx, hc, CFX_OK, "broadcast with a generated name");
    CHECK(c[0] == (float)(mt_size - 1) && c[1] == (float)(mt_size - 1), "generated-name broadcast: %g",
          (double)c[0]);
    mt_close(ctx);
    mt_finish();
}

/* ---- barrier -------------------------------------------------------------------------------- */

static void test_barrier(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    mt_barrier();
    double t0 = now_s();
    if (mt_rank == 0)
        usleep(300000);
    cfx_handle h = 0;
    CHECK_OK(cfx_barrier_async(ctx, &h));
    mt_wait_expect(ctx, h, CFX_OK, "barrier");
    double waited = now_s() - t0;
    CHECK(waited >= 0.25, "rank %d left the barrier after %.3f s, before rank 0 (late by 0.3 s) entered",
          mt_rank, waited);
    /* A barrier and an allreduce submitted in opposite orders on even and odd ranks. */
    int32_t x = mt_rank;
    cfx_tensor tx = {&x, NULL, 0, CFX_INT32, CFX_DEVICE_CPU, NULL};
    cfx_handle hb = 0, ha = 0;
    if (mt_rank % 2) {
        CHECK_OK(cfx_barrier_async(ctx, &hb));
        CHECK_OK(cfx_allreduce_async(ctx, "bar.x", &tx, NULL, CFX_OP_SUM, 1, 1, &ha));
    } else {
        CHECK_OK(cfx_allreduce_async(ctx, "bar.x", &tx, NULL, CFX_OP_SUM, 1, 1, &ha));
        CHECK_OK(cfx_barrier_async(ctx, &hb));
    }
    mt_wait_expect(ctx, hb, CFX_OK, "barrier next to an allreduce");
    mt_wait_expect(ctx, ha, CFX_OK, "allreduce next to a barrier");
    CHECK(x == mt_size * (mt_size - 1) / 2, "allreduce next to a barrier: %d", x);
    cfx_handle hs[5];
    for (int k = 0; k < 5; k++)
        CHECK_OK(cfx_barrier_async(ctx, &hs[k]));
    for (int k = 0; k < 5; k++) {
        size_t count = 9;
        CHECK_OK(mt_wait(ctx, hs[k]));
        CHECK_OK(cfx_handle_output_count(ctx, hs[k], &count));
        CHECK(count == 0, "barrier has %zu outputs", count);
        CHECK_OK(cfx_handle_release(ctx, hs[k]));
    }
    mt_close(ctx);
    mt_finish();
}

/* ---- join ----------------------------------------------------------------------------------- */

typedef struct join_case {
    cfx_dtype dt;
    cfx_reduce_op op;
    size_t n;
} join_case;

/* The last rank joins at once; the others run three steps of allreduces (same names: the cached
 * path too) in which it contributes the op's identity, and average divides by the full size. Then
 * ranks 1..n-2 join; rank 0 runs one more allreduce alone (it can only complete once everyone else
 * joined), then joins last: every rank's join reports rank 0. */
static void test_join_uneven_data(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    int last = mt_size - 1;
    join_case cases[] = {{CFX_FLOAT32, CFX_OP_SUM, 33},     {CFX_FLOAT32, CFX_OP_AVERAGE, 33},
                         {CFX_FLOAT32, CFX_OP_MIN, 20},     {CFX_FLOAT32, CFX_OP_MAX, 20},
                         {CFX_FLOAT32, CFX_OP_PRODUCT, 20}, {CFX_INT32, CFX_OP_SUM, 17},
                         {CFX_INT32, CFX_OP_AVERAGE, 17},   {CFX_INT32, CFX_OP_MIN, 9},
                         {CFX_INT32, CFX_OP_MAX, 9},        {CFX_INT32, CFX_OP_PRODUCT, 9},
                         {CFX_UINT8, CFX_OP_MIN, 9},        {CFX_FLOAT16, CFX_OP_SUM, 9},
                         {CFX_BOOL, CFX_OP_PRODUCT, 9},     {CFX_FLOAT32, CFX_OP_SUM, 400000}};
    enum { NC = sizeof cases / sizeof cases[0] };
    cfx_handle hj = 0;
    if (mt_rank == last) {
        CHECK_OK(cfx_join_async(ctx, &hj));
    } else {
        for (int step = 0; step < 3; step++) {
            void *buf[NC];
            cfx_handle h[NC];
            for (int k = 0; k < NC; k++) {
                join_case *c = &cases[k];
                buf[k] = malloc(c->n * cfx_dtype_size(c->dt));
                for (size_t i = 0; i < c->n; i++)
                    mt_put(buf[k], c->dt, i, mt_value(c->dt, c->op, mt_rank, k + step, i));
                int64_t shape[1] = {(int64_t)c->n};
                cfx_tensor x = {buf[k], shape, 1, (int32_t)c->dt, CFX_DEVICE_CPU, NULL};
                char name[32];
                snprintf(name, sizeof name, "join.%d", k);
                CHECK_OK(cfx_allreduce_async(ctx, name, &x, NULL, c->op, 1.0, 1.0, &h[k]));
            }
            /* A grouped allreduce too: the joined rank takes part in every member. */
            float g[2][5];
            int64_t s5[1] = {5};
            cfx_tensor gin[2];
            for (int m = 0; m < 2; m++) {
                for (int i = 0; i < 5; i++)
                    g[m][i] = (float)(mt_rank + 1 + m * i + step);
                gin[m] = (cfx_tensor){g[m], s5, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
            }
            cfx_handle hg = 0;
            CHECK_OK(cfx_grouped_allreduce_async(ctx, "join.group", 2, gin, NULL, CFX_OP_SUM, 1.0, 1.0, &hg));
            mt_wait_expect(ctx, hg, CFX_OK, "grouped allreduce with a joined rank");
            for (int m = 0; m < 2; m++)
                for (int i = 0; i < 5; i++) {
                    double want = 0;
                    for (int r = 0; r < mt_size; r++)
                        if (r != last)
                            want += r + 1 + m * i + step;
                    CHECK(g[m][i] == (float)want, "step %d join.group.%d[%d] = %g, expected %g", step, m, i,
                          (double)g[m][i], want);
                }
            for (int k = 0; k < NC; k++) {
                join_case *c = &cases[k];
                cfx_status st = mt_wait(ctx, h[k]);
                const char *m = cfx_handle_message(ctx, h[k]);
                CHECK(st == CFX_OK, "step %d join.%d (%s %s) with rank %d joined: %s (%s)", step, k,
                      cfx_dtype_name(c->dt), cfx_op_name(c->op), last, cfx_status_string(st),
                      m ? m : "(null)");
                CHECK_OK(cfx_handle_release(ctx, h[k]));
                int bad = 0;
                for (size_t i = 0; i < c->n && st == CFX_OK; i++) {
                    double want = mt_expected_skip(c->dt, c->op, k + step, i, 1.0, 1.0, last);
                    double got = mt_get(buf[k], c->dt, i);
                    if (!mt_close_enough(c->dt, got, want, c->op == CFX_OP_AVERAGE ? 2.0 : 0.0) && bad++ < 3)
                        CHECK(0, "step %d join.%d (%s %s) [%zu]: got %g, expected %g (rank %d joined "
                              "contributing the identity)", step, k, cfx_dtype_name(c->dt),
                              cfx_op_name(c->op), i, got, want, last);
                }
                free(buf[k]);
            }
        }
        if (mt_rank != 0) {
            CHECK_OK(cfx_join_async(ctx, &hj));
        } else {
            double v = 5.0;
            cfx_tensor x = {&v, NULL, 0, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
            cfx_handle h = 0;
            CHECK_OK(cfx_allreduce_async(ctx, "join.alone", &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
            mt_wait_expect(ctx, h, CFX_OK, "rank 0's allreduce with every other rank joined");
            CHECK(v == 5.0, "join.alone = %g, expected 5 (the others contribute 0)", v);
            CHECK_OK(cfx_join_async(ctx, &hj));
        }
    }
    cfx_status st = mt_wait(ctx, hj);
    CHECK(st == CFX_OK, "join: %s", cfx_status_string(st));
    int jr = -1;
    CHECK_OK(cfx_handle_join_rank(ctx, hj, &jr));
    CHECK(jr == 0, "join reports rank %d as the last to join, expected 0", jr);
    CHECK_OK(cfx_handle_release(ctx, hj));
    int lo = 0, hi = 0;
    MPI_Allreduce(&jr, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&jr, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi, "ranks disagree on the last joined rank (%d..%d)", lo, hi);

    /* After the join everyone takes part again. */
    int32_t a[2] = {mt_rank, 1};
    int64_t s2[1] = {2};
    cfx_tensor ta = {a, s2, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    CHECK_OK(cfx_allreduce_async(ctx, "join.0", &ta, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
    mt_wait_expect(ctx, h, CFX_OK, "allreduce after join");
    CHECK(a[0] == mt_size * (mt_size - 1) / 2 && a[1] == mt_size, "after join: %d %d", a[0], a[1]);
    mt_close(ctx);
    mt_finish();
}

/* While the last rank has joined, allgather, broadcast, alltoall and reducescatter fail with
 * CFX_ERR_JOINED on every submitting rank (never hang); then the others join too. */
static void test_join_blocks_other_collectives(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    int last = mt_size - 1;
    cfx_handle hj = 0;
    if (mt_rank == last) {
        CHECK_OK(cfx_join_async(ctx, &hj));
    } else {
        for (int step = 0; step < 2; step++) { /* the second round through the response cache */
            float f[2 * 8] = {0};
            int64_t s[2] = {mt_size, 2};
            cfx_tensor t = {f, s, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
            cfx_handle h[4];
            CHECK_OK(cfx_allgather_async(ctx, "jb.ag", &t, &h[0]));
            CHECK_OK(cfx_broadcast_async(ctx, "jb.bc", &t, 0, &h[1]));
            CHECK_OK(cfx_alltoall_async(ctx, "jb.a2a", &t, NULL, 0, &h[2]));
            CHECK_OK(cfx_reducescatter_async(ctx, "jb.rs", &t, CFX_OP_SUM, 1, 1, &h[3]));
            const char *names[4] = {"jb.ag", "jb.bc", "jb.a2a", "jb.rs"};
            for (int k = 0; k < 4; k++) {
                cfx_status st = mt_wait(ctx, h[k]);
                const char *m = cfx_handle_message(ctx, h[k]);
                CHECK(st == CFX_ERR_JOINED, "step %d %s with rank %d joined: %s (%s)", step, names[k], last,
                      cfx_status_string(st), m ? m : "(null)");
                CHECK(mt_contains(m, names[k]), "%s: the message does not name the tensor: %s", names[k],
                      m ? m : "(null)");
                CHECK_OK(cfx_handle_release(ctx, h[k]));
            }
        }
        CHECK_OK(cfx_join_async(ctx, &hj));
    }
    CHECK(mt_wait(ctx, hj) == CFX_OK, "join did not complete");
    int jr = -1;
    CHECK_OK(cfx_handle_join_rank(ctx, hj, &jr));
    CHECK(jr >= 0 && jr < mt_size && (mt_size == 1 || jr != last),
          "join reports rank %d, but rank %d joined first", jr, last);
    int lo = 0, hi = 0;
    MPI_Allreduce(&jr, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&jr, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi, "ranks disagree on the last joined rank (%d..%d)", lo, hi);
    CHECK_OK(cfx_handle_release(ctx, hj));
    /* Everyone back: an allgather works again. */
    int32_t v[1] = {mt_rank};
    int64_t s1[1] = {1};
    cfx_tensor t = {v, s1, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    CHECK_OK(cfx_allgather_async(ctx, "jb.ag", &t, &h));
    CHECK_OK(mt_wait(ctx, h));
    int32_t got[8] = {0};
    CHECK_OK(cfx_handle_output_copy(ctx, h, 0, got, sizeof(int32_t) * (size_t)mt_size));
    for (int r = 0; r < mt_size; r++)
        CHECK(got[r] == r, "allgather after join [%d] = %d", r, got[r]);
    CHECK_OK(cfx_handle_release(ctx, h));
    mt_close(ctx);
    mt_finish();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_grouped_allgather),
        cmocka_unit_test(test_allgather_mismatch),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_broadcast_root_mismatch),
        cmocka_unit_test(test_alltoall),
        cmocka_unit_test(test_reducescatter),
        cmocka_unit_test(test_grouped_reducescatter),
        cmocka_unit_test(test_changed_descriptions_across_steps),
        cmocka_unit_test(test_generated_names),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_join_uneven_data),
        cmocka_unit_test(test_join_blocks_other_collectives),
    };
    return MT_RUN(argc, argv, tests);
}
