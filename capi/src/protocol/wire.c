/* wire - requests, responses and their byte codec (see wire.h). */
#include "protocol/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define WIRE_MAGIC_REQUESTS 0x43465251u  /* "QRFC" */
#define WIRE_MAGIC_RESPONSES 0x43465253u /* "SRFC" */
#define WIRE_MAX_STRING (1u << 20)

void cx_bytes_free(cx_bytes *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

static void put(cx_bytes *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *data = realloc(b->data, cap);
        if (!data) {
            b->failed = true;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
}

/* All supported targets are little-endian x86-64/aarch64; values are stored as in memory. */
static void put_u8(cx_bytes *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(cx_bytes *b, uint32_t v) { put(b, &v, 4); }
static void put_i32(cx_bytes *b, int32_t v) { put(b, &v, 4); }
static void put_i64(cx_bytes *b, int64_t v) { put(b, &v, 8); }
static void put_f64(cx_bytes *b, double v) { put(b, &v, 8); }
static void put_str(cx_bytes *b, const char *s)
{
    if (!s) {
        put_u32(b, UINT32_MAX);
        return;
    }
    size_t n = strlen(s);
    put_u32(b, (uint32_t)n);
    put(b, s, n);
}

typedef struct reader {
    const uint8_t *p, *end;
    bool bad;
} reader;

static bool take(reader *r, void *dst, size_t n)
{
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = true;
        if (dst && n)
            memset(dst, 0, n);
        return false;
    }
    if (n)
        memcpy(dst, r->p, n);
    r->p += n;
    return true;
}

static uint8_t get_u8(reader *r) { uint8_t v; take(r, &v, 1); return v; }
static uint32_t get_u32(reader *r) { uint32_t v; take(r, &v, 4); return v; }
static int32_t get_i32(reader *r) { int32_t v; take(r, &v, 4); return v; }
static int64_t get_i64(reader *r) { int64_t v; take(r, &v, 8); return v; }
static double get_f64(reader *r) { double v; take(r, &v, 8); return v; }

static char *get_str(reader *r)
{
    uint32_t n = get_u32(r);
    if (r->bad || n == UINT32_MAX)
        return NULL;
    if (n > WIRE_MAX_STRING || (size_t)(r->end - r->p) < n) {
        r->bad = true;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        r->bad = true;
        return NULL;
    }
    memcpy(s, r->p, n);
    s[n] = '\0';
    r->p += n;
    if (memchr(s, '\0', n)) { /* embedded NUL: not a name we produced */
        free(s);
        r->bad = true;
        return NULL;
    }
    return s;
}

static void put_shape(cx_bytes *b, int32_t ndim, const int64_t *shape)
{
    put_i32(b, ndim);
    for (int32_t i = 0; i < ndim; i++)
        put_i64(b, shape[i]);
}

static void get_shape(reader *r, int32_t *ndim, int64_t *shape)
{
    *ndim = get_i32(r);
    if (*ndim < 0 || *ndim > CFX_MAX_NDIM) {
        r->bad = true;
        *ndim = 0;
        return;
    }
    for (int32_t i = 0; i < *ndim; i++)
        shape[i] = get_i64(r);
}

void cx_request_free(cx_request *r)
{
    free(r->name);
    free(r->group);
    r->name = r->group = NULL;
}

void cx_response_free(cx_response *r)
{
    free(r->name);
    free(r->group);
    free(r->message);
    free(r->rank_rows);
    r->name = r->group = r->message = NULL;
    r->rank_rows = NULL;
}

void cx_request_list_free(cx_request_list *l)
{
    for (size_t i = 0; i < l->count; i++)
        cx_request_free(&l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

void cx_response_list_free(cx_response_list *l)
{
    for (size_t i = 0; i < l->count; i++)
        cx_response_free(&l->items[i]);
    free(l->items);
    memset(l, 0, sizeof *l);
}

static bool dup_str(char **dst, const char *src)
{
    *dst = NULL;
    if (!src)
        return true;
    *dst = strdup(src);
    return *dst != NULL;
}

bool cx_request_copy(cx_request *dst, const cx_request *src)
{
    *dst = *src;
    dst->name = dst->group = NULL;
    if (dup_str(&dst->name, src->name) && dup_str(&dst->group, src->group))
        return true;
    cx_request_free(dst);
    return false;
}

bool cx_response_copy(cx_response *dst, const cx_response *src)
{
    *dst = *src;
    dst->name = dst->group = dst->message = NULL;
    dst->rank_rows = NULL;
    bool ok = dup_str(&dst->name, src->name) && dup_str(&dst->group, src->group) &&
              dup_str(&dst->message, src->message);
    if (ok && src->rank_rows) {
        dst->rank_rows = malloc(sizeof(int64_t) * src->nrows);
        ok = dst->rank_rows != NULL;
        if (ok)
            memcpy(dst->rank_rows, src->rank_rows, sizeof(int64_t) * src->nrows);
    }
    if (!ok)
        cx_response_free(dst);
    return ok;
}

cfx_status cx_encode_requests(const cx_request_list *l, cx_bytes *out)
{
    put_u32(out, WIRE_MAGIC_REQUESTS);
    put_i32(out, l->rank);
    put_u32(out, l->flags);
    put_u32(out, (uint32_t)l->count);
    for (size_t i = 0; i < l->count; i++) {
        const cx_request *q = &l->items[i];
        put_u8(out, q->coll);
        put_u8(out, q->dtype);
        put_u8(out, q->op);
        put_i32(out, q->device);
        put_i32(out, q->root);
        put_f64(out, q->prescale);
        put_f64(out, q->postscale);
        put_u32(out, q->group_size);
        put_str(out, q->name);
        put_str(out, q->group);
        put_shape(out, q->ndim, q->shape);
    }
    return out->failed ? cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory encoding requests") : CFX_OK;
}

cfx_status cx_decode_requests(const void *data, size_t len, cx_request_list *out)
{
    memset(out, 0, sizeof *out);
    reader r = {data, (const uint8_t *)data + len, false};
    if (get_u32(&r) != WIRE_MAGIC_REQUESTS)
        return cx_fail(CFX_ERR_INTERNAL, "malformed request list: bad magic (%zu bytes)", len);
    out->rank = get_i32(&r);
    out->flags = get_u32(&r);
    uint32_t count = get_u32(&r);
    /* Each request takes at least 42 bytes: bound the allocation by the input. */
    if (r.bad || count > len / 42)
        return cx_fail(CFX_ERR_INTERNAL, "malformed request list: count %u for %zu bytes", count, len);
    out->items = calloc(count ? count : 1, sizeof *out->items);
    if (!out->items)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory decoding %u requests", count);
    for (uint32_t i = 0; i < count && !r.bad; i++) {
        cx_request *q = &out->items[i];
        out->count = i + 1;
        q->coll = get_u8(&r);
        q->dtype = get_u8(&r);
        q->op = get_u8(&r);
        q->device = get_i32(&r);
        q->root = get_i32(&r);
        q->prescale = get_f64(&r);
        q->postscale = get_f64(&r);
        q->group_size = get_u32(&r);
        q->name = get_str(&r);
        q->group = get_str(&r);
        get_shape(&r, &q->ndim, q->shape);
        if (!q->name)
            r.bad = true;
    }
    if (r.bad || r.p != r.end)
        return cx_fail(CFX_ERR_INTERNAL, "malformed request list from rank %d (%zu bytes)",
                       out->rank, len);
    return CFX_OK;
}

cfx_status cx_encode_responses(const cx_response_list *l, cx_bytes *out)
{
    put_u32(out, WIRE_MAGIC_RESPONSES);
    put_u32(out, l->flags);
    put_u32(out, (uint32_t)l->count);
    for (size_t i = 0; i < l->count; i++) {
        const cx_response *s = &l->items[i];
        put_u8(out, s->coll);
        put_u8(out, s->dtype);
        put_u8(out, s->op);
        put_i32(out, s->device);
        put_i32(out, s->root);
        put_f64(out, s->prescale);
        put_f64(out, s->postscale);
        put_u32(out, s->group_size);
        put_i32(out, s->status);
        put_i32(out, s->last_joined);
        put_str(out, s->name);
        put_str(out, s->group);
        put_str(out, s->message);
        put_shape(out, s->ndim, s->shape);
        put_u32(out, s->rank_rows ? s->nrows : 0);
        for (uint32_t j = 0; s->rank_rows && j < s->nrows; j++)
            put_i64(out, s->rank_rows[j]);
    }
    if (l->flags & CX_LIST_TUNED) { /* autotune's parameters, after the items */
        put_i64(out, l->tuned_fusion_threshold);
        put_i64(out, l->tuned_chunk_bytes);
        put_f64(out, l->tuned_cycle_time_ms);
    }
    return out->failed ? cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory encoding responses") : CFX_OK;
}

cfx_status cx_decode_responses(const void *data, size_t len, cx_response_list *out)
{
    memset(out, 0, sizeof *out);
    reader r = {data, (const uint8_t *)data + len, false};
    if (get_u32(&r) != WIRE_MAGIC_RESPONSES)
        return cx_fail(CFX_ERR_INTERNAL, "malformed response list: bad magic (%zu bytes)", len);
    out->flags = get_u32(&r);
    uint32_t count = get_u32(&r);
    if (r.bad || count > len / 50)
        return cx_fail(CFX_ERR_INTERNAL, "malformed response list: count %u for %zu bytes", count, len);
    out->items = calloc(count ? count : 1, sizeof *out->items);
    if (!out->items)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory decoding %u responses", count);
    for (uint32_t i = 0; i < count && !r.bad; i++) {
        cx_response *s = &out->items[i];
        out->count = i + 1;
        s->coll = get_u8(&r);
        s->dtype = get_u8(&r);
        s->op = get_u8(&r);
        s->device = get_i32(&r);
        s->root = get_i32(&r);
        s->prescale = get_f64(&r);
        s->postscale = get_f64(&r);
        s->group_size = get_u32(&r);
        s->status = get_i32(&r);
        s->last_joined = get_i32(&r);
        s->name = get_str(&r);
        s->group = get_str(&r);
        s->message = get_str(&r);
        get_shape(&r, &s->ndim, s->shape);
        uint32_t nrows = get_u32(&r);
        if (nrows) {
            if (nrows > (size_t)(r.end - r.p) / 8) {
                r.bad = true;
                break;
            }
            s->rank_rows = malloc(sizeof(int64_t) * nrows);
            if (!s->rank_rows) {
                r.bad = true;
                break;
            }
            s->nrows = nrows;
            for (uint32_t j = 0; j < nrows; j++)
                s->rank_rows[j] = get_i64(&r);
        }
        if (!s->name)
            r.bad = true;
    }
    if (!r.bad && (out->flags & CX_LIST_TUNED)) {
        out->tuned_fusion_threshold = get_i64(&r);
        out->tuned_chunk_bytes = get_i64(&r);
        out->tuned_cycle_time_ms = get_f64(&r);
        if (out->tuned_fusion_threshold < 0 || out->tuned_chunk_bytes < 64 ||
            !(out->tuned_cycle_time_ms > 0))
            r.bad = true;
    }
    if (r.bad || r.p != r.end)
        return cx_fail(CFX_ERR_INTERNAL, "malformed response list (%zu bytes)", len);
    return CFX_OK;
}

int64_t cx_shape_elements(int32_t ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int32_t i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

const char *cx_shape_format(int32_t ndim, const int64_t *shape, char *buf, size_t size)
{
    size_t used = 0;
    int n = snprintf(buf, size, "[");
    used = n > 0 ? (size_t)n : 0;
    for (int32_t i = 0; i < ndim && used < size; i++) {
        n = snprintf(buf + used, size - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
        used += n > 0 ? (size_t)n : 0;
    }
    if (used < size)
        snprintf(buf + used, size - used, "]");
    return buf;
}
