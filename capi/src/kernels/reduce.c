/* reduce.c - implements reduce.h. */
#include "kernels/reduce.h"
#include "kernels/half.h"

#include <math.h>
#include <string.h>

/* f16/bf16 are widened this many elements at a time into stack arrays, so the float32 loops below
 * run unchanged (and vectorised) on them while the stack stays small. */
#define CX_HALF_BLOCK 256

/* The element conversions (half_to_float, float_to_half, bhalf_to_float, float_to_bhalf) and the
 * bit casts live in kernels/half.h, which the Lua binding includes too. */

float cx_f16_to_f32(uint16_t h) { return half_to_float(h); }
uint16_t cx_f32_to_f16(float f) { return float_to_half(f); }
float cx_bf16_to_f32(uint16_t b) { return bhalf_to_float(b); }
uint16_t cx_f32_to_bf16(float f) { return float_to_bhalf(f); }

/* float16 <-> float32 over arrays: with the F16C instructions where the CPU has them (chosen once
 * at run time; they round to nearest even and treat NaNs and subnormals as the code above does),
 * else the portable code. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#define CX_HAVE_F16C_PATH 1

__attribute__((target("avx,f16c"))) static void f16_widen_f16c(float *restrict d,
                                                                const uint16_t *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + i))));
    for (; i < n; i++)
        d[i] = half_to_float(s[i]);
}

__attribute__((target("avx,f16c"))) static void f16_narrow_f16c(uint16_t *restrict d,
                                                                 const float *restrict s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        d[i] = float_to_half(s[i]);
}

static bool have_f16c(void)
{
    static atomic_int known = -1; /* every thread that finds it unset computes the same answer */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k < 0) {
        unsigned a, b, c, d;
        k = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && __builtin_cpu_supports("avx");
        atomic_store_explicit(&known, k, memory_order_relaxed);
    }
    return k;
}
#endif

static void f16_widen(float *restrict d, const uint16_t *restrict s, size_t n)
{
#ifdef CX_HAVE_F16C_PATH
    if (have_f16c()) {
        f16_widen_f16c(d, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        d[i] = half_to_float(s[i]);
}

static void f16_narrow(uint16_t *restrict d, const float *restrict s, size_t n)
{
#ifdef CX_HAVE_F16C_PATH
    if (have_f16c()) {
        f16_narrow_f16c(d, s, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        d[i] = float_to_half(s[i]);
}

/* The bfloat16 conversions are a few integer operations an element: let GCC vectorize them at -O2
 * (its default cost model there only vectorizes loops of a known multiple of the vector length). */
#if defined(__GNUC__) && !defined(__clang__)
#define CX_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define CX_VECTORIZE
#endif

CX_VECTORIZE static void bf16_widen(float *restrict d, const uint16_t *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = bhalf_to_float(s[i]);
}

CX_VECTORIZE static void bf16_narrow(uint16_t *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = float_to_bhalf(s[i]);
}

void cx_half_widen(float *dst, const uint16_t *src, size_t n, bool bf16)
{
    (bf16 ? bf16_widen : f16_widen)(dst, src, n);
}

void cx_half_narrow(uint16_t *dst, const float *src, size_t n, bool bf16)
{
    (bf16 ? bf16_narrow : f16_narrow)(dst, src, n);
}

/* ---- elementwise ops ---------------------------------------------------------------------------- */
/* Integers go through the unsigned type W (at least unsigned int, so that narrow types are not
 * promoted to int, where a product could overflow): wrapping is defined there. */
#define CX_INT_OPS(name, T, W)                                                                    \
    static inline T name##_sum(T x, T y) { return (T)((W)x + (W)y); }                             \
    static inline T name##_prod(T x, T y) { return (T)((W)x * (W)y); }                            \
    static inline T name##_min(T x, T y) { return x < y ? x : y; }                                \
    static inline T name##_max(T x, T y) { return x > y ? x : y; }

CX_INT_OPS(u8, uint8_t, uint32_t)
CX_INT_OPS(i8, int8_t, uint32_t)
CX_INT_OPS(u16, uint16_t, uint32_t)
CX_INT_OPS(i16, int16_t, uint32_t)
CX_INT_OPS(i32, int32_t, uint32_t)
CX_INT_OPS(i64, int64_t, uint64_t)

/* NaN in either operand gives NaN; x + y yields it quiet. Otherwise a plain compare-select, which
 * is exactly what minps/maxps compute. Separate selects rather than || keep the loops vectorisable
 * under -ftrapping-math. */
#define CX_FLOAT_OPS(name, T)                                                                     \
    static inline T name##_sum(T x, T y) { return x + y; }                                        \
    static inline T name##_prod(T x, T y) { return x * y; }                                       \
    static inline T name##_min(T x, T y)                                                          \
    {                                                                                             \
        T nan = x + y, m = x < y ? x : y;                                                         \
        m = x != x ? nan : m;                                                                     \
        return y != y ? nan : m;                                                                  \
    }                                                                                             \
    static inline T name##_max(T x, T y)                                                          \
    {                                                                                             \
        T nan = x + y, m = x > y ? x : y;                                                         \
        m = x != x ? nan : m;                                                                     \
        return y != y ? nan : m;                                                                  \
    }

CX_FLOAT_OPS(f32, float)
CX_FLOAT_OPS(f64, double)

static inline uint8_t bool_or(uint8_t x, uint8_t y) { return (uint8_t)((x | y) != 0); }
static inline uint8_t bool_and(uint8_t x, uint8_t y) { return (uint8_t)((x != 0) & (y != 0)); }

/* ---- reduction kernels -------------------------------------------------------------------------- */
/* Four shapes per dtype/op so every loop has non-aliasing restrict pointers: three distinct buffers,
 * in place (d = d op s), in place with the operands swapped (d = s op d, keeping a op b's operand
 * order when dst == b: the sign of a zero min/max depends on it), and d = d op d. */
typedef void (*cx_kernel3)(void *d, const void *a, const void *b, size_t n);
typedef void (*cx_kernel2)(void *d, const void *s, size_t n);
typedef void (*cx_kernel1)(void *d, size_t n);

typedef struct cx_kernels {
    cx_kernel3 k3;
    cx_kernel2 k2;
    cx_kernel2 k2r;
    cx_kernel1 k1;
} cx_kernels;

#define CX_KERNELS(name, T, OP)                                                                   \
    static inline void name##_loop3(T *restrict d, const T *restrict a, const T *restrict b,     \
                                    size_t n)                                                     \
    {                                                                                             \
        for (size_t i = 0; i < n; i++)                                                            \
            d[i] = OP(a[i], b[i]);                                                                \
    }                                                                                             \
    static inline void name##_loop2(T *restrict d, const T *restrict s, size_t n)                \
    {                                                                                             \
        for (size_t i = 0; i < n; i++)                                                            \
            d[i] = OP(d[i], s[i]);                                                                \
    }                                                                                             \
    static inline void name##_loop2r(T *restrict d, const T *restrict s, size_t n)               \
    {                                                                                             \
        for (size_t i = 0; i < n; i++)                                                            \
            d[i] = OP(s[i], d[i]);                                                                \
    }                                                                                             \
    static void name##_k3(void *d, const void *a, const void *b, size_t n)                        \
    {                                                                                             \
        name##_loop3(d, a, b, n);                                                                 \
    }                                                                                             \
    static void name##_k2(void *d, const void *s, size_t n) { name##_loop2(d, s, n); }            \
    static void name##_k2r(void *d, const void *s, size_t n) { name##_loop2r(d, s, n); }          \
    static void name##_k1(void *dv, size_t n)                                                     \
    {                                                                                             \
        T *d = dv;                                                                                \
        for (size_t i = 0; i < n; i++)                                                            \
            d[i] = OP(d[i], d[i]);                                                                \
    }

#define CX_KERNELS_INT(name, T)                                                                   \
    CX_KERNELS(name##_sum, T, name##_sum)                                                         \
    CX_KERNELS(name##_prod, T, name##_prod)                                                       \
    CX_KERNELS(name##_min, T, name##_min)                                                         \
    CX_KERNELS(name##_max, T, name##_max)

CX_KERNELS_INT(u8, uint8_t)
CX_KERNELS_INT(i8, int8_t)
CX_KERNELS_INT(u16, uint16_t)
CX_KERNELS_INT(i16, int16_t)
CX_KERNELS_INT(i32, int32_t)
CX_KERNELS_INT(i64, int64_t)
CX_KERNELS_INT(f32, float)
CX_KERNELS_INT(f64, double)
CX_KERNELS(bool_or, uint8_t, bool_or)
CX_KERNELS(bool_and, uint8_t, bool_and)

/* Slots of the kernel table; AVERAGE shares SUM's. */
enum { CX_SLOT_SUM, CX_SLOT_MIN, CX_SLOT_MAX, CX_SLOT_PROD, CX_SLOT_COUNT };

#define CX_ENTRY(name) {name##_k3, name##_k2, name##_k2r, name##_k1}
#define CX_ROW(name) {CX_ENTRY(name##_sum), CX_ENTRY(name##_min), CX_ENTRY(name##_max), CX_ENTRY(name##_prod)}

/* f16/bf16 rows stay empty: they go through the blocked float32 path. */
static const cx_kernels cx_kernel_table[CFX_DTYPE_COUNT][CX_SLOT_COUNT] = {
    [CFX_UINT8] = CX_ROW(u8),
    [CFX_INT8] = CX_ROW(i8),
    [CFX_UINT16] = CX_ROW(u16),
    [CFX_INT16] = CX_ROW(i16),
    [CFX_INT32] = CX_ROW(i32),
    [CFX_INT64] = CX_ROW(i64),
    [CFX_FLOAT32] = CX_ROW(f32),
    [CFX_FLOAT64] = CX_ROW(f64),
    [CFX_BOOL] = {CX_ENTRY(bool_or), CX_ENTRY(bool_and), CX_ENTRY(bool_or), CX_ENTRY(bool_and)},
};

static int op_slot(cfx_reduce_op op)
{
    switch (op) {
    case CFX_OP_SUM:
    case CFX_OP_AVERAGE: return CX_SLOT_SUM;
    case CFX_OP_MIN: return CX_SLOT_MIN;
    case CFX_OP_MAX: return CX_SLOT_MAX;
    case CFX_OP_PRODUCT: return CX_SLOT_PROD;
    case CFX_OP_ADASUM: break; /* not elementwise: exec/adasum.c */
    }
    return -1;
}

static size_t dtype_bytes(cfx_dtype dtype)
{
    static const unsigned char bytes[CFX_DTYPE_COUNT] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
    return (unsigned)dtype < CFX_DTYPE_COUNT ? bytes[dtype] : 0;
}

static int is_half(cfx_dtype dtype) { return dtype == CFX_FLOAT16 || dtype == CFX_BFLOAT16; }

/* Both inputs of a block are widened before the block is written, so dst may equal a or b. */
static void half_reduce3(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n,
                         cfx_dtype dtype, int slot)
{
    float ta[CX_HALF_BLOCK], tb[CX_HALF_BLOCK];
    void (*widen)(float *restrict, const uint16_t *restrict, size_t) =
        dtype == CFX_FLOAT16 ? f16_widen : bf16_widen;
    void (*narrow)(uint16_t *restrict, const float *restrict, size_t) =
        dtype == CFX_FLOAT16 ? f16_narrow : bf16_narrow;
    cx_kernel2 combine = cx_kernel_table[CFX_FLOAT32][slot].k2;

    for (size_t off = 0; off < n; off += CX_HALF_BLOCK) {
        size_t m = n - off < CX_HALF_BLOCK ? n - off : CX_HALF_BLOCK;
        widen(ta, a + off, m);
        widen(tb, b + off, m);
        combine(ta, tb, m);
        narrow(d + off, ta, m);
    }
}

void cx_reduce3(void *dst, const void *a, const void *b, size_t count, cfx_dtype dtype,
                cfx_reduce_op op)
{
    int slot = op_slot(op);
    if (count == 0 || slot < 0 || (unsigned)dtype >= CFX_DTYPE_COUNT)
        return;
    if (is_half(dtype)) {
        half_reduce3(dst, a, b, count, dtype, slot);
        return;
    }
    const cx_kernels *k = &cx_kernel_table[dtype][slot];
    if (dst == a && dst == b)
        k->k1(dst, count);
    else if (dst == a)
        k->k2(dst, b, count);
    else if (dst == b)
        k->k2r(dst, a, count);
    else
        k->k3(dst, a, b, count);
}

void cx_reduce_into(void *dst, const void *src, size_t count, cfx_dtype dtype, cfx_reduce_op op)
{
    cx_reduce3(dst, dst, src, count, dtype, op);
}

/* ---- scaling ------------------------------------------------------------------------------------ */
/* Integers: NaN gives 0; the clamp happens in double, where LO and HI are exact, so the final
 * conversion (which truncates toward zero) is always in range. */
#define CX_INT_SCALE(name, T, LO, HI)                                                             \
    static inline T name##_scale(T x, double f)                                                   \
    {                                                                                             \
        double v = (double)x * f;                                                                 \
        v = v == v ? v : 0.0;                                                                     \
        v = v < (LO) ? (LO) : v;                                                                  \
        v = v > (HI) ? (HI) : v;                                                                  \
        return (T)v;                                                                              \
    }

CX_INT_SCALE(u8, uint8_t, 0.0, 255.0)
CX_INT_SCALE(i8, int8_t, -128.0, 127.0)
CX_INT_SCALE(u16, uint16_t, 0.0, 65535.0)
CX_INT_SCALE(i16, int16_t, -32768.0, 32767.0)
CX_INT_SCALE(i32, int32_t, -2147483648.0, 2147483647.0)

/* INT64_MAX is not a double: anything at or above 2^63 saturates before the conversion. */
static inline int64_t i64_scale(int64_t x, double f)
{
    double v = (double)x * f;
    v = v == v ? v : 0.0;
    v = v < -0x1p63 ? -0x1p63 : v;
    int64_t r = (int64_t)(v >= 0x1p63 ? 0.0 : v);
    return v >= 0x1p63 ? INT64_MAX : r;
}

/* float32 is scaled in double by the double factor and rounded once: an average over 3 ranks is
 * the correctly rounded sum / 3 (1/3 rounded to float first is off by an ulp in a third of the
 * cases); a caller's own factor arrives rounded to float32 (cx_tensor_factor), so its product is
 * exact in double and rounds once, as float32 arithmetic does. float16/bfloat16 are scaled in
 * float32 by the factor rounded to float. */
static inline float f32_scale(float x, double f) { return (float)((double)x * f); }
static inline double f64_scale(double x, double f) { return x * f; }
static inline uint8_t bool_scale(uint8_t x, double f) { return (uint8_t)(x != 0 && f != 0.0); }

#define CX_SCALE_KERNELS(name, T)                                                                 \
    static inline void name##_scale_loop(T *restrict d, const T *restrict s, size_t n, double f)  \
    {                                                                                             \
        for (size_t i = 0; i < n; i++)                                                            \
            d[i] = name##_scale(s[i], f);                                                         \
    }                                                                                             \
    static void name##_scale_ip(void *dv, size_t n, double f)                                     \
    {                                                                                             \
        T *d = dv;                                                                                \
        for (size_t i = 0; i < n; i++)                                                            \
            d[i] = name##_scale(d[i], f);                                                         \
    }                                                                                             \
    static void name##_scale_cp(void *d, const void *s, size_t n, double f)                       \
    {                                                                                             \
        name##_scale_loop(d, s, n, f);                                                            \
    }

CX_SCALE_KERNELS(u8, uint8_t)
CX_SCALE_KERNELS(i8, int8_t)
CX_SCALE_KERNELS(u16, uint16_t)
CX_SCALE_KERNELS(i16, int16_t)
CX_SCALE_KERNELS(i32, int32_t)
CX_SCALE_KERNELS(i64, int64_t)
CX_SCALE_KERNELS(f32, float)
CX_SCALE_KERNELS(f64, double)
CX_SCALE_KERNELS(bool, uint8_t)

typedef struct cx_scalers {
    void (*in_place)(void *d, size_t n, double f);
    void (*copy)(void *d, const void *s, size_t n, double f);
} cx_scalers;

#define CX_SCALER(name) {name##_scale_ip, name##_scale_cp}

static const cx_scalers cx_scaler_table[CFX_DTYPE_COUNT] = {
    [CFX_UINT8] = CX_SCALER(u8),     [CFX_INT8] = CX_SCALER(i8),   [CFX_UINT16] = CX_SCALER(u16),
    [CFX_INT16] = CX_SCALER(i16),    [CFX_INT32] = CX_SCALER(i32), [CFX_INT64] = CX_SCALER(i64),
    [CFX_FLOAT32] = CX_SCALER(f32),  [CFX_FLOAT64] = CX_SCALER(f64), [CFX_BOOL] = CX_SCALER(bool),
};

/* d may equal s: each block is widened before it is written. */
static void half_scale(uint16_t *d, const uint16_t *s, size_t n, cfx_dtype dtype, double factor)
{
    float t[CX_HALF_BLOCK];
    float f = (float)factor;
    void (*widen)(float *restrict, const uint16_t *restrict, size_t) =
        dtype == CFX_FLOAT16 ? f16_widen : bf16_widen;
    void (*narrow)(uint16_t *restrict, const float *restrict, size_t) =
        dtype == CFX_FLOAT16 ? f16_narrow : bf16_narrow;

    for (size_t off = 0; off < n; off += CX_HALF_BLOCK) {
        size_t m = n - off < CX_HALF_BLOCK ? n - off : CX_HALF_BLOCK;
        widen(t, s + off, m);
        for (size_t i = 0; i < m; i++)
            t[i] *= f;
        narrow(d + off, t, m);
    }
}

double cx_tensor_factor(cfx_dtype dtype, double factor)
{
    return dtype == CFX_FLOAT32 ? (double)(float)factor : factor;
}

void cx_scale(void *buf, size_t count, cfx_dtype dtype, double factor)
{
    if (factor == 1.0 || count == 0 || (unsigned)dtype >= CFX_DTYPE_COUNT)
        return;
    if (is_half(dtype))
        half_scale(buf, buf, count, dtype, factor);
    else
        cx_scaler_table[dtype].in_place(buf, count, factor);
}

void cx_scale_copy(void *dst, const void *src, size_t count, cfx_dtype dtype, double factor)
{
    if (count == 0 || (unsigned)dtype >= CFX_DTYPE_COUNT)
        return;
    if (factor == 1.0)
        memcpy(dst, src, count * dtype_bytes(dtype));
    else if (is_half(dtype))
        half_scale(dst, src, count, dtype, factor);
    else
        cx_scaler_table[dtype].copy(dst, src, count, factor);
}

/* ---- identities --------------------------------------------------------------------------------- */

#define CX_FILL(T, v)                                                                             \
    do {                                                                                          \
        T *p_ = buf;                                                                              \
        T v_ = (v);                                                                               \
        for (size_t i_ = 0; i_ < count; i_++)                                                     \
            p_[i_] = v_;                                                                          \
    } while (0)

/* Picks the identity of slot for one type: sum, min, max, product. */
#define CX_IDENT(slot, zero, top, bottom, one)                                                    \
    ((slot) == CX_SLOT_SUM ? (zero) : (slot) == CX_SLOT_MIN ? (top) : (slot) == CX_SLOT_MAX ? (bottom) : (one))

void cx_fill_identity(void *buf, size_t count, cfx_dtype dtype, cfx_reduce_op op)
{
    int s = op == CFX_OP_ADASUM ? CX_SLOT_SUM : op_slot(op); /* Adasum's identity: zeros */
    if (count == 0 || s < 0)
        return;
    switch (dtype) {
    case CFX_UINT8: CX_FILL(uint8_t, (uint8_t)CX_IDENT(s, 0, UINT8_MAX, 0, 1)); break;
    case CFX_INT8: CX_FILL(int8_t, (int8_t)CX_IDENT(s, 0, INT8_MAX, INT8_MIN, 1)); break;
    case CFX_UINT16: CX_FILL(uint16_t, (uint16_t)CX_IDENT(s, 0, UINT16_MAX, 0, 1)); break;
    case CFX_INT16: CX_FILL(int16_t, (int16_t)CX_IDENT(s, 0, INT16_MAX, INT16_MIN, 1)); break;
    case CFX_INT32: CX_FILL(int32_t, (int32_t)CX_IDENT(s, 0, INT32_MAX, INT32_MIN, 1)); break;
    case CFX_INT64: CX_FILL(int64_t, (int64_t)CX_IDENT(s, 0, INT64_MAX, INT64_MIN, 1)); break;
    case CFX_FLOAT16: CX_FILL(uint16_t, (uint16_t)CX_IDENT(s, 0x0000u, 0x7c00u, 0xfc00u, 0x3c00u)); break;
    case CFX_BFLOAT16: CX_FILL(uint16_t, (uint16_t)CX_IDENT(s, 0x0000u, 0x7f80u, 0xff80u, 0x3f80u)); break;
    case CFX_FLOAT32: CX_FILL(float, (float)CX_IDENT(s, 0.0f, INFINITY, -INFINITY, 1.0f)); break;
    case CFX_FLOAT64: CX_FILL(double, (double)CX_IDENT(s, 0.0, INFINITY, -INFINITY, 1.0)); break;
    case CFX_BOOL: CX_FILL(uint8_t, (uint8_t)CX_IDENT(s, 0, 1, 0, 1)); break;
    }
}
