/* test_reduce - the dtype kernels of reduce.h against reference computations done here in double /
 * 64-bit integers, with float16/bfloat16/float32 rounding re-derived from frexp/ldexp/nearbyint
 * rather than from bit tricks, so a shared mistake is unlikely. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/reduce.h"

/* The elementwise ops (Adasum is not: tests/unit/test_adasum.c, tests/mpi/test_mpi_adasum.c). */
#define ELEMENTWISE_OPS (CFX_OP_PRODUCT + 1)

/* ---- helpers ------------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

static double rnd_unit(void) { return (double)(rnd() >> 11) * 0x1p-53; }

static uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint64_t bits_of_f64(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static double f64_of_bits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static size_t dt_size(cfx_dtype dt)
{
    static const size_t s[CFX_DTYPE_COUNT] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
    return s[dt];
}

static const char *dt_name(cfx_dtype dt)
{
    static const char *const n[CFX_DTYPE_COUNT] = {"uint8",   "int8",     "uint16",  "int16",
                                                   "int32",   "int64",    "float16", "bfloat16",
                                                   "float32", "float64",  "bool"};
    return n[dt];
}

static const char *op_name(cfx_reduce_op op)
{
    static const char *const n[CFX_OP_COUNT] = {"sum", "average", "min", "max", "product"};
    return n[op];
}

static int is_int(cfx_dtype dt) { return dt <= CFX_INT64; }
static int is_signed_int(cfx_dtype dt)
{
    return dt == CFX_INT8 || dt == CFX_INT16 || dt == CFX_INT32 || dt == CFX_INT64;
}

static int int_bits(cfx_dtype dt) { return (int)dt_size(dt) * 8; }

static int64_t int_min(cfx_dtype dt)
{
    return is_signed_int(dt) ? (dt == CFX_INT64 ? INT64_MIN : -((int64_t)1 << (int_bits(dt) - 1))) : 0;
}

static int64_t int_max(cfx_dtype dt)
{
    if (dt == CFX_INT64)
        return INT64_MAX;
    return is_signed_int(dt) ? ((int64_t)1 << (int_bits(dt) - 1)) - 1 : ((int64_t)1 << int_bits(dt)) - 1;
}

/* Raw little-endian element bits. */
static uint64_t get_raw(const void *buf, size_t i, cfx_dtype dt)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)buf + i * dt_size(dt), dt_size(dt));
    return v;
}

static void put_raw(void *buf, size_t i, cfx_dtype dt, uint64_t v)
{
    memcpy((char *)buf + i * dt_size(dt), &v, dt_size(dt));
}

/* Reduces v modulo 2^bits of dt and sign-extends. */
static int64_t wrap_int(uint64_t v, cfx_dtype dt)
{
    int b = int_bits(dt);
    if (b < 64) {
        uint64_t mask = ((uint64_t)1 << b) - 1;
        v &= mask;
        if (is_signed_int(dt) && (v >> (b - 1)) & 1)
            v |= ~mask;
    }
    int64_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

static int64_t get_int(const void *buf, size_t i, cfx_dtype dt) { return wrap_int(get_raw(buf, i, dt), dt); }

/* ---- reference binary floating-point formats ---------------------------------------------------- */

typedef struct fmt {
    int p;     /* significand bits, implicit bit included */
    int ebits; /* exponent field width */
    int emin;  /* exponent of the smallest normal */
    int emax;
} fmt;

static const fmt FMT_F16 = {11, 5, -14, 15};
static const fmt FMT_BF16 = {8, 8, -126, 127};
static const fmt FMT_F32 = {24, 8, -126, 127};

/* Rounds x to the format, to nearest even, with gradual underflow and overflow to infinity. */
static double ref_round(double x, fmt f)
{
    if (isnan(x) || isinf(x) || x == 0.0)
        return x;
    int e;
    frexp(fabs(x), &e);
    int E = e - 1 < f.emin ? f.emin : e - 1;
    double r = ldexp(nearbyint(ldexp(fabs(x), f.p - 1 - E)), E - (f.p - 1));
    double max = ldexp(2.0 - ldexp(1.0, 1 - f.p), f.emax);
    if (r > max)
        r = INFINITY;
    return copysign(r, x);
}

/* Bits of a value already representable in the format; NaN gives the canonical quiet NaN. */
static uint32_t ref_encode(double v, fmt f)
{
    uint32_t sign = signbit(v) ? (uint32_t)1 << (f.p - 1 + f.ebits) : 0;
    uint32_t emask = ((uint32_t)1 << f.ebits) - 1;
    int bias = f.emax;
    if (isnan(v))
        return (emask << (f.p - 1)) | ((uint32_t)1 << (f.p - 2));
    if (isinf(v))
        return sign | (emask << (f.p - 1));
    double a = fabs(v);
    if (a < ldexp(1.0, f.emin))
        return sign | (uint32_t)ldexp(a, (f.p - 1) - f.emin);
    int E = ilogb(a);
    uint32_t mant = (uint32_t)(ldexp(a, f.p - 1 - E) - ldexp(1.0, f.p - 1));
    return sign | ((uint32_t)(E + bias) << (f.p - 1)) | mant;
}

static double ref_decode(uint32_t bits, fmt f)
{
    uint32_t mmask = ((uint32_t)1 << (f.p - 1)) - 1;
    uint32_t emask = ((uint32_t)1 << f.ebits) - 1;
    uint32_t mant = bits & mmask;
    uint32_t ex = (bits >> (f.p - 1)) & emask;
    int neg = (bits >> (f.p - 1 + f.ebits)) & 1;
    double v;
    if (ex == emask)
        v = mant ? NAN : INFINITY;
    else if (ex == 0)
        v = ldexp((double)mant, f.emin - (f.p - 1));
    else
        v = ldexp((double)(mant | (mmask + 1)), (int)ex - f.emax - (f.p - 1));
    return neg ? -v : v;
}

static int half_is_nan(uint16_t h, fmt f)
{
    uint32_t mmask = ((uint32_t)1 << (f.p - 1)) - 1;
    uint32_t emask = ((uint32_t)1 << f.ebits) - 1;
    return ((h >> (f.p - 1)) & emask) == emask && (h & mmask) != 0;
}

static int half_is_quiet(uint16_t h, fmt f) { return (h >> (f.p - 2)) & 1; }

static const fmt *half_fmt(cfx_dtype dt) { return dt == CFX_FLOAT16 ? &FMT_F16 : &FMT_BF16; }

/* Value of element i of a float-kind buffer, as double. */
static double get_real(const void *buf, size_t i, cfx_dtype dt)
{
    switch (dt) {
    case CFX_FLOAT16:
    case CFX_BFLOAT16: return ref_decode((uint32_t)get_raw(buf, i, dt), *half_fmt(dt));
    case CFX_FLOAT32: return (double)f32_of_bits((uint32_t)get_raw(buf, i, dt));
    case CFX_FLOAT64: return f64_of_bits(get_raw(buf, i, dt));
    default: return 0.0;
    }
}

/* Stores a double already holding the type's arithmetic result, rounding as the header specifies. */
static void put_real(void *buf, size_t i, cfx_dtype dt, double v)
{
    switch (dt) {
    case CFX_FLOAT16:
    case CFX_BFLOAT16:
        put_raw(buf, i, dt, ref_encode(ref_round(ref_round(v, FMT_F32), *half_fmt(dt)), *half_fmt(dt)));
        break;
    case CFX_FLOAT32: put_raw(buf, i, dt, ref_encode(ref_round(v, FMT_F32), FMT_F32)); break;
    case CFX_FLOAT64: put_raw(buf, i, dt, bits_of_f64(v)); break;
    default: break;
    }
}

static int raw_is_nan(uint64_t r, cfx_dtype dt)
{
    switch (dt) {
    case CFX_FLOAT16:
    case CFX_BFLOAT16: return half_is_nan((uint16_t)r, *half_fmt(dt));
    case CFX_FLOAT32: return isnan(f32_of_bits((uint32_t)r));
    case CFX_FLOAT64: return isnan(f64_of_bits(r));
    default: return 0;
    }
}

static int raw_is_quiet_nan(uint64_t r, cfx_dtype dt)
{
    switch (dt) {
    case CFX_FLOAT16:
    case CFX_BFLOAT16: return half_is_quiet((uint16_t)r, *half_fmt(dt));
    case CFX_FLOAT32: return (r >> 22) & 1;
    case CFX_FLOAT64: return (r >> 51) & 1;
    default: return 0;
    }
}

static int raw_is_zero(uint64_t r, cfx_dtype dt)
{
    uint64_t sign = (uint64_t)1 << (dt_size(dt) * 8 - 1);
    return (r & ~sign) == 0;
}

/* ---- random data -------------------------------------------------------------------------------- */

static void fill_random(void *buf, size_t n, cfx_dtype dt)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rnd();
        unsigned pick = (unsigned)(rnd() % 16);
        if (is_int(dt)) {
            /* Full-width random bits make sums and products overflow most of the time. */
            static const int64_t small[] = {0, 1, -1, 2, -2, 3};
            uint64_t v = r;
            if (pick == 0)
                v = (uint64_t)int_min(dt);
            else if (pick == 1)
                v = (uint64_t)int_max(dt);
            else if (pick < 5)
                v = (uint64_t)small[r % 6];
            else if (pick < 8)
                v = (uint64_t)(int64_t)(r % 200) - 100;
            put_raw(buf, i, dt, (uint64_t)wrap_int(v, dt));
        } else if (dt == CFX_BOOL) {
            static const uint8_t b[] = {0, 1, 0, 1, 2, 255, 0x80, 0};
            put_raw(buf, i, dt, pick < 8 ? b[pick] : (r & 1));
        } else if (dt == CFX_FLOAT16 || dt == CFX_BFLOAT16) {
            const fmt *f = half_fmt(dt);
            uint64_t v = r & 0xffff; /* every class: normals, subnormals, inf, quiet and signalling NaN */
            if (pick < 6)
                v = ref_encode(ref_round((rnd_unit() - 0.5) * 64.0, *f), *f);
            else if (pick == 6)
                v = ref_encode(ref_round(ldexp(1.0, f->emax), *f), *f); /* sums overflow */
            put_raw(buf, i, dt, v);
        } else {
            static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0,
                                             3.0e38, -3.0e38, 1.0e-40, DBL_MAX, DBL_MIN};
            if (pick < 6) {
                put_real(buf, i, dt, (rnd_unit() - 0.5) * 2000.0);
            } else if (pick < 9) {
                put_raw(buf, i, dt, r); /* any bit pattern, signalling NaNs included */
            } else {
                double v = special[r % 12];
                if (dt == CFX_FLOAT32)
                    put_raw(buf, i, dt, bits_of_f32((float)v));
                else
                    put_raw(buf, i, dt, bits_of_f64(v));
            }
        }
    }
}

/* ---- reference reductions ----------------------------------------------------------------------- */

static void ref_reduce(void *out, const void *a, const void *b, size_t n, cfx_dtype dt, cfx_reduce_op op)
{
    for (size_t i = 0; i < n; i++) {
        if (is_int(dt)) {
            int64_t x = get_int(a, i, dt), y = get_int(b, i, dt);
            int64_t r = 0;
            switch (op) {
            case CFX_OP_SUM:
            case CFX_OP_AVERAGE: r = wrap_int((uint64_t)x + (uint64_t)y, dt); break;
            case CFX_OP_PRODUCT: r = wrap_int((uint64_t)x * (uint64_t)y, dt); break;
            case CFX_OP_MIN: r = x < y ? x : y; break;
            case CFX_OP_MAX: r = x > y ? x : y; break;
            }
            put_raw(out, i, dt, (uint64_t)r);
        } else if (dt == CFX_BOOL) {
            int x = get_raw(a, i, dt) != 0, y = get_raw(b, i, dt) != 0;
            int orr = op == CFX_OP_SUM || op == CFX_OP_AVERAGE || op == CFX_OP_MAX;
            put_raw(out, i, dt, (uint64_t)(orr ? (x || y) : (x && y)));
        } else {
            /* Half formats: the double sum/product of two values of the narrow format rounded to
             * float32 is float32's correctly rounded result (53 >= 2 * 24 + 2), as in the kernels. */
            double x = get_real(a, i, dt), y = get_real(b, i, dt);
            double r = 0.0;
            switch (op) {
            case CFX_OP_SUM:
            case CFX_OP_AVERAGE: r = x + y; break;
            case CFX_OP_PRODUCT: r = x * y; break;
            case CFX_OP_MIN: r = isnan(x) || isnan(y) ? NAN : (x < y ? x : y); break;
            case CFX_OP_MAX: r = isnan(x) || isnan(y) ? NAN : (x > y ? x : y); break;
            }
            put_real(out, i, dt, r);
        }
    }
}

/* Element-wise comparison: NaN matches any quiet NaN; for min/max a zero matches a zero of either
 * sign (the header leaves min(-0, +0) open). */
static void check_equal(const void *got, const void *want, size_t n, cfx_dtype dt, int zero_sign_free,
                        const char *what, const void *a, const void *b)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t g = get_raw(got, i, dt), w = get_raw(want, i, dt);
        int ok;
        if (raw_is_nan(w, dt))
            ok = raw_is_nan(g, dt) && raw_is_quiet_nan(g, dt);
        else if (zero_sign_free && raw_is_zero(w, dt))
            ok = raw_is_zero(g, dt);
        else
            ok = g == w;
        if (!ok) {
            fail_msg("%s %s: element %zu of %zu: got 0x%llx, want 0x%llx (a 0x%llx, b 0x%llx)", what,
                     dt_name(dt), i, n, (unsigned long long)g, (unsigned long long)w,
                     a ? (unsigned long long)get_raw(a, i, dt) : 0ull,
                     b ? (unsigned long long)get_raw(b, i, dt) : 0ull);
        }
    }
}

/* Buffers with a guard zone after the data, and one element of offset so vector loops start
 * unaligned. */
#define GUARD 64
#define GUARD_BYTE 0xa5

typedef struct gbuf {
    unsigned char *base;
    void *p;
    size_t bytes;
} gbuf;

static gbuf gb_new(size_t n, cfx_dtype dt)
{
    gbuf g;
    g.bytes = n * dt_size(dt);
    g.base = malloc(dt_size(dt) + g.bytes + GUARD);
    assert_non_null(g.base);
    memset(g.base, GUARD_BYTE, dt_size(dt) + g.bytes + GUARD);
    g.p = g.base + dt_size(dt);
    return g;
}

static void gb_check(const gbuf *g, size_t elem)
{
    for (size_t i = 0; i < elem; i++)
        assert_int_equal(g->base[i], GUARD_BYTE);
    for (size_t i = 0; i < GUARD; i++)
        assert_int_equal(g->base[elem + g->bytes + i], GUARD_BYTE);
}

static void gb_free(gbuf *g) { free(g->base); }

static const size_t LENGTHS[] = {0, 1, 7, 1000, 4099};
#define NLENGTHS (sizeof LENGTHS / sizeof LENGTHS[0])

/* ---- cx_reduce_into / cx_reduce3 ---------------------------------------------------------------- */

static void test_reduce(void **state)
{
    cfx_dtype dt = *(cfx_dtype *)*state;
    size_t es = dt_size(dt);
    for (int op = 0; op < ELEMENTWISE_OPS; op++) {
        int zfree = op == CFX_OP_MIN || op == CFX_OP_MAX;
        char what[64];
        for (size_t li = 0; li < NLENGTHS; li++) {
            size_t n = LENGTHS[li];
            gbuf a = gb_new(n, dt), b = gb_new(n, dt), a0 = gb_new(n, dt), b0 = gb_new(n, dt);
            gbuf want = gb_new(n, dt), want_aa = gb_new(n, dt), d = gb_new(n, dt);
            fill_random(a.p, n, dt);
            fill_random(b.p, n, dt);
            memcpy(a0.p, a.p, a.bytes);
            memcpy(b0.p, b.p, b.bytes);
            ref_reduce(want.p, a.p, b.p, n, dt, (cfx_reduce_op)op);
            ref_reduce(want_aa.p, a.p, a.p, n, dt, (cfx_reduce_op)op);

            snprintf(what, sizeof what, "reduce3 %s n=%zu", op_name((cfx_reduce_op)op), n);
            cx_reduce3(d.p, a.p, b.p, n, dt, (cfx_reduce_op)op);
            check_equal(d.p, want.p, n, dt, zfree, what, a.p, b.p);
            assert_memory_equal(a.base, a0.base, es + a.bytes + GUARD);
            assert_memory_equal(b.base, b0.base, es + b.bytes + GUARD);
            gb_check(&d, es);

            snprintf(what, sizeof what, "reduce_into %s n=%zu", op_name((cfx_reduce_op)op), n);
            memcpy(d.p, a.p, a.bytes);
            cx_reduce_into(d.p, b.p, n, dt, (cfx_reduce_op)op);
            check_equal(d.p, want.p, n, dt, zfree, what, a.p, b.p);
            gb_check(&d, es);

            snprintf(what, sizeof what, "reduce3 dst==a %s n=%zu", op_name((cfx_reduce_op)op), n);
            memcpy(d.p, a.p, a.bytes);
            cx_reduce3(d.p, d.p, b.p, n, dt, (cfx_reduce_op)op);
            check_equal(d.p, want.p, n, dt, zfree, what, a.p, b.p);

            /* Operand order must survive dst == b: min(-0, +0) depends on it. */
            snprintf(what, sizeof what, "reduce3 dst==b %s n=%zu", op_name((cfx_reduce_op)op), n);
            memcpy(d.p, b.p, b.bytes);
            cx_reduce3(d.p, a.p, d.p, n, dt, (cfx_reduce_op)op);
            check_equal(d.p, want.p, n, dt, zfree, what, a.p, b.p);
            if (n > 0) { /* bitwise (zero signs included) against dst distinct; NaN payloads are
                          * the compiler's to pick (it may commute x + y) */
                gbuf d2 = gb_new(n, dt);
                cx_reduce3(d2.p, a.p, b.p, n, dt, (cfx_reduce_op)op);
                for (size_t i = 0; i < n; i++) {
                    uint64_t g = get_raw(d.p, i, dt), w = get_raw(d2.p, i, dt);
                    if (g != w && !(raw_is_nan(g, dt) && raw_is_nan(w, dt)))
                        fail_msg("%s: element %zu: 0x%llx with dst==b, 0x%llx otherwise", what, i,
                                 (unsigned long long)g, (unsigned long long)w);
                }
                gb_free(&d2);
            }

            snprintf(what, sizeof what, "reduce3 dst==a==b %s n=%zu", op_name((cfx_reduce_op)op), n);
            memcpy(d.p, a.p, a.bytes);
            cx_reduce3(d.p, d.p, d.p, n, dt, (cfx_reduce_op)op);
            check_equal(d.p, want_aa.p, n, dt, zfree, what, a.p, a.p);

            snprintf(what, sizeof what, "reduce_into dst==src %s n=%zu", op_name((cfx_reduce_op)op), n);
            memcpy(d.p, a.p, a.bytes);
            cx_reduce_into(d.p, d.p, n, dt, (cfx_reduce_op)op);
            check_equal(d.p, want_aa.p, n, dt, zfree, what, a.p, a.p);
            gb_check(&d, es);

            gb_free(&a), gb_free(&b), gb_free(&a0), gb_free(&b0);
            gb_free(&want), gb_free(&want_aa), gb_free(&d);
        }
        /* count 0 touches nothing, NULL included. */
        cx_reduce_into(NULL, NULL, 0, dt, (cfx_reduce_op)op);
        cx_reduce3(NULL, NULL, NULL, 0, dt, (cfx_reduce_op)op);
    }
}

/* Hand-picked wrap-around and NaN/inf cases, on top of the random ones. */
static void test_reduce_edges(void **state)
{
    (void)state;
    uint8_t u8a[3] = {250, 16, 0}, u8b[3] = {10, 16, 255};
    cx_reduce_into(u8a, u8b, 3, CFX_UINT8, CFX_OP_SUM);
    assert_int_equal(u8a[0], (250 + 10) % 256);
    assert_int_equal(u8a[1], 32);
    assert_int_equal(u8a[2], 255);
    uint16_t u16a[1] = {65535}, u16b[1] = {65535};
    cx_reduce_into(u16a, u16b, 1, CFX_UINT16, CFX_OP_PRODUCT); /* would overflow int if promoted */
    assert_int_equal(u16a[0], (uint16_t)(65535u * 65535u));
    int32_t i32a[2] = {INT32_MAX, INT32_MIN}, i32b[2] = {1, -1};
    cx_reduce_into(i32a, i32b, 2, CFX_INT32, CFX_OP_SUM);
    assert_int_equal(i32a[0], INT32_MIN);
    assert_int_equal(i32a[1], INT32_MAX);
    int64_t i64a[1] = {INT64_MIN}, i64b[1] = {-1};
    cx_reduce_into(i64a, i64b, 1, CFX_INT64, CFX_OP_PRODUCT);
    assert_true(i64a[0] == INT64_MIN);

    float fa[4] = {NAN, 1.0f, INFINITY, 1.0f}, fb[4] = {1.0f, NAN, -INFINITY, 2.0f};
    float fmn[4];
    cx_reduce3(fmn, fa, fb, 4, CFX_FLOAT32, CFX_OP_MIN);
    assert_true(isnan(fmn[0]) && isnan(fmn[1]));
    assert_true(fmn[2] == -INFINITY && fmn[3] == 1.0f);
    cx_reduce3(fmn, fa, fb, 4, CFX_FLOAT32, CFX_OP_MAX);
    assert_true(isnan(fmn[0]) && isnan(fmn[1]));
    assert_true(fmn[2] == INFINITY && fmn[3] == 2.0f);
    cx_reduce3(fmn, fa, fb, 4, CFX_FLOAT32, CFX_OP_SUM);
    assert_true(isnan(fmn[2])); /* inf + -inf */

    uint16_t h[2] = {0x7bff, 0x3c00}, hb[2] = {0x7bff, 0x7e00}; /* 65504 + 65504 overflows */
    cx_reduce_into(h, hb, 2, CFX_FLOAT16, CFX_OP_SUM);
    assert_int_equal(h[0], 0x7c00);
    assert_true(half_is_nan(h[1], FMT_F16));
}

/* ---- scaling ------------------------------------------------------------------------------------ */

static uint64_t ref_scale_one(uint64_t raw, cfx_dtype dt, double f)
{
    if (is_int(dt)) {
        double v = (double)wrap_int(raw, dt) * f;
        if (isnan(v))
            return 0;
        v = trunc(v);
        int64_t r;
        if (dt == CFX_INT64)
            r = v >= 0x1p63 ? INT64_MAX : v < -0x1p63 ? INT64_MIN : (int64_t)v;
        else
            r = v > (double)int_max(dt) ? int_max(dt) : v < (double)int_min(dt) ? int_min(dt) : (int64_t)v;
        return (uint64_t)wrap_int((uint64_t)r, dt);
    }
    if (dt == CFX_BOOL)
        return raw != 0 && f != 0.0;
    unsigned char tmp[8];
    put_raw(tmp, 0, dt, raw);
    double x = get_real(tmp, 0, dt);
    /* float32 scales in double by the double factor (one rounding, to float32, in put_real); the
     * half formats by the factor rounded to float32: the double product of the two is exact, so
     * two roundings remain, as the kernels do. */
    double r = dt == CFX_FLOAT64 || dt == CFX_FLOAT32 ? x * f : x * (double)(float)f;
    put_real(tmp, 0, dt, r);
    return get_raw(tmp, 0, dt);
}

static void test_scale(void **state)
{
    cfx_dtype dt = *(cfx_dtype *)*state;
    size_t es = dt_size(dt);
    static const double factors[] = {1.0, 0.5, -0.5, 3.0, -2.0, 0.0, -0.0, 0.1, 1e300, -1e300,
                                     1e-300, 1e10, INFINITY, NAN};
    for (size_t fi = 0; fi < sizeof factors / sizeof factors[0]; fi++) {
        double f = factors[fi];
        for (size_t li = 0; li < NLENGTHS; li++) {
            size_t n = LENGTHS[li];
            char what[64];
            gbuf src = gb_new(n, dt), src0 = gb_new(n, dt), want = gb_new(n, dt), d = gb_new(n, dt);
            fill_random(src.p, n, dt);
            memcpy(src0.p, src.p, src.bytes);
            for (size_t i = 0; i < n; i++)
                put_raw(want.p, i, dt, ref_scale_one(get_raw(src.p, i, dt), dt, f));

            snprintf(what, sizeof what, "scale_copy f=%g n=%zu", f, n);
            cx_scale_copy(d.p, src.p, n, dt, f);
            if (f == 1.0)
                assert_memory_equal(d.p, src.p, src.bytes); /* a plain copy, NaN payloads kept */
            else
                check_equal(d.p, want.p, n, dt, 0, what, src.p, NULL);
            assert_memory_equal(src.base, src0.base, es + src.bytes + GUARD);
            gb_check(&d, es);

            snprintf(what, sizeof what, "scale f=%g n=%zu", f, n);
            cx_scale(src.p, n, dt, f);
            if (f == 1.0)
                assert_memory_equal(src.p, src0.p, src.bytes);
            else
                check_equal(src.p, want.p, n, dt, 0, what, src0.p, NULL);
            gb_check(&src, es);

            gb_free(&src), gb_free(&src0), gb_free(&want), gb_free(&d);
        }
    }
    cx_scale(NULL, 0, dt, 0.5);
    cx_scale_copy(NULL, NULL, 0, dt, 0.5);
    cx_scale_copy(NULL, NULL, 0, dt, 1.0);
}

static void test_scale_edges(void **state)
{
    (void)state;
    int8_t i8[5] = {100, -100, 7, -7, 1};
    cx_scale(i8, 5, CFX_INT8, 3.0);
    assert_int_equal(i8[0], 127);
    assert_int_equal(i8[1], -128);
    assert_int_equal(i8[2], 21);
    assert_int_equal(i8[3], -21);
    int8_t h8[4] = {7, -7, 1, -1};
    cx_scale(h8, 4, CFX_INT8, 0.5); /* truncation toward zero */
    assert_int_equal(h8[0], 3);
    assert_int_equal(h8[1], -3);
    assert_int_equal(h8[2], 0);
    assert_int_equal(h8[3], 0);
    uint8_t u8[2] = {200, 10};
    cx_scale(u8, 2, CFX_UINT8, -1.0);
    assert_int_equal(u8[0], 0);
    assert_int_equal(u8[1], 0);
    int64_t i64[3] = {INT64_MAX, INT64_MIN, 5};
    cx_scale(i64, 3, CFX_INT64, 2.0);
    assert_true(i64[0] == INT64_MAX && i64[1] == INT64_MIN && i64[2] == 10);
    int32_t i32[2] = {5, -5};
    cx_scale(i32, 2, CFX_INT32, NAN);
    assert_int_equal(i32[0], 0);
    assert_int_equal(i32[1], 0);
    uint8_t bo[4] = {0, 1, 2, 255}, bd[4];
    cx_scale_copy(bd, bo, 4, CFX_BOOL, 0.25);
    assert_int_equal(bd[0], 0);
    assert_int_equal(bd[1], 1);
    assert_int_equal(bd[2], 1);
    assert_int_equal(bd[3], 1);
    cx_scale_copy(bd, bo, 4, CFX_BOOL, 0.0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(bd[i], 0);
    uint16_t h[2] = {0x3c00, 0x7bff}; /* 1.0 * 0.5, 65504 * 2 -> inf */
    cx_scale(h, 1, CFX_FLOAT16, 0.5);
    assert_int_equal(h[0], 0x3800);
    cx_scale(h + 1, 1, CFX_FLOAT16, 2.0);
    assert_int_equal(h[1], 0x7c00);
}

/* ---- identities --------------------------------------------------------------------------------- */

static void test_identity(void **state)
{
    cfx_dtype dt = *(cfx_dtype *)*state;
    size_t es = dt_size(dt), n = 1000;
    for (int op = 0; op < ELEMENTWISE_OPS; op++) {
        gbuf id = gb_new(n, dt), x = gb_new(n, dt), d = gb_new(n, dt), want = gb_new(n, dt);
        cx_fill_identity(id.p, n, dt, (cfx_reduce_op)op);
        gb_check(&id, es);

        /* The value itself, from the type's limits. */
        for (size_t i = 0; i < n; i++) {
            if (is_int(dt)) {
                int64_t v = get_int(id.p, i, dt);
                int64_t w = op == CFX_OP_MIN ? int_max(dt) : op == CFX_OP_MAX ? int_min(dt)
                            : op == CFX_OP_PRODUCT ? 1 : 0;
                assert_true(v == w);
            } else if (dt == CFX_BOOL) {
                uint64_t w = op == CFX_OP_MIN || op == CFX_OP_PRODUCT;
                assert_true(get_raw(id.p, i, dt) == w);
            } else {
                double v = get_real(id.p, i, dt);
                double w = op == CFX_OP_MIN ? INFINITY : op == CFX_OP_MAX ? -INFINITY
                           : op == CFX_OP_PRODUCT ? 1.0 : 0.0;
                assert_true(v == w);
            }
        }

        /* identity op x == x (bool: normalised to 0/1; floats: any NaN for NaN, 0 + -0 is +0). */
        fill_random(x.p, n, dt);
        for (size_t i = 0; i < n; i++) {
            uint64_t r = get_raw(x.p, i, dt);
            if (dt == CFX_BOOL)
                r = r != 0;
            put_raw(want.p, i, dt, r);
        }
        int zfree = !is_int(dt) && dt != CFX_BOOL;
        cx_reduce3(d.p, id.p, x.p, n, dt, (cfx_reduce_op)op);
        check_equal(d.p, want.p, n, dt, zfree, op_name((cfx_reduce_op)op), id.p, x.p);
        cx_reduce3(d.p, x.p, id.p, n, dt, (cfx_reduce_op)op);
        check_equal(d.p, want.p, n, dt, zfree, op_name((cfx_reduce_op)op), x.p, id.p);
        cx_fill_identity(NULL, 0, dt, (cfx_reduce_op)op);
        gb_free(&id), gb_free(&x), gb_free(&d), gb_free(&want);
    }
}

/* ---- float16 / bfloat16 conversions ------------------------------------------------------------- */

static void check_widen_exhaustive(cfx_dtype dt)
{
    const fmt *f = half_fmt(dt);
    float (*widen)(uint16_t) = dt == CFX_FLOAT16 ? cx_f16_to_f32 : cx_bf16_to_f32;
    uint16_t (*narrow)(float) = dt == CFX_FLOAT16 ? cx_f32_to_f16 : cx_f32_to_bf16;
    int shift = 23 - (f->p - 1); /* payload position difference to float32 */
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float x = widen((uint16_t)h);
        uint16_t back = narrow(x);
        uint32_t xb = bits_of_f32(x);
        if (half_is_nan((uint16_t)h, *f)) {
            uint32_t mmask = ((uint32_t)1 << (f->p - 1)) - 1;
            if (!isnan(x) || !((xb >> 22) & 1) || ((xb >> shift) & mmask) != ((h & mmask) | (mmask + 1) >> 1) ||
                (xb >> 31) != (h >> 15))
                fail_msg("%s 0x%04x widened to 0x%08x: not the same quiet NaN", dt_name(dt), h, xb);
            if (!half_is_nan(back, *f) || !half_is_quiet(back, *f) || (back >> 15) != (h >> 15))
                fail_msg("%s NaN 0x%04x came back as 0x%04x", dt_name(dt), h, back);
        } else {
            double want = ref_decode(h, *f);
            if ((double)x != want || !signbit(x) != !signbit(want))
                fail_msg("%s 0x%04x widened to %a, want %a", dt_name(dt), h, (double)x, want);
            if (back != h)
                fail_msg("%s 0x%04x round-tripped to 0x%04x", dt_name(dt), h, back);
        }
    }
}

static void test_f16_exhaustive(void **state)
{
    (void)state;
    check_widen_exhaustive(CFX_FLOAT16);
}

static void test_bf16_exhaustive(void **state)
{
    (void)state;
    check_widen_exhaustive(CFX_BFLOAT16);
}

static void check_narrow_one(cfx_dtype dt, float x)
{
    const fmt *f = half_fmt(dt);
    uint16_t got = (dt == CFX_FLOAT16 ? cx_f32_to_f16 : cx_f32_to_bf16)(x);
    if (isnan(x)) {
        if (!half_is_nan(got, *f) || !half_is_quiet(got, *f) || (got >> 15) != (bits_of_f32(x) >> 31))
            fail_msg("%s: NaN 0x%08x narrowed to 0x%04x", dt_name(dt), bits_of_f32(x), got);
        return;
    }
    uint32_t want = ref_encode(ref_round((double)x, *f), *f);
    if (got != want)
        fail_msg("%s: %a (0x%08x) narrowed to 0x%04x, want 0x%04x", dt_name(dt), (double)x,
                 bits_of_f32(x), got, want);
}

/* Midpoints between every pair of neighbours round to the even one; one float ulp either side
 * rounds to the nearer one. */
static void check_midpoints(cfx_dtype dt)
{
    const fmt *f = half_fmt(dt);
    uint16_t (*narrow)(float) = dt == CFX_FLOAT16 ? cx_f32_to_f16 : cx_f32_to_bf16;
    uint32_t inf = ((((uint32_t)1 << f->ebits) - 1) << (f->p - 1));
    for (uint32_t sign = 0; sign <= 0x8000; sign += 0x8000) {
        for (uint32_t h = 0; h < inf; h++) {
            double lo = ref_decode(h, *f);
            double hi = h + 1 == inf ? ldexp(1.0, f->emax + 1) : ref_decode(h + 1, *f);
            float mid = (float)((lo + hi) / 2); /* exact: one bit more than the format */
            assert_true((double)mid == (lo + hi) / 2);
            uint16_t even = (uint16_t)((h & 1) ? h + 1 : h);
            float below = nextafterf(mid, 0.0f), above = nextafterf(mid, INFINITY);
            if (sign) {
                mid = -mid, below = -below, above = -above;
            }
            uint16_t g = narrow(mid), gb = narrow(below), ga = narrow(above);
            if (g != (even | sign) || gb != (h | sign) || ga != ((h + 1) | sign))
                fail_msg("%s: around the midpoint of 0x%04x and its successor: got 0x%04x 0x%04x 0x%04x",
                         dt_name(dt), h | sign, gb, g, ga);
            check_narrow_one(dt, mid);
        }
    }
}

static void check_narrow_scan(cfx_dtype dt)
{
    /* A stride that is prime and odd visits every exponent and low-bit pattern class. */
    for (uint64_t u = 0; u <= 0xffffffffull; u += 997)
        check_narrow_one(dt, f32_of_bits((uint32_t)u));
    for (int i = 0; i < 200000; i++) {
        /* Concentrated on the narrow format's subnormal and overflow boundaries. */
        double e = dt == CFX_FLOAT16 ? -30.0 + 50.0 * rnd_unit() : -140.0 + 270.0 * rnd_unit();
        float x = (float)ldexp(1.0 + rnd_unit(), (int)e);
        check_narrow_one(dt, (rnd() & 1) ? -x : x);
    }
}

static void test_f16_narrow(void **state)
{
    (void)state;
    check_midpoints(CFX_FLOAT16);
    check_narrow_scan(CFX_FLOAT16);
    /* Landmarks, for a readable failure. */
    assert_int_equal(cx_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(cx_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(cx_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(cx_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(cx_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(cx_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(cx_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(cx_f32_to_f16(0x1p-25f), 0x0000);  /* tie to even: 0 */
    assert_int_equal(cx_f32_to_f16(0x1.8p-24f), 0x0002); /* tie to even: 2 */
    assert_int_equal(cx_f32_to_f16(0x1.000002p-25f), 0x0001);
    assert_int_equal(cx_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(cx_f32_to_f16(0x1.ff8p-15f), 0x03ff); /* largest subnormal */
    assert_int_equal(cx_f32_to_f16(0x1.ffcp-15f), 0x0400); /* tie: up to the smallest normal */
    assert_int_equal(cx_f32_to_f16(nextafterf(0x1.ffcp-15f, 0.0f)), 0x03ff);
    assert_int_equal(cx_f32_to_f16(1e-30f), 0x0000);
    assert_int_equal(cx_f32_to_f16(FLT_TRUE_MIN), 0x0000);
    assert_int_equal(cx_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);  /* tie to even: 1.0 */
    assert_int_equal(cx_f32_to_f16(1.0f + 0x3p-11f), 0x3c02);  /* tie to even: up */
    assert_true(half_is_nan(cx_f32_to_f16(f32_of_bits(0x7f800001u)), FMT_F16)); /* payload below f16's */
    assert_true(half_is_quiet(cx_f32_to_f16(f32_of_bits(0x7f800001u)), FMT_F16));
}

static void test_bf16_narrow(void **state)
{
    (void)state;
    check_midpoints(CFX_BFLOAT16);
    check_narrow_scan(CFX_BFLOAT16);
    assert_int_equal(cx_f32_to_bf16(FLT_MAX), 0x7f80);
    assert_int_equal(cx_f32_to_bf16(-FLT_MAX), 0xff80);
    assert_int_equal(cx_f32_to_bf16(0x1.fep127f), 0x7f7f);
    assert_int_equal(cx_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(cx_f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
    assert_int_equal(cx_f32_to_bf16(FLT_TRUE_MIN), 0x0000);
    assert_int_equal(cx_f32_to_bf16(f32_of_bits(0x00008000u)), 0x0000); /* subnormal tie to even */
    assert_int_equal(cx_f32_to_bf16(f32_of_bits(0x00018000u)), 0x0002);
    assert_int_equal(cx_f32_to_bf16(f32_of_bits(0x00010000u)), 0x0001);
    assert_true(half_is_nan(cx_f32_to_bf16(f32_of_bits(0x7f800001u)), FMT_BF16));
    assert_true(half_is_quiet(cx_f32_to_bf16(f32_of_bits(0x7f800001u)), FMT_BF16));
    assert_true(half_is_nan(cx_f32_to_bf16(f32_of_bits(0xffffffffu)), FMT_BF16));
}

/* ---- main --------------------------------------------------------------------------------------- */

static cfx_dtype all_dtypes[CFX_DTYPE_COUNT] = {CFX_UINT8,   CFX_INT8,     CFX_UINT16, CFX_INT16,
                                                CFX_INT32,   CFX_INT64,    CFX_FLOAT16, CFX_BFLOAT16,
                                                CFX_FLOAT32, CFX_FLOAT64,  CFX_BOOL};

#define PER_DTYPE(fn, dt) {#fn "_" #dt, fn, NULL, NULL, &all_dtypes[dt]}
#define ALL_DTYPES(fn)                                                                            \
    PER_DTYPE(fn, CFX_UINT8), PER_DTYPE(fn, CFX_INT8), PER_DTYPE(fn, CFX_UINT16),                \
        PER_DTYPE(fn, CFX_INT16), PER_DTYPE(fn, CFX_INT32), PER_DTYPE(fn, CFX_INT64),            \
        PER_DTYPE(fn, CFX_FLOAT16), PER_DTYPE(fn, CFX_BFLOAT16), PER_DTYPE(fn, CFX_FLOAT32),     \
        PER_DTYPE(fn, CFX_FLOAT64), PER_DTYPE(fn, CFX_BOOL)

int main(void)
{
    const struct CMUnitTest tests[] = {
        ALL_DTYPES(test_reduce),
        cmocka_unit_test(test_reduce_edges),
        ALL_DTYPES(test_scale),
        cmocka_unit_test(test_scale_edges),
        ALL_DTYPES(test_identity),
        cmocka_unit_test(test_f16_exhaustive),
        cmocka_unit_test(test_bf16_exhaustive),
        cmocka_unit_test(test_f16_narrow),
        cmocka_unit_test(test_bf16_narrow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
