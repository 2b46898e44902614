/*
 * Errors instead of hangs or crashes, under mpirun: local argument errors at the call, duplicate
 * in-flight names, stale and twice-released handles, wait timeouts, mismatches across ranks (every
 * rank gets CFX_ERR_MISMATCH naming the tensor and both values, and the job goes on), calls after
 * shutdown, init -> shutdown -> free -> init, and a rank shutting down while another waits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitest.h"

/* A call that must fail locally with `want` and leave a message naming the function. */
#define CHECK_FAILS(expr, want, fn)                                                                \
    do {                                                                                           \
        CHECK_ST(expr, want);                                                                      \
        const char *mt_e_ = mt_last_error_copy();                                                  \
        CHECK(mt_e_[0] != '\0' && (!(fn)[0] || strstr(mt_e_, fn)),                                 \
              "%s: cfx_last_error() '%s' does not name %s", #expr, mt_e_, fn);                     \
    } while (0)

static void test_local_argument_errors(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    float v[4] = {1, 2, 3, 4};
    int64_t shape[2] = {4, 1};
    cfx_tensor good = {v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;

    /* NULL context everywhere. */
    CHECK_FAILS(cfx_allreduce_async(NULL, "x", &good, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_NOT_INITIALIZED,
                "cfx_allreduce_async");
    CHECK_FAILS(cfx_grouped_allreduce_async(NULL, "x", 1, &good, NULL, CFX_OP_SUM, 1, 1, &h),
                CFX_ERR_NOT_INITIALIZED, "cfx_grouped_allreduce_async");
    CHECK_FAILS(cfx_allgather_async(NULL, "x", &good, &h), CFX_ERR_NOT_INITIALIZED, "cfx_allgather_async");
    CHECK_FAILS(cfx_broadcast_async(NULL, "x", &good, 0, &h), CFX_ERR_NOT_INITIALIZED, "cfx_broadcast_async");
    CHECK_FAILS(cfx_alltoall_async(NULL, "x", &good, NULL, 0, &h), CFX_ERR_NOT_INITIALIZED, "cfx_alltoall_async");
    CHECK_FAILS(cfx_reducescatter_async(NULL, "x", &good, CFX_OP_SUM, 1, 1, &h), CFX_ERR_NOT_INITIALIZED,
                "cfx_reducescatter_async");
    CHECK_FAILS(cfx_barrier_async(NULL, &h), CFX_ERR_NOT_INITIALIZED, "cfx_barrier_async");
    CHECK_FAILS(cfx_join_async(NULL, &h), CFX_ERR_NOT_INITIALIZED, "cfx_join_async");
    CHECK_FAILS(cfx_wait(NULL, 1, 0.0), CFX_ERR_NOT_INITIALIZED, "cfx_wait");
    CHECK_FAILS(cfx_handle_release(NULL, 1), CFX_ERR_NOT_INITIALIZED, "cfx_handle_release");
    CHECK_FAILS(cfx_shutdown(NULL), CFX_ERR_NOT_INITIALIZED, "cfx_shutdown");
    CHECK(cfx_handle_message(NULL, 1) == NULL, "cfx_handle_message(NULL ctx) is not NULL");
    CHECK(cfx_rank(NULL) == -1 && cfx_size(NULL) == -1 && cfx_local_rank(NULL) == -1, "topology of NULL");
    CHECK(cfx_is_running(NULL) == 0, "cfx_is_running(NULL) != 0");
    cfx_context_free(NULL);

    /* Options and init. */
    cfx_init_options o;
    CHECK_FAILS(cfx_init_options_init(&o, 999), CFX_ERR_VERSION, "");
    CHECK_FAILS(cfx_init_options_init(NULL, CFX_INIT_OPTIONS_VERSION), CFX_ERR_INVALID_ARGUMENT, "");
    CHECK_FAILS(cfx_init(NULL, NULL), CFX_ERR_INVALID_ARGUMENT, "cfx_init");

    /* The tensor description. */
    const char *fn = "cfx_allreduce_async";
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", NULL, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &good, NULL, CFX_OP_SUM, 1, 1, NULL), CFX_ERR_INVALID_ARGUMENT, fn);
    cfx_tensor t = good;
    t.dtype = CFX_DTYPE_COUNT;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    t.dtype = -1;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    int64_t neg[2] = {4, -1};
    t = good;
    t.shape = neg;
    t.ndim = 2;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    CHECK(strstr(mt_last_error_copy(), "-1") != NULL, "negative dim message lacks the value: %s",
          mt_last_error_copy());
    t = good;
    t.ndim = CFX_MAX_NDIM + 1;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    t.ndim = -1;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    t = good;
    t.shape = NULL;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    int64_t huge[3] = {(int64_t)1 << 40, (int64_t)1 << 40, 8};
    t = good;
    t.shape = huge;
    t.ndim = 3;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    int64_t big1[1] = {INT64_MAX};
    t = good;
    t.shape = big1;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    t = good;
    t.data = NULL;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    t = good;
    t.device = -7;
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    t.device = 0; /* a CUDA ordinal: a CPU-only build refuses it as unsupported; a CUDA build
                     on a machine without a usable device says so (CFX_ERR_CUDA) */
    if (!(cfx_features() & CFX_FEATURE_CUDA))
        CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_UNSUPPORTED, fn);
    else if (!(cfx_features() & CFX_FEATURE_CUDA_DEVICE))
        CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_CUDA,
                    "no CUDA device is usable");

    /* Ops, scale factors, names. */
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &good, NULL, (cfx_reduce_op)CFX_OP_COUNT, 1, 1, &h),
                CFX_ERR_INVALID_ARGUMENT, fn);
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &good, NULL, (cfx_reduce_op)-1, 1, 1, &h),
                CFX_ERR_INVALID_ARGUMENT, fn);
    uint8_t bools[4] = {1, 0, 1, 1};
    cfx_tensor bt = {bools, shape, 1, CFX_BOOL, CFX_DEVICE_CPU, NULL};
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &bt, NULL, CFX_OP_AVERAGE, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    CHECK_FAILS(cfx_reducescatter_async(ctx, "bad", &bt, CFX_OP_AVERAGE, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT,
                "cfx_reducescatter_async");
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &good, NULL, CFX_OP_SUM, NAN, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    CHECK_FAILS(cfx_allreduce_async(ctx, "bad", &good, NULL, CFX_OP_SUM, 1, INFINITY, &h),
                CFX_ERR_INVALID_ARGUMENT, fn);
    CHECK_FAILS(cfx_allreduce_async(ctx, "", &good, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    char *longname = malloc(5000);
    memset(longname, 'n', 4999);
    longname[4999] = '\0';
    CHECK_FAILS(cfx_allreduce_async(ctx, longname, &good, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT, fn);
    free(longname);

    /* Grouped forms: count 0, NULL inputs, one bad member refuses the whole group. */
    CHECK_FAILS(cfx_grouped_allreduce_async(ctx, "g", 0, &good, NULL, CFX_OP_SUM, 1, 1, &h),
                CFX_ERR_INVALID_ARGUMENT, "cfx_grouped_allreduce_async");
    CHECK_FAILS(cfx_grouped_allreduce_async(ctx, "g", 2, NULL, NULL, CFX_OP_SUM, 1, 1, &h),
                CFX_ERR_INVALID_ARGUMENT, "cfx_grouped_allreduce_async");
    float w[4] = {1, 1, 1, 1};
    cfx_tensor pair[2] = {{w, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL},
                          {NULL, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL}};
    CHECK_FAILS(cfx_grouped_allreduce_async(ctx, "g.partial", 2, pair, NULL, CFX_OP_SUM, 1, 1, &h),
                CFX_ERR_INVALID_ARGUMENT, "cfx_grouped_allreduce_async");
    CHECK_FAILS(cfx_grouped_allgather_async(ctx, "g", 0, &good, &h), CFX_ERR_INVALID_ARGUMENT,
                "cfx_grouped_allgather_async");
    CHECK_FAILS(cfx_grouped_reducescatter_async(ctx, "g", 0, &good, CFX_OP_SUM, 1, 1, &h),
                CFX_ERR_INVALID_ARGUMENT, "cfx_grouped_reducescatter_async");

    /* Other collectives' own checks. */
    CHECK_FAILS(cfx_broadcast_async(ctx, "bad", &good, -1, &h), CFX_ERR_INVALID_ARGUMENT, "cfx_broadcast_async");
    CHECK_FAILS(cfx_broadcast_async(ctx, "bad", &good, mt_size, &h), CFX_ERR_INVALID_ARGUMENT,
                "cfx_broadcast_async");
    CHECK_FAILS(cfx_broadcast_async(ctx, "bad", NULL, 0, &h), CFX_ERR_INVALID_ARGUMENT, "cfx_broadcast_async");
    cfx_tensor scalar = {v, NULL, 0, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_FAILS(cfx_allgather_async(ctx, "bad", &scalar, &h), CFX_ERR_INVALID_ARGUMENT, "cfx_allgather_async");
    CHECK_FAILS(cfx_reducescatter_async(ctx, "bad", &scalar, CFX_OP_SUM, 1, 1, &h), CFX_ERR_INVALID_ARGUMENT,
                "cfx_reducescatter_async");
    CHECK_FAILS(cfx_alltoall_async(ctx, "bad", &scalar, NULL, 0, &h), CFX_ERR_INVALID_ARGUMENT,
                "cfx_alltoall_async");
    CHECK_FAILS(cfx_barrier_async(ctx, NULL), CFX_ERR_INVALID_ARGUMENT, "cfx_barrier_async");
    CHECK_FAILS(cfx_join_async(ctx, NULL), CFX_ERR_INVALID_ARGUMENT, "cfx_join_async");
    CHECK_FAILS(cfx_wait(ctx, 1, NAN), CFX_ERR_INVALID_ARGUMENT, "cfx_wait");
    CHECK_FAILS(cfx_poll(ctx, 1, NULL), CFX_ERR_INVALID_ARGUMENT, "cfx_poll");

    /* Names and enums as text. */
    for (int s = 0; s <= CFX_ERR_NCCL + 1; s++)
        CHECK(cfx_status_string((cfx_status)s) && cfx_status_string((cfx_status)s)[0],
              "cfx_status_string(%d) is empty", s);
    CHECK(cfx_status_string((cfx_status)-3) != NULL, "cfx_status_string(-3) is NULL");
    CHECK(strcmp(cfx_dtype_name((cfx_dtype)99), "unknown") == 0 && cfx_dtype_size((cfx_dtype)99) == 0,
          "dtype 99 has a name or size");
    CHECK(strcmp(cfx_dtype_name(CFX_BFLOAT16), "bfloat16") == 0 && cfx_dtype_size(CFX_INT64) == 8,
          "dtype names/sizes");
    CHECK(strcmp(cfx_op_name((cfx_reduce_op)99), "unknown") == 0, "op 99 has a name");

    /* None of the refused calls left anything in flight: the same names (and the partial group)
     * work now, on every rank. */
    cfx_handle h1 = 0, h2 = 0;
    float x[4] = {1, 2, 3, 4}, y[4] = {5, 5, 5, 5};
    cfx_tensor tx = {x, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_tensor ty[2] = {{y, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL},
                        {w, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL}};
    CHECK_OK(cfx_allreduce_async(ctx, "bad", &tx, NULL, CFX_OP_SUM, 1, 1, &h1));
    CHECK_OK(cfx_grouped_allreduce_async(ctx, "g.partial", 2, ty, NULL, CFX_OP_SUM, 1, 1, &h2));
    mt_wait_expect(ctx, h1, CFX_OK, "allreduce after local errors");
    mt_wait_expect(ctx, h2, CFX_OK, "grouped allreduce after a refused group");
    for (int i = 0; i < 4; i++)
        CHECK(x[i] == (float)(mt_size * (i + 1)) && y[i] == 5.0f * mt_size && w[i] == (float)mt_size,
              "after local errors: element %d = %g %g %g", i, (double)x[i], (double)y[i], (double)w[i]);
    mt_close(ctx);
    mt_finish();
}

static void test_duplicate_name(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    int32_t a[3] = {mt_rank, 1, 2}, b[3] = {9, 9, 9};
    int64_t shape[1] = {3};
    cfx_tensor ta = {a, shape, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
    cfx_tensor tb = {b, shape, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h1 = 0, h2 = 0, h3 = 0;
    /* Rank 0 waits in a barrier first so the other ranks' "dup" cannot complete before the
     * second submission on any rank (it needs rank 0's). */
    if (mt_rank == 0)
        mt_barrier();
    CHECK_OK(cfx_allreduce_async(ctx, "dup", &ta, NULL, CFX_OP_SUM, 1, 1, &h1));
    CHECK_FAILS(cfx_allreduce_async(ctx, "dup", &tb, NULL, CFX_OP_SUM, 1, 1, &h2), CFX_ERR_DUPLICATE_NAME,
                "dup");
    CHECK_FAILS(cfx_allgather_async(ctx, "dup", &tb, &h2), CFX_ERR_DUPLICATE_NAME, "dup");
    if (mt_rank != 0)
        mt_barrier();
    mt_wait_expect(ctx, h1, CFX_OK, "first 'dup'");
    CHECK(a[0] == mt_size * (mt_size - 1) / 2 && a[1] == mt_size && a[2] == 2 * mt_size,
          "'dup' result %d %d %d", a[0], a[1], a[2]);
    CHECK(b[0] == 9, "the refused duplicate touched its buffer");
    /* Completed: the name may be reused. */
    CHECK_OK(cfx_allreduce_async(ctx, "dup", &tb, NULL, CFX_OP_MAX, 1, 1, &h3));
    mt_wait_expect(ctx, h3, CFX_OK, "reused 'dup'");
    CHECK(b[0] == 9 && b[2] == 9, "reused 'dup' max = %d", b[0]);
    mt_close(ctx);
    mt_finish();
}

static void test_stale_handles(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    float v[2] = {1, 2}, d[1000];
    int64_t shape[1] = {2}, dshape[1] = {1000};
    cfx_tensor t = {v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    CHECK_OK(cfx_allreduce_async(ctx, "stale", &t, NULL, CFX_OP_SUM, 1, 1, &h));
    CHECK(h != 0, "handle 0 returned");
    CHECK_OK(mt_wait(ctx, h));
    int done = 0;
    CHECK_OK(cfx_poll(ctx, h, &done));
    CHECK(done == 1, "completed handle polls %d", done);
    const char *m = cfx_handle_message(ctx, h);
    CHECK(m && m[0] == '\0', "a successful handle's message is '%s'", m ? m : "(null)");
    /* An allreduce has no outputs Conflux allocated: asking for one is an error, not a crash. */
    size_t count = 9;
    cfx_tensor o;
    char dst[16];
    const int64_t *splits;
    int jr;
    CHECK_OK(cfx_handle_output_count(ctx, h, &count));
    CHECK(count == 0, "allreduce reports %zu outputs", count);
    CHECK(cfx_handle_output(ctx, h, 0, &o) != CFX_OK, "output 0 of an allreduce");
    CHECK(cfx_handle_output_copy(ctx, h, 0, dst, sizeof dst) != CFX_OK, "output_copy 0 of an allreduce");
    CHECK(cfx_handle_splits(ctx, h, 0, &splits) != CFX_OK, "splits of an allreduce");
    CHECK(cfx_handle_join_rank(ctx, h, &jr) != CFX_OK, "join rank of an allreduce");
    CHECK_OK(cfx_handle_release(ctx, h));
    CHECK_ST(cfx_handle_release(ctx, h), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_wait(ctx, h, 0.0), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_wait(ctx, h, -1.0), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_poll(ctx, h, &done), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_status(ctx, h), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_output_count(ctx, h, &count), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_output(ctx, h, 0, &o), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_output_copy(ctx, h, 0, dst, sizeof dst), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_splits(ctx, h, 0, &splits), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_join_rank(ctx, h, &jr), CFX_ERR_STALE_HANDLE);
    CHECK(cfx_handle_message(ctx, h) == NULL, "message of a released handle is not NULL");
    CHECK_ST(cfx_handle_release(ctx, 0), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_wait(ctx, 0, 0.0), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_status(ctx, 0xdeadbeefcafeull), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_release(ctx, h + 1000), CFX_ERR_STALE_HANDLE);
    CHECK(v[0] == (float)mt_size, "stale: result %g", (double)v[0]);

    /* Releasing a pending handle detaches it: the collective still runs. */
    for (int i = 0; i < 1000; i++)
        d[i] = (float)(i + mt_rank);
    cfx_tensor td = {d, dshape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle hd = 0, ha = 0;
    CHECK_OK(cfx_allreduce_async(ctx, "detached", &td, NULL, CFX_OP_SUM, 1, 1, &hd));
    CHECK_OK(cfx_handle_release(ctx, hd));
    /* Released means stale for every call, whether or not the collective has finished. */
    CHECK_ST(cfx_handle_release(ctx, hd), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_handle_status(ctx, hd), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_wait(ctx, hd, 0.0), CFX_ERR_STALE_HANDLE);
    CHECK_ST(cfx_poll(ctx, hd, &done), CFX_ERR_STALE_HANDLE);
    CHECK(cfx_handle_message(ctx, hd) == NULL, "message of a released pending handle is not NULL");
    CHECK_OK(cfx_allreduce_async(ctx, "after.detached", &t, NULL, CFX_OP_SUM, 1, 1, &ha));
    mt_wait_expect(ctx, ha, CFX_OK, "allreduce after a detached one");
    for (int i = 0; i < 1000; i++)
        if (d[i] != (float)(mt_size * i + mt_size * (mt_size - 1) / 2)) {
            CHECK(0, "detached allreduce element %d = %g", i, (double)d[i]);
            break;
        }
    mt_close(ctx);
    mt_finish();
}

/* Rank 0 alone submits "lonely": its wait times out and the handle stays pending; the others submit
 * it afterwards and it completes everywhere. */
static void test_wait_timeout(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    int64_t v = mt_rank + 1;
    cfx_tensor t = {&v, NULL, 0, CFX_INT64, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    if (mt_rank == 0) {
        CHECK_OK(cfx_allreduce_async(ctx, "lonely", &t, NULL, CFX_OP_SUM, 1, 1, &h));
        CHECK_ST(cfx_wait(ctx, h, 0.2), CFX_ERR_TIMEOUT);
        CHECK_ST(cfx_wait(ctx, h, 0.0), CFX_ERR_TIMEOUT);
        int done = 7;
        CHECK_OK(cfx_poll(ctx, h, &done));
        CHECK(done == 0, "pending handle polls %d", done);
        CHECK_ST(cfx_handle_status(ctx, h), CFX_ERR_IN_PROGRESS);
        const char *m = cfx_handle_message(ctx, h);
        CHECK(m && m[0] == '\0', "pending handle message '%s'", m ? m : "(null)");
        size_t count;
        CHECK(cfx_handle_output_count(ctx, h, &count) != CFX_OK, "output count of a pending handle");
        CHECK(v == 1, "the pending tensor changed to %lld", (long long)v);
    }
    mt_barrier();
    if (mt_rank != 0)
        CHECK_OK(cfx_allreduce_async(ctx, "lonely", &t, NULL, CFX_OP_SUM, 1, 1, &h));
    mt_wait_expect(ctx, h, CFX_OK, "'lonely' after the timeout");
    CHECK(v == mt_size * (mt_size + 1) / 2, "'lonely' = %lld", (long long)v);
    mt_close(ctx);
    mt_finish();
}

typedef struct mm_case {
    const char *name;
    const char *sub1, *sub2; /* both values as the message must show them */
} mm_case;

/* Rank 0 disagrees with the others on dtype, shape, ndim, op, prescale, postscale, collective and
 * grouping; every rank gets CFX_ERR_MISMATCH naming the tensor and both values. A correct tensor
 * in flight at the same time, and the same names right after, succeed. */
static void test_mismatch(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    int odd = mt_rank != 0;
    float f[20];
    int32_t i32[20];
    for (int i = 0; i < 20; i++)
        f[i] = 1.0f, i32[i] = 1;
    int64_t s34[2] = {3, 4}, s35[2] = {3, 5}, s12[1] = {12};
    mm_case cases[] = {{"mm.dtype", "float32", "int32"},      {"mm.shape", "[3, 4]", "[3, 5]"},
                       {"mm.ndim", "[12]", "[3, 4]"},         {"mm.op", "sum", "max"},
                       {"mm.prescale", "prescale 1", "prescale 2"}, {"mm.postscale", "postscale 1", "postscale 0.5"},
                       {"mm.coll", "allreduce", "broadcast"}, {"mm.group", "mm.group", "group"}};
    enum { NC = sizeof cases / sizeof cases[0] };
    cfx_handle h[NC] = {0}, hgood = 0;
    float good[5] = {1, 2, 3, 4, 5};
    int64_t s5[1] = {5};
    cfx_tensor tg = {good, s5, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_allreduce_async(ctx, "mm.good", &tg, NULL, CFX_OP_SUM, 1, 1, &hgood));
    cfx_tensor t;
    t = (cfx_tensor){odd ? (void *)i32 : (void *)f, s34, 2, odd ? CFX_INT32 : CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_allreduce_async(ctx, "mm.dtype", &t, NULL, CFX_OP_SUM, 1, 1, &h[0]));
    t = (cfx_tensor){f, odd ? s35 : s34, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_allreduce_async(ctx, "mm.shape", &t, NULL, CFX_OP_SUM, 1, 1, &h[1]));
    t = (cfx_tensor){f, odd ? s34 : s12, odd ? 2 : 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_allreduce_async(ctx, "mm.ndim", &t, NULL, CFX_OP_SUM, 1, 1, &h[2]));
    t = (cfx_tensor){f, s34, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_allreduce_async(ctx, "mm.op", &t, NULL, odd ? CFX_OP_MAX : CFX_OP_SUM, 1, 1, &h[3]));
    float f2[12], f3[12], f4[12];
    for (int i = 0; i < 12; i++)
        f2[i] = f3[i] = f4[i] = 2.0f;
    cfx_tensor t2 = {f2, s34, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_tensor t3 = {f3, s34, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_tensor t4 = {f4, s34, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CHECK_OK(cfx_allreduce_async(ctx, "mm.prescale", &t2, NULL, CFX_OP_SUM, odd ? 2.0 : 1.0, 1, &h[4]));
    CHECK_OK(cfx_allreduce_async(ctx, "mm.postscale", &t3, NULL, CFX_OP_SUM, 1, odd ? 0.5 : 1.0, &h[5]));
    if (odd)
        CHECK_OK(cfx_broadcast_async(ctx, "mm.coll", &t4, 0, &h[6]));
    else
        CHECK_OK(cfx_allreduce_async(ctx, "mm.coll", &t4, NULL, CFX_OP_SUM, 1, 1, &h[6]));
    /* Rank 0 submits "mm.group.0" as a plain tensor, the others as member 0 of group "mm.group". */
    float g0[3] = {1, 1, 1};
    int64_t s3[1] = {3};
    cfx_tensor tgr = {g0, s3, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    if (odd)
        CHECK_OK(cfx_grouped_allreduce_async(ctx, "mm.group", 1, &tgr, NULL, CFX_OP_SUM, 1, 1, &h[7]));
    else
        CHECK_OK(cfx_allreduce_async(ctx, "mm.group.0", &tgr, NULL, CFX_OP_SUM, 1, 1, &h[7]));
    for (int c = 0; c < NC; c++) {
        cfx_status st = mt_wait(ctx, h[c]);
        const char *m = cfx_handle_message(ctx, h[c]);
        CHECK(st == CFX_ERR_MISMATCH, "%s: status %s (message: %s)", cases[c].name, cfx_status_string(st),
              m ? m : "(null)");
        CHECK(mt_contains(m, cases[c].name) && mt_contains(m, cases[c].sub1) && mt_contains(m, cases[c].sub2),
              "%s: message does not name the tensor and both values ('%s', '%s'): %s", cases[c].name,
              cases[c].sub1, cases[c].sub2, m ? m : "(null)");
        CHECK(mt_contains(m, "rank 0"), "%s: message does not name rank 0: %s", cases[c].name, m ? m : "(null)");
        CHECK_ST(cfx_handle_status(ctx, h[c]), CFX_ERR_MISMATCH);
        CHECK_OK(cfx_handle_release(ctx, h[c]));
    }
    mt_wait_expect(ctx, hgood, CFX_OK, "a good tensor next to mismatches");
    CHECK(good[0] == (float)mt_size && good[4] == 5.0f * mt_size, "mm.good = %g", (double)good[0]);
    for (int i = 0; i < 12; i++)
        CHECK(f[i] == 1.0f && i32[i] == 1, "a mismatched tensor's buffer changed at %d", i);

    /* The job goes on: the same names, now consistent, succeed. */
    for (int c = 0; c < 6; c++) {
        float x[12];
        for (int i = 0; i < 12; i++)
            x[i] = (float)(mt_rank + i);
        cfx_tensor tx = {x, s34, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_handle hh = 0;
        CHECK_OK(cfx_allreduce_async(ctx, cases[c].name, &tx, NULL, CFX_OP_SUM, 1, 1, &hh));
        mt_wait_expect(ctx, hh, CFX_OK, "allreduce after a mismatch");
        for (int i = 0; i < 12; i++)
            CHECK(x[i] == (float)(mt_size * (mt_size - 1) / 2 + mt_size * i), "%s after mismatch [%d] = %g",
                  cases[c].name, i, (double)x[i]);
        CHECK(mt_identical_across_ranks(x, sizeof x), "results differ across ranks");
    }
    mt_close(ctx);
    mt_finish();
}

/* A tensor that went through the response cache, then is submitted differently by rank 0 only
 * (dtype, shape, op, prescale): still a mismatch on every rank, never a stale cached answer or a
 * hang; consistent again, it succeeds. */
static void test_mismatch_after_cache(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    int64_t s4[1] = {4}, s5[1] = {5};
    struct { const char *what, *sub1, *sub2; } kinds[4] = {
        {"dtype", "float32", "int32"}, {"shape", "[4]", "[5]"}, {"op", "sum", "min"},
        {"prescale", "prescale 1", "prescale 3"}};
    for (int step = 0; step < 6; step++) {
        int kind = step - 2; /* steps 0, 1: consistent (the second from the cache) */
        float f[5];
        int32_t i32[5];
        for (int i = 0; i < 5; i++)
            f[i] = (float)(mt_rank + i), i32[i] = mt_rank + i;
        int deviant = mt_rank == 0 && kind >= 0;
        cfx_tensor t = {f, s4, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_reduce_op op = CFX_OP_SUM;
        double pre = 1.0;
        if (deviant && kind == 0)
            t.data = i32, t.dtype = CFX_INT32;
        if (deviant && kind == 1)
            t.shape = s5;
        if (deviant && kind == 2)
            op = CFX_OP_MIN;
        if (deviant && kind == 3)
            pre = 3.0;
        cfx_handle h = 0;
        CHECK_OK(cfx_allreduce_async(ctx, "cached.t", &t, NULL, op, pre, 1.0, &h));
        cfx_status st = mt_wait(ctx, h);
        const char *m = cfx_handle_message(ctx, h);
        if (kind < 0) {
            CHECK(st == CFX_OK, "step %d: %s (%s)", step, cfx_status_string(st), m ? m : "(null)");
            for (int i = 0; i < 4; i++)
                CHECK(f[i] == (float)(mt_size * (mt_size - 1) / 2 + mt_size * i), "step %d [%d] = %g", step,
                      i, (double)f[i]);
        } else {
            CHECK(st == CFX_ERR_MISMATCH, "cached tensor, then a different %s on rank 0: %s (%s)",
                  kinds[kind].what, cfx_status_string(st), m ? m : "(null)");
            CHECK(mt_contains(m, "cached.t") && mt_contains(m, kinds[kind].sub1) &&
                  mt_contains(m, kinds[kind].sub2), "cached %s mismatch message lacks '%s'/'%s': %s",
                  kinds[kind].what, kinds[kind].sub1, kinds[kind].sub2, m ? m : "(null)");
            CHECK(f[0] == (float)mt_rank && i32[0] == mt_rank, "a mismatched cached tensor changed data");
        }
        CHECK_OK(cfx_handle_release(ctx, h));
    }
    /* Consistent again. */
    float f[4] = {1, 1, 1, 1};
    cfx_tensor t = {f, s4, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    CHECK_OK(cfx_allreduce_async(ctx, "cached.t", &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
    mt_wait_expect(ctx, h, CFX_OK, "consistent again after cached mismatches");
    CHECK(f[3] == (float)mt_size, "after cached mismatches: %g", (double)f[3]);
    mt_close(ctx);
    mt_finish();
}

/* Shutdown is idempotent; later calls fail with CFX_ERR_SHUT_DOWN; queries still work; a freed
 * context can be replaced by a new one (MPI is not finalised), twice. */
static void test_after_shutdown_and_reinit(void **state)
{
    (void)state;
    for (int round = 0; round < 3; round++) {
        cfx_context *ctx = mt_open();
        int32_t v[2] = {mt_rank, round};
        int64_t shape[1] = {2};
        cfx_tensor t = {v, shape, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
        cfx_handle h = 0, h2 = 0;
        CHECK_OK(cfx_allreduce_async(ctx, "round", &t, NULL, CFX_OP_SUM, 1, 1, &h));
        CHECK_OK(mt_wait(ctx, h));
        CHECK(v[0] == mt_size * (mt_size - 1) / 2 && v[1] == round * mt_size, "round %d: %d %d", round,
              v[0], v[1]);
        CHECK_OK(cfx_shutdown(ctx));
        CHECK_OK(cfx_shutdown(ctx));
        CHECK(cfx_is_running(ctx) == 0, "running after shutdown");
        CHECK(cfx_rank(ctx) == mt_rank && cfx_size(ctx) == mt_size, "topology after shutdown");
        CHECK_OK(cfx_handle_status(ctx, h)); /* a completed handle stays queryable */
        const char *fn = "";
        CHECK_FAILS(cfx_allreduce_async(ctx, "late", &t, NULL, CFX_OP_SUM, 1, 1, &h2), CFX_ERR_SHUT_DOWN, fn);
        CHECK_FAILS(cfx_allgather_async(ctx, "late", &t, &h2), CFX_ERR_SHUT_DOWN, fn);
        CHECK_FAILS(cfx_broadcast_async(ctx, "late", &t, 0, &h2), CFX_ERR_SHUT_DOWN, fn);
        CHECK_FAILS(cfx_alltoall_async(ctx, "late", &t, NULL, 0, &h2), CFX_ERR_SHUT_DOWN, fn);
        CHECK_FAILS(cfx_reducescatter_async(ctx, "late", &t, CFX_OP_SUM, 1, 1, &h2), CFX_ERR_SHUT_DOWN, fn);
        CHECK_FAILS(cfx_barrier_async(ctx, &h2), CFX_ERR_SHUT_DOWN, fn);
        CHECK_FAILS(cfx_join_async(ctx, &h2), CFX_ERR_SHUT_DOWN, fn);
        CHECK_OK(cfx_handle_release(ctx, h));
        cfx_context_free(ctx);
    }
    mt_finish();
}

/* Rank 1 shuts down while rank 0 (and the others) wait on a tensor rank 1 never submits: their
 * handles fail with CFX_ERR_SHUT_DOWN naming rank 1, and their contexts stop. A new context works. */
static void test_shutdown_while_others_wait(void **state)
{
    (void)state;
    cfx_context *ctx = mt_open();
    float v[3] = {1, 2, 3};
    int64_t shape[1] = {3};
    cfx_tensor t = {v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    if (mt_rank != 1)
        CHECK_OK(cfx_allreduce_async(ctx, "orphan", &t, NULL, CFX_OP_SUM, 1, 1, &h));
    mt_barrier();
    if (mt_rank == 1) {
        usleep(100000);
        CHECK_OK(cfx_shutdown(ctx));
        CHECK(cfx_is_running(ctx) == 0, "rank 1 still running after its shutdown");
        CHECK_ST(cfx_allreduce_async(ctx, "orphan", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_SHUT_DOWN);
    } else {
        cfx_status st = cfx_wait(ctx, h, 30.0);
        const char *m = cfx_handle_message(ctx, h);
        CHECK(st == CFX_ERR_SHUT_DOWN, "orphan: wait returned %s (message %s)", cfx_status_string(st),
              m ? m : "(null)");
        CHECK(mt_contains(m, "shut down") && (mt_contains(m, "rank 1") || mt_contains(m, "[1]")),
              "orphan: message does not name rank 1: %s", m ? m : "(null)");
        CHECK(v[0] == 1 && v[2] == 3, "orphan buffer changed");
        for (int i = 0; i < 100 && cfx_is_running(ctx); i++)
            usleep(10000);
        CHECK(cfx_is_running(ctx) == 0, "rank %d still running after rank 1 shut down", mt_rank);
        CHECK_ST(cfx_allreduce_async(ctx, "after.orphan", &t, NULL, CFX_OP_SUM, 1, 1, &h), CFX_ERR_SHUT_DOWN);
    }
    mt_close(ctx);
    mt_barrier();

    ctx = mt_open();
    CHECK_OK(cfx_allreduce_async(ctx, "orphan", &t, NULL, CFX_OP_SUM, 1, 1, &h));
    mt_wait_expect(ctx, h, CFX_OK, "allreduce in a new context after a remote shutdown");
    CHECK(v[1] == 2.0f * mt_size, "new context: %g", (double)v[1]);
    mt_close(ctx);
    mt_finish();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local_argument_errors),
        cmocka_unit_test(test_duplicate_name),
        cmocka_unit_test(test_stale_handles),
        cmocka_unit_test(test_wait_timeout),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_mismatch_after_cache),
        cmocka_unit_test(test_after_shutdown_and_reinit),
        cmocka_unit_test(test_shutdown_while_others_wait),
    };
    return MT_RUN(argc, argv, tests);
}
