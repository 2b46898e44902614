/* compress - compression values, checks and pack/unpack kernels (see compress.h). */
#include "kernels/compress.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/reduce.h"

static bool forced_everywhere(void)
{
    const char *v = getenv("CFX_COMPRESSION_EVERYWHERE");
    return v && strcmp(v, "1") == 0;
}

cfx_status cx_compression_wire(const char *fn, int32_t value, uint8_t *out)
{
    if (value < 0 || value >= CFX_COMPRESSION_COUNT)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: compression %d is not a cfx_compression "
                       "(0..%d)", fn, (int)value, CFX_COMPRESSION_COUNT - 1);
    if (forced_everywhere() && (value == CFX_COMPRESSION_FP16 || value == CFX_COMPRESSION_BF16))
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

static float widen(uint16_t h, bool bf) { return bf ? cx_bf16_to_f32(h) : cx_f16_to_f32(h); }

/* cx_compress_pack with error feedback. */
static void pack_feedback(uint16_t *dst16, const void *src, void *residual, size_t count,
                          cfx_dtype dtype, bool bf, double factor)
{
    if (dtype == CFX_FLOAT32) {
        const float *s = src;
        float *e = residual, f = (float)factor;
        for (size_t i = 0; i < count; i++) {
            float v = (factor == 1.0 ? s[i] : s[i] * f) + e[i];
            dst16[i] = bf ? cx_f32_to_bf16(v) : cx_f32_to_f16(v);
            e[i] = v - widen(dst16[i], bf);
        }
    } else {
        const double *s = src;
        double *e = residual;
        for (size_t i = 0; i < count; i++) {
            double v = s[i] * factor + e[i];
            dst16[i] = bf ? cx_f32_to_bf16((float)v) : cx_f32_to_f16((float)v);
            e[i] = v - (double)widen(dst16[i], bf);
        }
    }
}

void cx_compress_pack(uint16_t *dst16, const void *src, void *residual, size_t count,
                      cfx_dtype dtype, cfx_dtype wire, double factor)
{
    bool bf = wire == CFX_BFLOAT16;
    if (residual) {
        pack_feedback(dst16, src, residual, count, dtype, bf, factor);
        return;
    }
    if (dtype == CFX_FLOAT32) {
        const float *s = src;
        float f = (float)factor;
        for (size_t i = 0; i < count; i++) {
            float v = factor == 1.0 ? s[i] : s[i] * f;
            dst16[i] = bf ? cx_f32_to_bf16(v) : cx_f32_to_f16(v);
        }
    } else {
        const double *s = src;
        for (size_t i = 0; i < count; i++) {
            float v = (float)(s[i] * factor);
            dst16[i] = bf ? cx_f32_to_bf16(v) : cx_f32_to_f16(v);
        }
    }
}

void cx_compress_unpack(void *dst, const uint16_t *src16, size_t count, cfx_dtype dtype,
                        cfx_dtype wire, double factor)
{
    bool bf = wire == CFX_BFLOAT16;
    if (dtype == CFX_FLOAT32) {
        float *d = dst, f = (float)factor;
        for (size_t i = 0; i < count; i++) {
            float v = bf ? cx_bf16_to_f32(src16[i]) : cx_f16_to_f32(src16[i]);
            d[i] = factor == 1.0 ? v : v * f;
        }
    } else {
        double *d = dst;
        for (size_t i = 0; i < count; i++)
            d[i] = (double)(bf ? cx_bf16_to_f32(src16[i]) : cx_f16_to_f32(src16[i])) * factor;
    }
}
