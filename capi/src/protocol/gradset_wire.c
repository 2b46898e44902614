/* gradset_wire - a gradient set's registration as little-endian bytes (see gradset_wire.h). */
#include "protocol/gradset_wire.h"

#include <stdlib.h>
#include <string.h>

/* Byte by byte, so the layout is the same on hosts of either byte order. */
static void put_le(uint8_t *buf, size_t *len, uint64_t v, size_t n)
{
    if (buf)
        for (size_t i = 0; i < n; i++)
            buf[*len + i] = (uint8_t)(v >> (8 * i));
    *len += n;
}

void cx_gradset_wire_header(uint8_t *buf, size_t *len, uint32_t count, uint32_t compression)
{
    put_le(buf, len, count, 4);
    put_le(buf, len, compression, 4);
}

void cx_gradset_wire_grad(uint8_t *buf, size_t *len, const cx_gradset_reg *g)
{
    put_le(buf, len, g->name_len, 4);
    if (buf)
        memcpy(buf + *len, g->name, g->name_len);
    *len += g->name_len;
    put_le(buf, len, (uint32_t)g->dtype, 4);
    put_le(buf, len, (uint32_t)g->device, 4);
    put_le(buf, len, (uint32_t)g->ndim, 4);
    for (int32_t d = 0; d < g->ndim; d++)
        put_le(buf, len, (uint64_t)g->shape[d], 8);
}

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static bool take_le(reader *r, uint64_t *out, size_t n)
{
    if ((size_t)(r->end - r->p) < n)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    *out = v;
    return true;
}

static bool take_u32(reader *r, uint32_t *out)
{
    uint64_t v;
    if (!take_le(r, &v, 4))
        return false;
    *out = (uint32_t)v;
    return true;
}

static bool take_i32(reader *r, int32_t *out)
{
    uint32_t v;
    if (!take_u32(r, &v))
        return false;
    *out = (int32_t)v;
    return true;
}

bool cx_gradset_wire_decode(const uint8_t *bytes, size_t len, cx_gradset_reg **out,
                            uint32_t *count, uint32_t *compression)
{
    reader r = {bytes, bytes + len};
    *out = NULL;
    /* Every gradient takes at least 16 bytes: a bound on the count before anything is allocated. */
    if (!take_u32(&r, count) || !take_u32(&r, compression) || *count > len / 16)
        return false;
    cx_gradset_reg *g = calloc(*count ? *count : 1, sizeof *g);
    if (!g)
        return false;
    for (uint32_t i = 0; i < *count; i++) {
        if (!take_u32(&r, &g[i].name_len) || (size_t)(r.end - r.p) < g[i].name_len)
            goto bad;
        g[i].name = (const char *)r.p;
        r.p += g[i].name_len;
        if (!take_i32(&r, &g[i].dtype) || !take_i32(&r, &g[i].device) ||
            !take_i32(&r, &g[i].ndim) || g[i].ndim < 0 || g[i].ndim > CFX_MAX_NDIM)
            goto bad;
        for (int32_t d = 0; d < g[i].ndim; d++) {
            uint64_t v;
            if (!take_le(&r, &v, 8))
                goto bad;
            g[i].shape[d] = (int64_t)v;
        }
    }
    if (r.p != r.end)
        goto bad;
    *out = g;
    return true;
bad:
    free(g);
    return false;
}
