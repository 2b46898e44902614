/*
 * half.h - float16 and bfloat16 <-> float32, one element at a time, round to nearest even: the one
 * definition of these conversions. kernels/reduce.c builds its array conversions and 16-bit
 * reductions on them; the Lua binding (bindings/lua/conflux_lua.i) reads and writes the elements of
 * its float16/bfloat16 arrays with them, so a value a script stores is the value the engine
 * reduces. Header-only (static inline), C11 and C++, no state and no other include of the engine.
 * cuda/cuda_kernels.cu keeps a device copy: its functions must be __device__, and it states that
 * they are bitwise equal to these (tests/gpu checks it on a GPU).
 */
#ifndef CX_KERNELS_HALF_H
#define CX_KERNELS_HALF_H

#include <stdint.h>
#include <string.h>

/* ---- bit casts ---------------------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- float16 / bfloat16 conversions ------------------------------------------------------------- */
/* Branch-free so the block loops vectorise. Under the default -ftrapping-math GCC will not
 * if-convert a floating-point operation it has sunk into one arm of a select, so the one FP
 * operation of each conversion (subnormals) is always computed and merged with an integer mask as
 * the last step, leaving nothing that could discard it. Both are exact or round to nearest even in
 * the default rounding mode, and stay right under FTZ/DAZ (no float32 subnormal is produced; one
 * consumed rounds to 0 in float16 anyway). */

static inline float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23);
    /* Exponent all ones stays all ones; a signalling NaN gets the quiet bit. */
    uint32_t infnan = (em << 13) | 0x7f800000u | (em > 0x7c00u ? 0x00400000u : 0u);
    uint32_t mag = em >= 0x7c00u ? infnan : normal;
    /* A subnormal (or zero) is em * 2^-24, exact in float32 and normal there. */
    uint32_t sub = f32_bits((float)(int32_t)em * 0x1p-24f);
    uint32_t is_sub = -(uint32_t)(em < 0x0400u);
    mag = (sub & is_sub) | (mag & ~is_sub);
    return f32_from_bits(mag | sign);
}

static inline uint16_t float_to_half(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    /* Normal range: rebias (the add wraps, i.e. subtracts 112 << 23), then round to nearest even by
     * adding half an ulp minus one plus the kept lsb; a carry may reach the exponent (up to inf). */
    uint32_t odd = (ax >> 13) & 1u;
    uint32_t r = (ax + 0xc8000fffu + odd) >> 13;
    r = ax >= 0x47800000u ? 0x7c00u : r; /* >= 65536 rounds to inf */
    /* Keep the top payload bits and force the quiet bit so a NaN never becomes inf. */
    r = ax > 0x7f800000u ? (0x7e00u | ((ax >> 13) & 0x03ffu)) : r;
    /* Below 2^-14: adding 0.5f puts the float16 subnormal ulp (2^-24) at the float's lsb, so the
     * FPU rounds to nearest even; the result may become the smallest normal, which is right. */
    uint32_t sub = f32_bits(f32_from_bits(ax) + 0.5f) - 0x3f000000u;
    uint32_t is_sub = -(uint32_t)(ax < 0x38800000u);
    r = (sub & is_sub) | (r & ~is_sub);
    return (uint16_t)(r | sign);
}

static inline float bhalf_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    return f32_from_bits(x | ((b & 0x7fffu) > 0x7f80u ? 0x00400000u : 0u));
}

static inline uint16_t float_to_bhalf(float f)
{
    uint32_t x = f32_bits(f);
    /* Overflow of the rounding add carries into the exponent, giving inf, as it should. */
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#endif /* CX_KERNELS_HALF_H */
