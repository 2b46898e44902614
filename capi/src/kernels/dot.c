/* dot - float64-accumulated dot products and scaled sums for Adasum (see dot.h). */
#include "kernels/dot.h"

#include <stdint.h>

#include "kernels/reduce.h"

bool cx_dot_dtype_ok(cfx_dtype dtype)
{
    return dtype == CFX_FLOAT16 || dtype == CFX_BFLOAT16 || dtype == CFX_FLOAT32 ||
           dtype == CFX_FLOAT64;
}

/* Element i of a float vector, widened to double. */
static inline double load(const void *v, size_t i, cfx_dtype dtype)
{
    switch (dtype) {
    case CFX_FLOAT16: return cx_f16_to_f32(((const uint16_t *)v)[i]);
    case CFX_BFLOAT16: return cx_bf16_to_f32(((const uint16_t *)v)[i]);
    case CFX_FLOAT32: return ((const float *)v)[i];
    default: return ((const double *)v)[i];
    }
}

static inline void store(void *v, size_t i, cfx_dtype dtype, double x)
{
    switch (dtype) {
    case CFX_FLOAT16: ((uint16_t *)v)[i] = cx_f32_to_f16((float)x); break;
    case CFX_BFLOAT16: ((uint16_t *)v)[i] = cx_f32_to_bf16((float)x); break;
    case CFX_FLOAT32: ((float *)v)[i] = (float)x; break;
    default: ((double *)v)[i] = x; break;
    }
}

/* Four partial sums per quantity, so that the additions do not wait on each other (a fixed
 * order: the same inputs give the same bits). */
#define DOT3_BODY(T, LOAD)                                                                     \
    do {                                                                                       \
        const T *pa = a, *pb = b;                                                              \
        double ab[4] = {0}, aa[4] = {0}, bb[4] = {0};                                          \
        size_t i = 0;                                                                          \
        for (; i + 4 <= n; i += 4)                                                             \
            for (int k = 0; k < 4; k++) {                                                      \
                double x = LOAD(pa[i + k]), y = LOAD(pb[i + k]);                               \
                ab[k] += x * y;                                                                \
                aa[k] += x * x;                                                                \
                bb[k] += y * y;                                                                \
            }                                                                                  \
        for (int k = 0; i < n; i++, k++) {                                                     \
            double x = LOAD(pa[i]), y = LOAD(pb[i]);                                           \
            ab[k] += x * y;                                                                    \
            aa[k] += x * x;                                                                    \
            bb[k] += y * y;                                                                    \
        }                                                                                      \
        out[0] += (ab[0] + ab[1]) + (ab[2] + ab[3]);                                           \
        out[1] += (aa[0] + aa[1]) + (aa[2] + aa[3]);                                           \
        out[2] += (bb[0] + bb[1]) + (bb[2] + bb[3]);                                           \
    } while (0)

#define AS_DOUBLE(x) ((double)(x))

void cx_dot3(const void *a, const void *b, size_t n, cfx_dtype dtype, double out[3])
{
    switch (dtype) {
    case CFX_FLOAT16: DOT3_BODY(uint16_t, (double)cx_f16_to_f32); break;
    case CFX_BFLOAT16: DOT3_BODY(uint16_t, (double)cx_bf16_to_f32); break;
    case CFX_FLOAT32: DOT3_BODY(float, AS_DOUBLE); break;
    case CFX_FLOAT64: DOT3_BODY(double, AS_DOUBLE); break;
    default: break;
    }
}

void cx_axpby(void *dst, double ca, const void *a, double cb, const void *b, size_t n,
              cfx_dtype dtype)
{
    if (!cx_dot_dtype_ok(dtype))
        return;
    if (dtype == CFX_FLOAT32) {
        float *d = dst;
        const float *pa = a, *pb = b;
        for (size_t i = 0; i < n; i++)
            d[i] = (float)(ca * pa[i] + cb * pb[i]);
        return;
    }
    if (dtype == CFX_FLOAT64) {
        double *d = dst;
        const double *pa = a, *pb = b;
        for (size_t i = 0; i < n; i++)
            d[i] = ca * pa[i] + cb * pb[i];
        return;
    }
    for (size_t i = 0; i < n; i++)
        store(dst, i, dtype, ca * load(a, i, dtype) + cb * load(b, i, dtype));
}
