/* mpitest.c - implements mpitest.h. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "mpitest.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int mt_rank = -1, mt_size = 0;
int mt_failures = 0;

void mt_report(const char *file, int line, const char *fmt, ...)
{
    mt_failures++;
    if (mt_failures > 25)
        return; /* the count is still reported by mt_finish */
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("[rank %d/%d] %s:%d: FAILED: %s\n", mt_rank, mt_size, file, line, msg);
    fflush(stdout);
}

const char *mt_last_error_copy(void)
{
    static _Thread_local char buf[1024];
    snprintf(buf, sizeof buf, "%s", cfx_last_error());
    return buf;
}

void mt_barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }

void mt_finish(void)
{
    int mine = mt_failures, total = 0, ranks = mine ? 1 : 0, failed_ranks = 0;
    MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&ranks, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    mt_failures = 0;
    if (total)
        fail_msg("rank %d: %d check(s) failed on %d of %d ranks (%d on this rank; see the "
                 "[rank r/n] lines above)", mt_rank, total, failed_ranks, mt_size, mine);
}

cfx_context *mt_open_opts(int64_t fusion_threshold, int64_t chunk_bytes, int deterministic,
                          int64_t cache_capacity)
{
    cfx_init_options o;
    CHECK_OK(cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION));
    /* MPI, unless CFX_TRANSPORT names another: the same programs test the Gloo transport, with
     * mpirun only starting the ranks and agreeing on results (tests/rendezvous). */
    o.transport = getenv("CFX_TRANSPORT") ? -1 : CFX_TRANSPORT_MPI;
    o.fusion_threshold_bytes = fusion_threshold;
    o.chunk_bytes = chunk_bytes;
    o.deterministic = deterministic;
    o.cache_capacity = cache_capacity;
    cfx_context *ctx = NULL;
    cfx_status st = cfx_init(&o, &ctx);
    if (st != CFX_OK || !ctx) {
        /* Nothing can go on without a context: stop the job with a readable message. */
        printf("[rank %d] cfx_init failed: %s: %s\n", mt_rank, cfx_status_string(st), cfx_last_error());
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    CHECK(cfx_rank(ctx) == mt_rank, "cfx_rank %d but MPI rank %d", cfx_rank(ctx), mt_rank);
    CHECK(cfx_size(ctx) == mt_size, "cfx_size %d but MPI size %d", cfx_size(ctx), mt_size);
    CHECK(cfx_is_running(ctx) == 1, "a fresh context is not running");
    return ctx;
}

cfx_context *mt_open(void) { return mt_open_opts(-1, -1, -1, -1); }

void mt_close(cfx_context *ctx)
{
    if (!ctx)
        return;
    CHECK_OK(cfx_shutdown(ctx));
    cfx_context_free(ctx);
}

cfx_status mt_wait(cfx_context *ctx, cfx_handle h)
{
    cfx_status st = cfx_wait(ctx, h, 60.0);
    if (st == CFX_ERR_TIMEOUT)
        CHECK(0, "handle %llu did not complete within 60 s", (unsigned long long)h);
    return st;
}

void mt_wait_expect(cfx_context *ctx, cfx_handle h, cfx_status want, const char *what)
{
    cfx_status st = mt_wait(ctx, h);
    const char *m = cfx_handle_message(ctx, h);
    CHECK(st == want, "%s: wait returned %d (%s), expected %d (%s); message: %s", what, (int)st,
          cfx_status_string(st), (int)want, cfx_status_string(want), m ? m : "(null)");
    CHECK_ST(cfx_handle_status(ctx, h), st);
    CHECK_OK(cfx_handle_release(ctx, h));
}

/* ---- element access ------------------------------------------------------------------------- */

static uint16_t to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    uint32_t lsb = (x >> 16) & 1u;
    return (uint16_t)((x + 0x7fffu + lsb) >> 16);
}

static float from_bf16(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

void mt_put(void *buf, cfx_dtype dt, size_t i, double v)
{
    switch (dt) {
    case CFX_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case CFX_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case CFX_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case CFX_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case CFX_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case CFX_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case CFX_FLOAT16: ((_Float16 *)buf)[i] = (_Float16)v; break;
    case CFX_BFLOAT16: ((uint16_t *)buf)[i] = to_bf16((float)v); break;
    case CFX_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case CFX_FLOAT64: ((double *)buf)[i] = v; break;
    case CFX_BOOL: ((uint8_t *)buf)[i] = (uint8_t)(v != 0.0 ? (v > 0 && v < 256 ? v : 1) : 0); break;
    }
}

double mt_get(const void *buf, cfx_dtype dt, size_t i)
{
    switch (dt) {
    case CFX_UINT8: return ((const uint8_t *)buf)[i];
    case CFX_INT8: return ((const int8_t *)buf)[i];
    case CFX_UINT16: return ((const uint16_t *)buf)[i];
    case CFX_INT16: return ((const int16_t *)buf)[i];
    case CFX_INT32: return ((const int32_t *)buf)[i];
    case CFX_INT64: return (double)((const int64_t *)buf)[i];
    case CFX_FLOAT16: return (double)((const _Float16 *)buf)[i];
    case CFX_BFLOAT16: return from_bf16(((const uint16_t *)buf)[i]);
    case CFX_FLOAT32: return ((const float *)buf)[i];
    case CFX_FLOAT64: return ((const double *)buf)[i];
    case CFX_BOOL: return ((const uint8_t *)buf)[i];
    }
    return NAN;
}

int mt_is_float(cfx_dtype dt)
{
    return dt == CFX_FLOAT16 || dt == CFX_BFLOAT16 || dt == CFX_FLOAT32 || dt == CFX_FLOAT64;
}

int mt_is_signed(cfx_dtype dt)
{
    return dt == CFX_INT8 || dt == CFX_INT16 || dt == CFX_INT32 || dt == CFX_INT64 || mt_is_float(dt);
}

int mt_close_enough(cfx_dtype dt, double got, double want, double rel_scale)
{
    if (!mt_is_float(dt) || rel_scale == 0.0)
        return got == want;
    double eps = dt == CFX_FLOAT16 ? 1.0 / 1024 : dt == CFX_BFLOAT16 ? 1.0 / 128
               : dt == CFX_FLOAT32 ? 1.0 / 8388608 : 1.0 / 4503599627370496.0;
    return fabs(got - want) <= rel_scale * eps * (fabs(want) > 1.0 ? fabs(want) : 1.0);
}

int mt_identical_across_ranks(const void *buf, size_t bytes)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = buf;
    for (size_t i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    h ^= (uint64_t)bytes;
    uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

uint64_t mt_rand(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

void mt_shuffle(int *idx, int n, uint64_t *state)
{
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(mt_rand(state) % (uint64_t)(i + 1));
        int t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
}

/* Input of rank r, tensor t, element i for a dtype/op pair: small integers, so every sum, product,
 * min and max over 4 ranks is exact in every dtype (float16 and bfloat16 included). */
double mt_value(cfx_dtype dt, cfx_reduce_op op, int r, int t, size_t i)
{
    int sgn = mt_is_signed(dt);
    long k = (long)i;
    if (dt == CFX_BOOL) /* zero, or a non-zero byte of 1 or 2 (any non-zero reads as true) */
        return (r * 5 + t + k * 7) % 4 == 0 ? 0 : (k % 2 ? 1 : 2);
    switch (op) {
    case CFX_OP_SUM:
    case CFX_OP_AVERAGE:
    case CFX_OP_ADASUM: {
        long v = (r * 7 + t * 3 + k * 5) % 11; /* |sum| <= 40 */
        return (double)(sgn ? v - 5 : v);
    }
    case CFX_OP_MIN:
    case CFX_OP_MAX: {
        long v = (r * 13 + t + k * 5) % 23;
        return (double)(sgn ? v - 11 : v);
    }
    case CFX_OP_PRODUCT: {
        long v = (r + t + k) % (sgn ? 4 : 3);
        return (double)(sgn ? v - 1 : v + 1); /* {-1,0,1,2} or {1,2,3}: |product| <= 81 */
    }
    }
    return 0;
}

/* Truncation toward zero with saturation, as the documented integer scaling does. */
double mt_int_scale(cfx_dtype dt, double x, double f)
{
    double v = trunc(x * f);
    double lo = 0, hi = 0;
    switch (dt) {
    case CFX_UINT8: lo = 0, hi = 255; break;
    case CFX_INT8: lo = -128, hi = 127; break;
    case CFX_UINT16: lo = 0, hi = 65535; break;
    case CFX_INT16: lo = -32768, hi = 32767; break;
    case CFX_INT32: lo = -2147483648.0, hi = 2147483647.0; break;
    default: return v;
    }
    return v < lo ? lo : v > hi ? hi : v;
}

/* Expected result over all ranks of postscale * op(prescale * x_r), computed in double. */
double mt_expected(cfx_dtype dt, cfx_reduce_op op, int t, size_t i, double pre, double post)
{
    return mt_expected_skip(dt, op, t, i, pre, post, -1);
}

double mt_expected_skip(cfx_dtype dt, cfx_reduce_op op, int t, size_t i, double pre, double post,
                        int skip_rank)
{
    double acc = 0;
    int first = 1;
    for (int r = 0; r < mt_size; r++) {
        if (r == skip_rank)
            continue;
        double x = mt_value(dt, op, r, t, i);
        if (dt == CFX_BOOL) {
            int b = x != 0 && pre != 0;
            if (first)
                acc = b;
            else if (op == CFX_OP_SUM || op == CFX_OP_MAX)
                acc = acc || b;
            else
                acc = acc && b;
            first = 0;
            continue;
        }
        x = mt_is_float(dt) ? x * pre : mt_int_scale(dt, x, pre);
        if (first)
            acc = x;
        else if (op == CFX_OP_SUM || op == CFX_OP_AVERAGE)
            acc += x;
        else if (op == CFX_OP_MIN)
            acc = x < acc ? x : acc;
        else if (op == CFX_OP_MAX)
            acc = x > acc ? x : acc;
        else
            acc *= x;
        first = 0;
    }
    if (dt == CFX_BOOL)
        return acc != 0 && post != 0;
    double f = op == CFX_OP_AVERAGE ? post / mt_size : post;
    return mt_is_float(dt) ? acc * f : mt_int_scale(dt, acc, f);
}

int mt_contains(const char *msg, const char *sub) { return msg && strstr(msg, sub) != NULL; }

int mt_main(int argc, char **argv, const char *group_name, const struct CMUnitTest *tests, size_t n)
{
    /* Arguments NAME=VALUE set environment variables (CFX_* for every context of this run). */
    for (int i = 1; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq && eq != argv[i] && argv[i][0] != '/') {
            char name[128];
            snprintf(name, sizeof name, "%.*s", (int)(eq - argv[i]), argv[i]);
            setenv(name, eq + 1, 1);
        }
    }
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
    if (provided < MPI_THREAD_MULTIPLE) {
        printf("[rank %d] MPI_THREAD_MULTIPLE not provided (%d)\n", mt_rank, provided);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    char name[256];
    snprintf(name, sizeof name, "%s [rank %d of %d]", group_name, mt_rank, mt_size);
    int failed = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    int any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any ? 1 : 0;
}

static int shared_tensors_here(void)
{
    const char *v = getenv("CFX_TEST_SHARED_TENSORS");
    if (!v || !*v || !strcmp(v, "none"))
        return 0;
    if (!strcmp(v, "all"))
        return 1;
    if (!strcmp(v, "odd"))
        return mt_rank % 2;
    if (!strcmp(v, "low"))
        return mt_rank < mt_size / 2;
    fprintf(stderr, "CFX_TEST_SHARED_TENSORS=%s: expected none, all, odd or low\n", v);
    abort();
}

void *mt_tensor_alloc(size_t bytes)
{
    void *p = NULL;
    if (shared_tensors_here())
        CHECK_OK(cfx_alloc(bytes, &p));
    else
        CHECK((p = malloc(bytes ? bytes : 1)) != NULL, "malloc(%zu) failed", bytes);
    return p;
}

void mt_tensor_free(void *p)
{
    if (shared_tensors_here())
        CHECK_OK(cfx_free(p));
    else
        free(p);
}
