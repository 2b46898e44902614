/*
 * dot - the float kernels of the Adasum combination (exec/adasum.c): dot product and squared
 * norms of two vectors accumulated in float64, and the scaled sum of two vectors.
 *
 * Only float16, bfloat16, float32 and float64 (other dtypes: no-ops). Half types are widened
 * with kernels/reduce.h's conversions; every element is combined in float64 and rounded once to
 * the dtype (nearest even). Results depend only on the inputs and their order, so any caller that
 * hands the same vectors gets the same bits.
 */
#ifndef CFX_DOT_H
#define CFX_DOT_H

#include <stdbool.h>
#include <stddef.h>

#include "conflux/conflux.h"

/* Whether the kernels below take dtype. */
bool cx_dot_dtype_ok(cfx_dtype dtype);

/* out[0] += a.b, out[1] += a.a, out[2] += b.b over n elements. */
void cx_dot3(const void *a, const void *b, size_t n, cfx_dtype dtype, double out[3]);

/* dst[i] = ca * a[i] + cb * b[i]; dst may equal a or b. */
void cx_axpby(void *dst, double ca, const void *a, double cb, const void *b, size_t n,
              cfx_dtype dtype);

#endif /* CFX_DOT_H */
