/* cases - the compression scenarios shared by the thread-rank and mpirun tests (see cases.h). */
#include "cases.h"
#include "../common/case_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints a failed check with its place and rank; returns 1 (the count to add). */
static int report(cfx_context *ctx, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int report(cfx_context *ctx, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: rank %d: check failed: %s: ", __FILE__, line, cfx_rank(ctx), cond);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 1;
}
#define CZ_CHECK(cond, ...) ((void)((cond) || (failures += report(ctx, __LINE__, #cond, __VA_ARGS__))))
#define CZ_OK(expr) CZ_CHECK((expr) == CFX_OK, "%s: %s", #expr, cfx_last_error())

/* Rank r's value of element i of tensor t: spread over [-8, 8], rarely a 16-bit value. */
static double value(int r, int t, size_t i)
{
    uint64_t h = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(t + 7) * 0xC2B2AE3D27D4EB4Full ^
                 (uint64_t)i * 0x165667B19E3779F9ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    return ((double)(h % 20001) - 10000.0) / 1234.567;
}

static int is_bf16(cfx_compression c)
{
    return c == CFX_COMPRESSION_BF16 || c == CFX_COMPRESSION_BF16_EVERYWHERE;
}

/* The unit roundoff of the 16-bit form. */
static double roundoff(cfx_compression c) { return is_bf16(c) ? 0x1p-8 : 0x1p-11; }

/* Whether v is exactly a value of the 16-bit form (binary16 with subnormals, or bfloat16). */
static int representable(cfx_compression c, double v)
{
    if (v == 0.0 || !isfinite(v))
        return 1;
    if (is_bf16(c)) {
        float f = (float)v;
        uint32_t bits;
        memcpy(&bits, &f, 4);
        return (double)f == v && (bits & 0xFFFFu) == 0;
    }
    int e;
    double m = frexp(fabs(v), &e); /* |v| = m 2^e, m in [0.5, 1) */
    if (fabs(v) > 65504.0)
        return 0;
    double scaled = e - 1 >= -14 ? ldexp(m, 11) : ldexp(fabs(v), 24);
    return scaled == floor(scaled);
}

static double get(const void *p, cfx_dtype dt, size_t i)
{
    return dt == CFX_FLOAT64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static void put(void *p, cfx_dtype dt, size_t i, double v)
{
    if (dt == CFX_FLOAT64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

/* Every rank's `bytes` equal this rank's (an allgather over the context itself). */
static int identical(cfx_context *ctx, const void *buf, size_t bytes, const char *what)
{
    int failures = 0, size = cfx_size(ctx);
    int64_t n = (int64_t)bytes;
    cfx_tensor t = {(void *)buf, &n, 1, CFX_UINT8, CFX_DEVICE_CPU, NULL};
    char name[128];
    snprintf(name, sizeof name, "cz.identical.%s", what);
    cfx_handle h = 0;
    uint8_t *all = malloc(bytes * (size_t)size + 1);
    CZ_CHECK(all != NULL, "out of memory");
    CZ_OK(cfx_allgather_async(ctx, name, &t, &h));
    CZ_OK(cfx_wait(ctx, h, 60.0));
    if (all && h)
        CZ_OK(cfx_handle_output_copy(ctx, h, 0, all, bytes * (size_t)size));
    for (int r = 0; all && r < size; r++)
        CZ_CHECK(memcmp(all + bytes * (size_t)r, buf, bytes) == 0,
                 "%s: rank %d's result bytes differ from rank %d's", what, r, cfx_rank(ctx));
    if (h)
        cfx_handle_release(ctx, h);
    free(all);
    return failures;
}

/* Checks out[0..n) of tensor t against the exact postscale * op(prescale * x_r) over ranks. */
static int check_result(cfx_context *ctx, const void *out, cfx_dtype dt, size_t n, int t,
                        cfx_reduce_op op, double pre, double post, cfx_compression c,
                        int compressed, const void *plain)
{
    int failures = 0, size = cfx_size(ctx), bad = 0, unrepresentable = 0;
    double u = roundoff(c);
    for (size_t i = 0; i < n; i++) {
        double exact = 0.0, mag = 0.0;
        for (int r = 0; r < size; r++) {
            exact += pre * value(r, t, i);
            mag += fabs(pre * value(r, t, i));
        }
        double f = op == CFX_OP_AVERAGE ? post / size : post;
        exact *= f;
        mag *= fabs(f);
        double got = get(out, dt, i);
        if (compressed) {
            /* Each value rounded once when packed, each of the size - 1 combines once. */
            double tol = u * (double)size * mag + 1e-6 * mag;
            if (!(fabs(got - exact) <= tol) && bad++ < 3)
                fprintf(stderr, "rank %d: tensor %d element %zu: %.9g, exact %.9g (tolerance "
                        "%.3g)\n", cfx_rank(ctx), t, i, got, exact, tol);
            /* Unscaled sums arrive as values of the 16-bit form: proof that it travelled. */
            if (op == CFX_OP_SUM && post == 1.0 && !representable(c, got))
                unrepresentable++;
        } else if (!plain) { /* float32 arithmetic on float32 or float64 data */
            double tol = 0x1p-22 * (double)size * mag;
            if (!(fabs(got - exact) <= tol) && bad++ < 3)
                fprintf(stderr, "rank %d: tensor %d element %zu: %.9g, exact %.9g\n",
                        cfx_rank(ctx), t, i, got, exact);
        } else if (get(plain, dt, i) != got && bad++ < 3) {
            fprintf(stderr, "rank %d: tensor %d element %zu: %.9g, without compression %.9g\n",
                    cfx_rank(ctx), t, i, got, get(plain, dt, i));
        }
    }
    CZ_CHECK(bad == 0, "tensor %d (%s, %s): %d of %zu elements off", t, cfx_dtype_name(dt),
             cfx_op_name(op), bad, n);
    CZ_CHECK(unrepresentable == 0, "tensor %d (%s): %d of %zu sums are no %s values: the data "
             "did not travel compressed", t, cfx_dtype_name(dt), unrepresentable, n,
             is_bf16(c) ? "bfloat16" : "float16");
    return failures;
}

static int run_one(cfx_context *ctx, cfx_compression c, int compressed, int t, cfx_dtype dt,
                   size_t n, cfx_reduce_op op, double pre, double post)
{
    int failures = 0, rank = cfx_rank(ctx);
    size_t esize = cfx_dtype_size(dt);
    void *in = malloc(n * esize), *out = malloc(n * esize), *plain = malloc(n * esize);
    CZ_CHECK(in && out && plain, "out of memory");
    if (!in || !out || !plain) {
        free(in), free(out), free(plain);
        return failures;
    }
    for (size_t i = 0; i < n; i++)
        put(in, dt, i, value(rank, t, i));
    int64_t shape = (int64_t)n;
    cfx_tensor tensor = {in, &shape, 1, dt, CFX_DEVICE_CPU, NULL};
    cfx_allreduce_options o;
    CZ_OK(cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION));
    o.op = op;
    o.prescale = pre;
    o.postscale = post;
    char name[64];
    for (int pass = 0; pass < 2; pass++) { /* without compression first, for comparison */
        o.compression = pass ? (int32_t)c : CFX_COMPRESSION_NONE;
        snprintf(name, sizeof name, "cz.%d.%s", t, pass ? "compressed" : "plain");
        cfx_handle h = 0;
        CZ_OK(cfx_allreduce_async_opts(ctx, name, &tensor, pass ? out : plain, &o, &h));
        CZ_OK(cfx_wait(ctx, h, 60.0));
        if (h)
            cfx_handle_release(ctx, h);
    }
    failures += check_result(ctx, out, dt, n, t, op, pre, post, c, compressed, plain);
    snprintf(name, sizeof name, "result%d", t);
    failures += identical(ctx, out, n * esize, name);
    free(in), free(out), free(plain);
    return failures;
}

/* Rounded once: element i's combine members (the hosts when the cross-host leg compresses, else
 * every rank) contribute big_i from member i % members and e_i from each of the others, with
 * e_i just under half a 16-bit ulp of big_i over (members - 1.5): exact in float32, their sum
 * rounds to big_i + ulp, while any order of combines that rounds big_i + e_i (or big_i + 2 e_i)
 * on its way gets big_i. Every element's bits are checked; uncompressed, the exact sum. */
static double once_big(size_t i) { return ldexp(i % 2 ? -1.0 : 1.0, (int)(i / 2 % 7) - 3); }

static int rounded_once(cfx_context *ctx, cfx_compression c, int compressed)
{
    int failures = 0, size = cfx_size(ctx);
    int hier = compressed && cfx_cross_size(ctx) > 1 && cfx_local_size(ctx) > 1;
    int members = hier ? cfx_cross_size(ctx) : size, me = hier ? cfx_cross_rank(ctx) : cfx_rank(ctx);
    int lead = hier ? cfx_local_rank(ctx) == 0 : 1; /* one rank a member contributes */
    int digits = is_bf16(c) ? 8 : 11;                  /* significand bits of the 16-bit form */
    double frac = members > 1 ? floor(64 * 0.5 / (members - 1.5)) / 64 : 0; /* of an ulp */
    enum { N = 4096 };
    static _Thread_local float in[N], out[N];
    for (size_t i = 0; i < N; i++) {
        double big = once_big(i);
        double e = frac * ldexp(fabs(big), 1 - digits) * (big < 0 ? -1 : 1);
        in[i] = !lead ? 0.0f : (int)(i % (size_t)members) == me ? (float)big : (float)e;
    }
    int64_t shape = N;
    cfx_tensor tensor = {in, &shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_allreduce_options o;
    CZ_OK(cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION));
    o.op = CFX_OP_SUM;
    o.compression = (int32_t)c;
    cfx_handle h = 0;
    CZ_OK(cfx_allreduce_async_opts(ctx, "cz.rounded_once", &tensor, out, &o, &h));
    CZ_OK(cfx_wait(ctx, h, 60.0));
    if (h)
        cfx_handle_release(ctx, h);
    int bad = 0;
    for (size_t i = 0; i < N; i++) {
        double big = once_big(i);
        double ulp = ldexp(fabs(big), 1 - digits), tail = (members - 1) * frac;
        double want = !compressed ? big + (big < 0 ? -tail : tail) * ulp
                      : tail > 0.5 ? big + (big < 0 ? -ulp : ulp) : big;
        if ((double)out[i] != want && bad++ < 3)
            fprintf(stderr, "rank %d: rounded once, element %zu over %d members: %.9g, expected "
                    "%.9g (%s)\n", cfx_rank(ctx), i, members, (double)out[i], want,
                    compressed ? "one rounding of the float32 sum" : "the exact sum");
    }
    CZ_CHECK(bad == 0, "rounded once over %d members: %d of %d elements off", members, bad, N);
    return failures;
}

int cz_case_allreduce(cfx_context *ctx, cfx_compression c, int compressed)
{
    int failures = rounded_once(ctx, c, compressed);
    failures += run_one(ctx, c, compressed, 0, CFX_FLOAT32, 300000, CFX_OP_SUM, 1.0, 1.0);
    failures += run_one(ctx, c, compressed, 1, CFX_FLOAT64, 70001, CFX_OP_SUM, 1.0, 1.0);
    failures += run_one(ctx, c, compressed, 2, CFX_FLOAT32, 17, CFX_OP_AVERAGE, 0.5, 3.0);
    failures += run_one(ctx, c, compressed, 3, CFX_FLOAT64, 1, CFX_OP_SUM, 2.0, 0.25);
    return failures;
}

int cz_case_gradset(cfx_context *ctx, cfx_compression c, int compressed)
{
    int failures = 0, rank = cfx_rank(ctx);
    /* Version 1 options: the struct ended before compression, which init must not touch. */
    cfx_gradset_options o;
    o.compression = 77;
    CZ_OK(cfx_gradset_options_init(&o, 1));
    CZ_CHECK(o.compression == 77, "version 1 init wrote past the version 1 struct");
    cfx_gradset *old = NULL;
    CZ_OK(cfx_gradset_create(ctx, "cz.v1", &o, &old));
    cfx_gradset_free(old);

    CZ_OK(cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION));
    o.op = CFX_OP_SUM;
    o.compression = (int32_t)c;
    cfx_gradset *set = NULL;
    CZ_OK(cfx_gradset_create(ctx, "cz.set", &o, &set));
    if (!set)
        return failures;
    const size_t n[2] = {40000, 513};
    const cfx_dtype dt[2] = {CFX_FLOAT32, CFX_FLOAT64};
    int32_t idx[2] = {-1, -1};
    for (int g = 0; g < 2; g++) {
        int64_t shape = (int64_t)n[g];
        cfx_tensor t = {NULL, &shape, 1, dt[g], CFX_DEVICE_CPU, NULL};
        char name[16];
        snprintf(name, sizeof name, "g%d", g);
        CZ_OK(cfx_gradset_add(set, name, &t, &idx[g]));
    }
    CZ_OK(cfx_gradset_commit(set));
    for (int step = 0; step < 2 && !failures; step++) {
        void *data[2] = {NULL, NULL};
        for (int g = 0; g < 2; g++) {
            CZ_OK(cfx_gradset_data(set, idx[g], &data[g]));
            for (size_t i = 0; data[g] && i < n[g]; i++)
                put(data[g], dt[g], i, value(rank, 10 + 2 * step + g, i));
        }
        for (int g = 1; g >= 0; g--)
            CZ_OK(cfx_gradset_ready(set, idx[g]));
        CZ_OK(cfx_gradset_wait(set, 60.0));
        for (int g = 0; g < 2 && data[g]; g++) {
            failures += check_result(ctx, data[g], dt[g], n[g], 10 + 2 * step + g, CFX_OP_SUM, 1.0,
                                     1.0, c, compressed, NULL);
            char what[32];
            snprintf(what, sizeof what, "set%d.%d", step, g);
            failures += identical(ctx, data[g], n[g] * cfx_dtype_size(dt[g]), what);
        }
    }
    cfx_gradset_free(set);
    return failures;
}

/* Runs SGD on the quadratic through a set with or without error feedback; returns the mean
 * |w - t| at the end (negative on a failure, counted in *failures). */
static double quadratic(cfx_context *ctx, cfx_compression c, int feedback, int *failures_out)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    enum { N = 256, STEPS = 1000 };
    cfx_gradset_options o;
    CZ_OK(cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION));
    o.compression = (int32_t)c;
    o.error_feedback = feedback;
    cfx_gradset *set = NULL;
    CZ_OK(cfx_gradset_create(ctx, feedback ? "cz.quadratic.ef" : "cz.quadratic", &o, &set));
    int64_t shape = N;
    int32_t idx = -1;
    if (set)
        CZ_OK(cfx_gradset_add(set, "w", &(cfx_tensor){NULL, &shape, 1, CFX_FLOAT32,
                                                       CFX_DEVICE_CPU, NULL}, &idx));
    float *g = NULL;
    if (set)
        CZ_OK(cfx_gradset_commit(set));
    if (set)
        CZ_OK(cfx_gradset_data(set, idx, (void **)&g));
    double w[N], t[N], err = -1.0;
    /* Offsets that cancel over all ranks, not within the first half of them (a host). */
    double big = is_bf16(c) ? 200.0 : 1000.0;
    double offset = rank < size - 1 ? big : -big * (size - 1);
    for (int i = 0; i < N; i++) {
        w[i] = 0.0;
        t[i] = value(0, 99, (size_t)i) / 8.0;
    }
    for (int k = 0; g && k < STEPS && !failures; k++) {
        for (int i = 0; i < N; i++)
            g[i] = (float)(w[i] - t[i] + offset);
        CZ_OK(cfx_gradset_ready(set, idx));
        CZ_OK(cfx_gradset_wait(set, 60.0));
        double lr = 0.5 / (1.0 + k / 20.0);
        for (int i = 0; i < N; i++)
            w[i] -= lr * g[i]; /* the average: every rank takes the same step */
    }
    if (g) {
        err = 0.0;
        for (int i = 0; i < N; i++)
            err += fabs(w[i] - t[i]) / N;
        failures += identical(ctx, w, sizeof w, feedback ? "quadratic.ef" : "quadratic");
    }
    cfx_gradset_free(set);
    *failures_out += failures;
    return err;
}

int cz_case_error_feedback(cfx_context *ctx, cfx_compression c, int compressed)
{
    int failures = 0;
    double plain = quadratic(ctx, c, 0, &failures);
    double fed = quadratic(ctx, c, 1, &failures);
    if (compressed) {
        CZ_CHECK(plain > 0.05, "without error feedback w came within %.4g of t: the rounding did "
                 "not stall it, so this test shows nothing", plain);
        CZ_CHECK(fed >= 0.0 && fed < 0.02 && fed < plain / 3,
                 "with error feedback w is %.4g from t (without: %.4g)", fed, plain);
    } else {
        CZ_CHECK(plain >= 0.0 && plain < 0.02 && fed >= 0.0 && fed < 0.02,
                 "uncompressed, w ends %.4g (no feedback) and %.4g (feedback) from t", plain, fed);
    }
    cfx_gradset_options o;
    CZ_OK(cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION));
    cfx_gradset *set = NULL;
    o.error_feedback = 1;
    CZ_CHECK(cfx_gradset_create(ctx, "cz.ef.none", &o, &set) == CFX_ERR_INVALID_ARGUMENT &&
             strstr(cfx_last_error(), "error_feedback"), "feedback without compression: %s",
             cfx_last_error());
    o.compression = (int32_t)c;
    o.error_feedback = 2;
    CZ_CHECK(cfx_gradset_create(ctx, "cz.ef.two", &o, &set) == CFX_ERR_INVALID_ARGUMENT,
             "error_feedback 2 accepted");
    return failures;
}

int cz_case_mismatch(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx);
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t shape = 8;
    cfx_tensor t = {x, &shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_allreduce_options o;
    CZ_OK(cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION));
    o.compression = rank == 0 ? CFX_COMPRESSION_FP16 : CFX_COMPRESSION_NONE;
    cfx_handle h = 0;
    CZ_OK(cfx_allreduce_async_opts(ctx, "cz.mismatched", &t, NULL, &o, &h));
    CZ_CHECK(cfx_wait(ctx, h, 60.0) == CFX_ERR_MISMATCH, "a compression mismatch is not "
             "CFX_ERR_MISMATCH: %s", cfx_last_error());
    const char *msg = h ? cfx_handle_message(ctx, h) : NULL;
    CZ_CHECK(msg && strstr(msg, "cz.mismatched") && strstr(msg, "compression") &&
             strstr(msg, "fp16"), "the message does not name the tensor and both settings: %s",
             msg ? msg : "(none)");
    if (h)
        cfx_handle_release(ctx, h);

    cfx_gradset_options go;
    CZ_OK(cfx_gradset_options_init(&go, CFX_GRADSET_OPTIONS_VERSION));
    go.compression = rank == cfx_size(ctx) - 1 ? CFX_COMPRESSION_BF16 : CFX_COMPRESSION_NONE;
    cfx_gradset *set = NULL;
    CZ_OK(cfx_gradset_create(ctx, "cz.mixed", &go, &set));
    int32_t i = 0;
    if (set)
        CZ_OK(cfx_gradset_add(set, "w", &(cfx_tensor){NULL, &shape, 1, CFX_FLOAT32,
                                                       CFX_DEVICE_CPU, NULL}, &i));
    CZ_CHECK(set && cfx_gradset_commit(set) == CFX_ERR_MISMATCH, "a set's compression mismatch "
             "is not CFX_ERR_MISMATCH");
    CZ_CHECK(strstr(cfx_last_error(), "cz.mixed") && strstr(cfx_last_error(), "bf16"),
             "the message does not name the set and the setting: %s", cfx_last_error());
    cfx_gradset_free(set);
    return failures;
}

static int refused(cfx_context *ctx, cfx_dtype dt, cfx_reduce_op op, int32_t c, uint32_t version,
                   cfx_status want, const char *needle)
{
    int failures = 0;
    double buf[4] = {0};
    int64_t shape = 2;
    cfx_tensor t = {buf, &shape, 1, dt, CFX_DEVICE_CPU, NULL};
    cfx_allreduce_options o;
    CZ_OK(cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION));
    o.op = op;
    o.compression = c;
    o.version = version;
    cfx_handle h = 0;
    CZ_CHECK(cfx_allreduce_async_opts(ctx, "cz.refused", &t, NULL, &o, &h) == want,
             "%s with compression %d: not refused as %s", cfx_dtype_name(dt), c,
             cfx_status_string(want));
    CZ_CHECK(strstr(cfx_last_error(), needle), "the message does not say '%s': %s", needle,
             cfx_last_error());
    return failures;
}

int cz_case_errors(cfx_context *ctx)
{
    int failures = 0;
    const uint32_t v = CFX_ALLREDUCE_OPTIONS_VERSION;
    failures += refused(ctx, CFX_INT32, CFX_OP_SUM, CFX_COMPRESSION_FP16, v,
                        CFX_ERR_INVALID_ARGUMENT, "tensor 'cz.refused'");
    failures += refused(ctx, CFX_FLOAT16, CFX_OP_SUM, CFX_COMPRESSION_BF16, v,
                        CFX_ERR_INVALID_ARGUMENT, "not float16");
#if CFX_OP_COUNT > 5 /* an op past product: Adasum */
    failures += refused(ctx, CFX_FLOAT32, (cfx_reduce_op)(CFX_OP_COUNT - 1), CFX_COMPRESSION_FP16,
                        v, CFX_ERR_INVALID_ARGUMENT, "does not combine compressed values");
#endif
    failures += refused(ctx, CFX_FLOAT32, CFX_OP_SUM, 99, v, CFX_ERR_INVALID_ARGUMENT,
                        "compression 99");
    failures += refused(ctx, CFX_FLOAT32, CFX_OP_SUM, CFX_COMPRESSION_FP16, 7, CFX_ERR_VERSION,
                        "version 7");
    cfx_allreduce_options o;
    CZ_CHECK(cfx_allreduce_options_init(&o, 7) == CFX_ERR_VERSION, "init took version 7");
    CZ_CHECK(cfx_allreduce_options_init(NULL, v) == CFX_ERR_INVALID_ARGUMENT, "init took NULL");

    cfx_gradset_options go;
    CZ_OK(cfx_gradset_options_init(&go, CFX_GRADSET_OPTIONS_VERSION));
    go.compression = CFX_COMPRESSION_FP16;
    cfx_gradset *set = NULL;
    CZ_OK(cfx_gradset_create(ctx, "cz.halfset", &go, &set));
    int64_t shape = 4;
    int32_t i;
    CZ_CHECK(set && cfx_gradset_add(set, "h", &(cfx_tensor){NULL, &shape, 1, CFX_FLOAT16,
                                                              CFX_DEVICE_CPU, NULL}, &i) ==
                        CFX_ERR_INVALID_ARGUMENT, "a float16 gradient in a compressed set");
    CZ_CHECK(strstr(cfx_last_error(), "gradient 'h'"), "the message does not name it: %s",
             cfx_last_error());
    cfx_gradset_free(set);
    go.compression = -1;
    CZ_CHECK(cfx_gradset_create(ctx, "cz.badset", &go, &set) == CFX_ERR_INVALID_ARGUMENT,
             "compression -1 accepted");
    return failures + case_settle(ctx);
}
