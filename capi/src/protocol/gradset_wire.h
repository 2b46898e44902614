/*
 * gradset_wire - a gradient set's registration as bytes: what each rank sends at
 * cfx_gradset_commit so that every rank can check every other's gradients against rank 0's.
 *
 * Layout, little-endian whatever the host (as wire.h promises for every byte ranks exchange):
 * u32 count, u32 compression (the set's wire value), then per gradient: u32 name length, the name's
 * bytes, i32 dtype, i32 device kind (-1 CPU, 0 CUDA: ordinals may differ between ranks), i32 ndim,
 * ndim x i64 extents. The decoder checks every length against the bytes that are there before it
 * reads or allocates, so a corrupt registration is a refusal, never a crash (tests/fuzz, target
 * gradset).
 */
#ifndef CFX_GRADSET_WIRE_H
#define CFX_GRADSET_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

/* One gradient of a registration. Decoded, `name` points into the bytes (not terminated). */
typedef struct cx_gradset_reg {
    const char *name;
    uint32_t name_len;
    int32_t dtype, device, ndim; /* device: the kind, -1 CPU or 0 CUDA */
    int64_t shape[CFX_MAX_NDIM];
} cx_gradset_reg;

/* Appends to buf (NULL: only counts) at *len, which it advances: first the header, then each
 * gradient in registration order. Measure once with buf NULL, allocate, write again. */
void cx_gradset_wire_header(uint8_t *buf, size_t *len, uint32_t count, uint32_t compression);
void cx_gradset_wire_grad(uint8_t *buf, size_t *len, const cx_gradset_reg *g);

/* Decodes one rank's registration into *out (malloc'ed, *count entries, the caller frees it) and
 * its compression; false (and *out NULL) when the bytes are not one well-formed registration. */
bool cx_gradset_wire_decode(const uint8_t *bytes, size_t len, cx_gradset_reg **out,
                            uint32_t *count, uint32_t *compression);

#endif /* CFX_GRADSET_WIRE_H */
