/*
 * reduce - elementwise kernels on host memory for every cfx_dtype: combine two buffers with a
 * reduction op, scale by a factor, fill with an op's identity, and the float16/bfloat16 conversions.
 *
 * Owns no state. Called by the transports (MPI user ops for f16/bf16, the local and shared-memory
 * data paths) and by execute (prescale/postscale fused into packing and unpacking).
 *
 * Semantics, the same for every caller so results are bitwise identical wherever they are computed:
 * - float16/bfloat16 are widened to float32, combined or scaled there, and rounded back to nearest
 *   even (NaN stays NaN, overflow gives infinity).
 * - Integers: sum/product wrap modulo 2^bits (unsigned arithmetic, no UB); scaling multiplies in
 *   double and truncates toward zero, saturating at the type's limits.
 * - float32 and float64 are scaled in double and rounded once. A caller's factor for a float32
 *   tensor is first taken at float32 precision (cx_tensor_factor, as the tensor's own arithmetic
 *   and Horovod's have it), while an average's division by the ranks is not rounded: an average
 *   is the correctly rounded sum / size.
 * - bool (one byte, any non-zero reads as 1, results are 0 or 1): sum and max = or; min and
 *   product = and; scaling by a factor f gives (x != 0 && f != 0).
 * - min/max on floats: a NaN in either operand gives NaN.
 * - CFX_OP_AVERAGE combines like CFX_OP_SUM (the division is a postscale).
 */
#ifndef CFX_REDUCE_H
#define CFX_REDUCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

/* dst[i] = dst[i] (op) src[i] for i < count. dst and src may not overlap unless equal. */
void cx_reduce_into(void *dst, const void *src, size_t count, cfx_dtype dtype, cfx_reduce_op op);

/* dst[i] = a[i] (op) b[i]; dst may equal a or b. */
void cx_reduce3(void *dst, const void *a, const void *b, size_t count, cfx_dtype dtype,
                cfx_reduce_op op);

/* A caller's pre/postscale factor as a tensor of dtype applies it: rounded to float32 for
 * float32 (the half formats round it in cx_scale), unchanged otherwise. Applied where a request
 * is made, before the average's 1/size joins the postscale. */
double cx_tensor_factor(cfx_dtype dtype, double factor);

/* buf[i] *= factor, in place. factor == 1.0 returns at once. */
void cx_scale(void *buf, size_t count, cfx_dtype dtype, double factor);

/* dst[i] = src[i] * factor (a plain copy when factor == 1.0). dst and src do not overlap. */
void cx_scale_copy(void *dst, const void *src, size_t count, cfx_dtype dtype, double factor);

/* buf[i] = the identity of op for dtype (0 for sum/average, 1 for product, the type's largest value
 * (+inf for floats) for min, its smallest (-inf) for max; bool: 0 for sum/max, 1 for min/product;
 * 0 for adasum, whose kernels are not here: exec/adasum.c). */
void cx_fill_identity(void *buf, size_t count, cfx_dtype dtype, cfx_reduce_op op);

/* Arrays of float16 (bf16 false) or bfloat16 to float32 and back (round to nearest even). */
void cx_half_widen(float *dst, const uint16_t *src, size_t n, bool bf16);
void cx_half_narrow(uint16_t *dst, const float *src, size_t n, bool bf16);

float cx_f16_to_f32(uint16_t h);
uint16_t cx_f32_to_f16(float f);
float cx_bf16_to_f32(uint16_t b);
uint16_t cx_f32_to_bf16(float f);

#endif /* CFX_REDUCE_H */
