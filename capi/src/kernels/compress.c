/* compress - compression values, checks and pack/unpack kernels (see compress.h). */
#include "kernels/compress.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/reduce.h"

cfx_status cx_compression_wire(const char *fn, int32_t value, bool everywhere, uint8_t *out)
{
    if (value < 0 || value >= CFX_COMPRESSION_COUNT)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: compression %d is not a cfx_compression "
                       "(0..%d)", fn, (int)value, CFX_COMPRESSION_COUNT - 1);
    if (everywhere && (value == CFX_COMPRESSION_FP16 || value == CFX_COMPRESSION_BF16))
        value += CFX_COMPRESSION_FP16_EVERYWHERE - CFX_COMPRESSION_FP16;
    *out = (uint8_t)value;
    return CFX_OK;
}

cfx_status cx_compression_check(const char *fn, const char *what, cfx_dtype dtype,
                                cfx_reduce_op op, int32_t device, uint8_t c)
{
    if (c == CFX_COMPRESSION_NONE)
        return CFX_OK;
    if (device != CFX_DEVICE_CPU)
        return cx_fail(CFX_ERR_UNSUPPORTED, "%s: %s: compression takes host tensors (this one is "
                       "on CUDA device %d)", fn, what, (int)device);
    if (dtype != CFX_FLOAT32 && dtype != CFX_FLOAT64)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: %s compression takes float32 and float64 "
                       "tensors, not %s", fn, what, cx_compression_name(c),
                       cfx_dtype_name(dtype));
    if (op > CFX_OP_PRODUCT) /* Adasum's dot products need the tensors' own values */
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: %s: op %s does not combine compressed "
                       "values (use compression none)", fn, what, cfx_op_name(op));
    return CFX_OK;
}

const char *cx_compression_name(uint8_t c)
{
    static const char *const names[CFX_COMPRESSION_COUNT] = {
        "none", "fp16", "bf16", "fp16 everywhere", "bf16 everywhere"};
    return c < CFX_COMPRESSION_COUNT ? names[c] : "unknown";
}

int cx_compression_leg(uint8_t c, cfx_dtype dtype, bool cross_host)
{
    if (c == CFX_COMPRESSION_NONE || c >= CFX_COMPRESSION_COUNT ||
        (dtype != CFX_FLOAT32 && dtype != CFX_FLOAT64))
        return -1;
    bool everywhere = c >= CFX_COMPRESSION_FP16_EVERYWHERE;
    if (!everywhere && !cross_host)
        return -1;
    bool bf16 = c == CFX_COMPRESSION_BF16 || c == CFX_COMPRESSION_BF16_EVERYWHERE;
    return bf16 ? CFX_BFLOAT16 : CFX_FLOAT16;
}

/* Packing and unpacking go through the array conversions (kernels/reduce.h, F16C where the CPU
 * has it) in blocks that stay in L1. */
#define BLOCK 512

/* The values to pack, block [i, i + n) of src: src * factor (+ e, float32's residual), as float32. */
static void pack_values(float *v, const void *src, const float *e, size_t i, size_t n,
                        cfx_dtype dtype, double factor)
{
    if (dtype == CFX_FLOAT32) {
        const float *s = (const float *)src + i;
        float f = (float)factor;
        for (size_t j = 0; j < n; j++)
            v[j] = (factor == 1.0 ? s[j] : s[j] * f) + (e ? e[i + j] : 0.0f);
    } else {
        const double *s = (const double *)src + i;
        for (size_t j = 0; j < n; j++)
            v[j] = (float)(s[j] * factor);
    }
}

void cx_compress_pack(uint16_t *dst16, const void *src, void *residual, size_t count,
                      cfx_dtype dtype, cfx_dtype wire, double factor)
{
    bool bf = wire == CFX_BFLOAT16;
    if (dtype == CFX_FLOAT32 && factor == 1.0 && !residual) {
        cx_half_narrow(dst16, src, count, bf);
        return;
    }
    float v[BLOCK], w[BLOCK];
    for (size_t i = 0; i < count; i += BLOCK) {
        size_t n = count - i < BLOCK ? count - i : BLOCK;
        if (dtype == CFX_FLOAT32 || !residual) {
            pack_values(v, src, dtype == CFX_FLOAT32 ? residual : NULL, i, n, dtype, factor);
            cx_half_narrow(dst16 + i, v, n, bf);
            if (residual) { /* what the rounding took stays on this rank (error feedback) */
                cx_half_widen(w, dst16 + i, n, bf);
                for (size_t j = 0; j < n; j++)
                    ((float *)residual)[i + j] = v[j] - w[j];
            }
        } else { /* float64 with feedback: the residual keeps float64's precision */
            const double *s = (const double *)src + i;
            double *e = (double *)residual + i;
            for (size_t j = 0; j < n; j++)
                v[j] = (float)(s[j] * factor + e[j]);
            cx_half_narrow(dst16 + i, v, n, bf);
            cx_half_widen(w, dst16 + i, n, bf);
            for (size_t j = 0; j < n; j++)
                e[j] = s[j] * factor + e[j] - (double)w[j];
        }
    }
}

void cx_compress_unpack(void *dst, const uint16_t *src16, size_t count, cfx_dtype dtype,
                        cfx_dtype wire, double factor)
{
    bool bf = wire == CFX_BFLOAT16;
    if (dtype == CFX_FLOAT32 && factor == 1.0) {
        cx_half_widen(dst, src16, count, bf);
        return;
    }
    float w[BLOCK];
    for (size_t i = 0; i < count; i += BLOCK) {
        size_t n = count - i < BLOCK ? count - i : BLOCK;
        cx_half_widen(w, src16 + i, n, bf);
        if (dtype == CFX_FLOAT32) {
            float *d = (float *)dst + i, f = (float)factor;
            for (size_t j = 0; j < n; j++)
                d[j] = w[j] * f;
        } else {
            double *d = (double *)dst + i;
            for (size_t j = 0; j < n; j++)
                d[j] = (double)w[j] * factor;
        }
    }
}
