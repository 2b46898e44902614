/*
 * compress - gradient compression on the wire: what each cfx_compression value means, the checks
 * a caller's choice must pass, and the pack/unpack kernels that convert float32/float64 values to
 * the 16-bit form that travels and back, with a scale factor fused in.
 *
 * The wire value of a request is the cfx_compression value after CFX_COMPRESSION_EVERYWHERE=1 has
 * turned FP16/BF16 into their _EVERYWHERE forms, so every rank's data path reads the same choice
 * from the agreed response. Called by the API (checks), exec/execute.c and exec/shm_*.c (kernels).
 */
#ifndef CFX_COMPRESS_H
#define CFX_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

/* Validates a caller's cfx_compression value and gives its wire value (fn names the call).
 * `everywhere` (CFX_COMPRESSION_EVERYWHERE, read and agreed at init: base/config.h) turns FP16 and
 * BF16 into their _EVERYWHERE forms. */
cfx_status cx_compression_wire(const char *fn, int32_t value, bool everywhere, uint8_t *out);

/* Whether tensor `what` (dtype, op, device) may be sent with wire value `c`: float32 and float64
 * host tensors, sum/average/min/max/product, not Adasum (CFX_ERR_INVALID_ARGUMENT naming it; a
 * device tensor: CFX_ERR_UNSUPPORTED, the device paths do not compress). */
cfx_status cx_compression_check(const char *fn, const char *what, cfx_dtype dtype,
                                cfx_reduce_op op, int32_t device, uint8_t c);

/* "none", "fp16", "bf16", "fp16 everywhere", "bf16 everywhere"; "unknown" out of range. */
const char *cx_compression_name(uint8_t c);

/* The 16-bit dtype values travel as (CFX_FLOAT16 or CFX_BFLOAT16), for a tensor of `dtype`
 * with wire value `c` on a leg that is (`cross_host`) or is not across hosts; -1 when the leg
 * sends the tensor's own dtype (no compression, or the leg is cheap and not forced). */
int cx_compression_leg(uint8_t c, cfx_dtype dtype, bool cross_host);

/* dst16[i] = round(src[i] * factor) in `wire` (CFX_FLOAT16/CFX_BFLOAT16), src float32/64.
 * With `residual` (count elements of dtype, error feedback): the residual is added before the
 * rounding and replaced by what the rounding took, v - widen(dst16[i]). */
void cx_compress_pack(uint16_t *dst16, const void *src, void *residual, size_t count,
                      cfx_dtype dtype, cfx_dtype wire, double factor);
/* dst[i] = widen(src16[i]) * factor (in float32 for float32, in float64 for float64). */
void cx_compress_unpack(void *dst, const uint16_t *src16, size_t count, cfx_dtype dtype,
                        cfx_dtype wire, double factor);

#endif /* CFX_COMPRESS_H */
