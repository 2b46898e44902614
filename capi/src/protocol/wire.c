/* wire - requests, responses and their byte codec (see wire.h). */
#include "protocol/wire.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/dtype.h"
#include "base/error.h"

#define WIRE_MAGIC_REQUESTS 0x43465251u  /* "QRFC" */
#define WIRE_MAGIC_RESPONSES 0x43465253u /* "SRFC" */
#define WIRE_MAGIC_HELLO 0x48584643u       /* "CFXH" */
#define WIRE_MAGIC_HELLO_TABLE 0x54584643u /* "CFXT" */
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
static void put_u16(cx_bytes *b, uint16_t v) { put(b, &v, 2); }
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

/* ---- decoding: every read checked against the end, the first problem described -------------- */

typedef struct reader {
    const uint8_t *start, *p, *end;
    bool bad;
    const char *kind; /* "request", "response": names the item in messages */
    long item;        /* index of the item being read; -1 in the list's header */
    char why[256];    /* what was wrong first */
} reader;

static void bad(reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bad(reader *r, const char *fmt, ...)
{
    if (r->bad)
        return;
    r->bad = true;
    int n = 0;
    if (r->item >= 0)
        n = snprintf(r->why, sizeof r->why, "%s %ld: ", r->kind, r->item);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why + n, sizeof r->why - (size_t)n, fmt, ap);
    va_end(ap);
}

static reader reader_of(const void *data, size_t len, const char *kind)
{
    static const uint8_t none[1];
    const uint8_t *p = data ? data : none; /* no arithmetic on NULL, even + 0 */
    return (reader){.start = p, .p = p, .end = p + (data ? len : 0), .kind = kind, .item = -1};
}

static size_t left(const reader *r) { return (size_t)(r->end - r->p); }

static bool take(reader *r, void *dst, size_t n, const char *what)
{
    if (!r->bad && left(r) < n)
        bad(r, "%s cut short at byte %zu (%zu of %zu bytes there)", what,
            (size_t)(r->p - r->start), left(r), n);
    if (r->bad) {
        memset(dst, 0, n);
        return false;
    }
    memcpy(dst, r->p, n);
    r->p += n;
    return true;
}

static uint8_t get_u8(reader *r, const char *what) { uint8_t v; take(r, &v, 1, what); return v; }
static uint16_t get_u16(reader *r, const char *what) { uint16_t v; take(r, &v, 2, what); return v; }
static uint32_t get_u32(reader *r, const char *what) { uint32_t v; take(r, &v, 4, what); return v; }
static int32_t get_i32(reader *r, const char *what) { int32_t v; take(r, &v, 4, what); return v; }
static int64_t get_i64(reader *r, const char *what) { int64_t v; take(r, &v, 8, what); return v; }
static double get_f64(reader *r, const char *what) { double v; take(r, &v, 8, what); return v; }

/* A string, or NULL for the "absent" length (also NULL once the reader is bad). The length is
 * checked against the bytes that are there before anything is allocated. */
static char *get_str(reader *r, const char *what)
{
    uint32_t n = get_u32(r, what);
    if (r->bad || n == UINT32_MAX)
        return NULL;
    if (n > WIRE_MAX_STRING || left(r) < n) {
        bad(r, "%s: length %u %s (%zu bytes left)", what, n,
            n > WIRE_MAX_STRING ? "is above the limit of 1 MiB" : "runs past the end", left(r));
        return NULL;
    }
    if (memchr(r->p, '\0', n)) { /* embedded NUL: not a string we produced */
        bad(r, "%s: a NUL byte inside its %u bytes", what, n);
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        bad(r, "%s: out of memory for %u bytes", what, n);
        return NULL;
    }
    memcpy(s, r->p, n);
    s[n] = '\0';
    r->p += n;
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
    *ndim = get_i32(r, "ndim");
    if (!r->bad && (*ndim < 0 || *ndim > CFX_MAX_NDIM))
        bad(r, "ndim %d is outside 0..%d", *ndim, CFX_MAX_NDIM);
    if (r->bad) {
        *ndim = 0;
        return;
    }
    for (int32_t i = 0; i < *ndim; i++)
        shape[i] = get_i64(r, "shape");
}

/* The fields a request and a response share, checked as api.c checks a caller's tensor, so that
 * what the engine decodes is what some rank could have submitted. */
static void check_common(reader *r, uint8_t coll, uint8_t dtype, uint8_t op, int32_t device,
                         int32_t root, double prescale, double postscale, int32_t ndim,
                         const int64_t *shape)
{
    if (r->bad)
        return;
    if (coll >= CX_COLL_COUNT)
        bad(r, "collective %u is unknown (0..%d)", coll, CX_COLL_COUNT - 1);
    else if (!cx_dtype_valid(dtype))
        bad(r, "dtype %u is unknown (0..%d)", dtype, CFX_DTYPE_COUNT - 1);
    else if (!cx_op_valid(op))
        bad(r, "op %u is unknown (0..%d)", op, CFX_OP_COUNT - 1);
    else if (device < CFX_DEVICE_CPU)
        bad(r, "device %d is neither the CPU (-1) nor a device ordinal", device);
    else if (root < -1)
        bad(r, "root %d is negative", root);
    else if (!isfinite(prescale) || !isfinite(postscale))
        bad(r, "scale factors are not finite (prescale %g, postscale %g)", prescale, postscale);
    size_t bytes = cfx_dtype_size((cfx_dtype)dtype);
    for (int32_t i = 0; i < ndim && !r->bad; i++) {
        if (shape[i] < 0)
            bad(r, "dimension %d is negative (%lld)", i, (long long)shape[i]);
        else if (__builtin_mul_overflow(bytes, (size_t)shape[i], &bytes) || bytes > (size_t)INT64_MAX)
            bad(r, "the shape's size in bytes overflows");
    }
}

static void check_compression(reader *r, uint8_t c)
{
    if (!r->bad && c >= CFX_COMPRESSION_COUNT)
        bad(r, "compression %u is unknown (0..%d)", c, CFX_COMPRESSION_COUNT - 1);
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
        put_u8(out, q->compression);
    }
    return out->failed ? cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory encoding requests") : CFX_OK;
}

/* The smallest encoded request and response (every string absent or empty, ndim 0, no rows):
 * a count above len / these cannot be real, so it never sizes an allocation. */
#define WIRE_MIN_REQUEST 44
#define WIRE_MIN_RESPONSE 60

cfx_status cx_decode_requests(const void *data, size_t len, cx_request_list *out)
{
    memset(out, 0, sizeof *out);
    reader r = reader_of(data, len, "request");
    uint32_t magic = get_u32(&r, "magic");
    if (!r.bad && magic != WIRE_MAGIC_REQUESTS)
        bad(&r, "magic 0x%08x is not a request list's (0x%08x)", magic, WIRE_MAGIC_REQUESTS);
    out->rank = get_i32(&r, "rank");
    bool rank_known = !r.bad && out->rank >= 0;
    if (!r.bad && out->rank < 0)
        bad(&r, "rank %d is negative", out->rank);
    out->flags = get_u32(&r, "flags");
    uint32_t count = get_u32(&r, "count");
    if (!r.bad && count > len / WIRE_MIN_REQUEST)
        bad(&r, "count %u cannot fit in %zu bytes", count, len);
    if (!r.bad && !(out->items = calloc(count ? count : 1, sizeof *out->items)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory decoding %u requests", count);
    for (uint32_t i = 0; i < count && !r.bad; i++) {
        cx_request *q = &out->items[i];
        out->count = i + 1;
        r.item = i;
        q->coll = get_u8(&r, "collective");
        q->dtype = get_u8(&r, "dtype");
        q->op = get_u8(&r, "op");
        q->device = get_i32(&r, "device");
        q->root = get_i32(&r, "root");
        q->prescale = get_f64(&r, "prescale");
        q->postscale = get_f64(&r, "postscale");
        q->group_size = get_u32(&r, "group size");
        q->name = get_str(&r, "name");
        if (!r.bad && !q->name)
            bad(&r, "the name is missing");
        q->group = get_str(&r, "group");
        get_shape(&r, &q->ndim, q->shape);
        q->compression = get_u8(&r, "compression");
        check_common(&r, q->coll, q->dtype, q->op, q->device, q->root, q->prescale, q->postscale,
                     q->ndim, q->shape);
        check_compression(&r, q->compression);
    }
    r.item = -1;
    if (!r.bad && r.p != r.end)
        bad(&r, "%zu bytes left over after %u requests", left(&r), count);
    if (!r.bad)
        return CFX_OK;
    char peer[32] = "an unknown rank";
    if (rank_known)
        snprintf(peer, sizeof peer, "rank %d", out->rank);
    return cx_fail(CFX_ERR_TRANSPORT, "malformed request list from %s (%zu bytes): %s", peer, len,
                   r.why);
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
        put_u8(out, s->compression);
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
    reader r = reader_of(data, len, "response");
    uint32_t magic = get_u32(&r, "magic");
    if (!r.bad && magic != WIRE_MAGIC_RESPONSES)
        bad(&r, "magic 0x%08x is not a response list's (0x%08x)", magic, WIRE_MAGIC_RESPONSES);
    out->flags = get_u32(&r, "flags");
    uint32_t count = get_u32(&r, "count");
    if (!r.bad && count > len / WIRE_MIN_RESPONSE)
        bad(&r, "count %u cannot fit in %zu bytes", count, len);
    if (!r.bad && !(out->items = calloc(count ? count : 1, sizeof *out->items)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory decoding %u responses", count);
    for (uint32_t i = 0; i < count && !r.bad; i++) {
        cx_response *s = &out->items[i];
        out->count = i + 1;
        r.item = i;
        s->coll = get_u8(&r, "collective");
        s->dtype = get_u8(&r, "dtype");
        s->op = get_u8(&r, "op");
        s->device = get_i32(&r, "device");
        s->root = get_i32(&r, "root");
        s->prescale = get_f64(&r, "prescale");
        s->postscale = get_f64(&r, "postscale");
        s->group_size = get_u32(&r, "group size");
        s->status = get_i32(&r, "status");
        s->last_joined = get_i32(&r, "last joined rank");
        s->name = get_str(&r, "name");
        if (!r.bad && !s->name)
            bad(&r, "the name is missing");
        s->group = get_str(&r, "group");
        s->message = get_str(&r, "message");
        get_shape(&r, &s->ndim, s->shape);
        uint32_t nrows = get_u32(&r, "row count");
        if (!r.bad && nrows > left(&r) / 8)
            bad(&r, "%u rows cannot fit in the %zu bytes left", nrows, left(&r));
        if (!r.bad && nrows) {
            if (!(s->rank_rows = malloc(sizeof(int64_t) * nrows)))
                bad(&r, "out of memory for %u rows", nrows);
            else
                s->nrows = nrows;
            for (uint32_t j = 0; j < s->nrows; j++) {
                s->rank_rows[j] = get_i64(&r, "rows");
                if (!r.bad && s->rank_rows[j] < 0)
                    bad(&r, "rank %u's row count is negative (%lld)", j, (long long)s->rank_rows[j]);
            }
        }
        s->compression = get_u8(&r, "compression");
        check_common(&r, s->coll, s->dtype, s->op, s->device, s->root, s->prescale, s->postscale,
                     s->ndim, s->shape);
        check_compression(&r, s->compression);
        if (!r.bad && s->status < 0)
            bad(&r, "status %d is negative", s->status);
        if (!r.bad && s->last_joined < -1)
            bad(&r, "last joined rank %d is negative", s->last_joined);
    }
    r.item = -1;
    if (!r.bad && (out->flags & CX_LIST_TUNED)) {
        out->tuned_fusion_threshold = get_i64(&r, "tuned fusion threshold");
        out->tuned_chunk_bytes = get_i64(&r, "tuned chunk size");
        out->tuned_cycle_time_ms = get_f64(&r, "tuned cycle time");
        if (!r.bad && (out->tuned_fusion_threshold < 0 || out->tuned_chunk_bytes < CX_CHUNK_MIN ||
                       !(out->tuned_cycle_time_ms >= CX_CYCLE_TIME_MIN_MS &&
                         out->tuned_cycle_time_ms <= CX_CYCLE_TIME_MAX_MS)))
            bad(&r, "tuned parameters out of range (fusion %lld B, chunk %lld B, cycle %g ms)",
                (long long)out->tuned_fusion_threshold, (long long)out->tuned_chunk_bytes,
                out->tuned_cycle_time_ms);
    }
    if (!r.bad && r.p != r.end)
        bad(&r, "%zu bytes left over after %u responses", left(&r), count);
    if (!r.bad)
        return CFX_OK;
    return cx_fail(CFX_ERR_TRANSPORT, "malformed response list from the coordinator (rank 0, "
                   "%zu bytes): %s", len, r.why);
}

/* ---- the handshake (see wire.h) -------------------------------------------------------------- */

cfx_status cx_encode_hello(const cx_hello *h, cx_bytes *out)
{
    put_u32(out, WIRE_MAGIC_HELLO);
    put_u16(out, h->lib_major);
    put_u16(out, h->lib_minor);
    put_u16(out, h->lib_patch);
    put_u16(out, h->wire_major);
    put_u16(out, h->wire_minor);
    put_u32(out, h->features);
    return out->failed ? cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory encoding the handshake")
                       : CFX_OK;
}

/* One rank's record. A record that is too short or carries another magic is not an error of the
 * table: it says that rank speaks no handshake this library knows (readable = false). */
static void get_hello(reader *r, uint32_t n, cx_hello *h)
{
    memset(h, 0, sizeof *h);
    h->bytes = n;
    reader rec = {.start = r->p, .p = r->p, .end = r->p + n, .kind = "record", .item = -1};
    r->p += n;
    uint32_t magic = get_u32(&rec, "magic");
    h->lib_major = get_u16(&rec, "library major");
    h->lib_minor = get_u16(&rec, "library minor");
    h->lib_patch = get_u16(&rec, "library patch");
    h->wire_major = get_u16(&rec, "wire major");
    h->wire_minor = get_u16(&rec, "wire minor");
    h->features = get_u32(&rec, "features");
    h->readable = !rec.bad && magic == WIRE_MAGIC_HELLO; /* later versions may append fields */
}

cfx_status cx_encode_hello_table(const void *records, const size_t *lens, int count, cx_bytes *out)
{
    put_u32(out, WIRE_MAGIC_HELLO_TABLE);
    put_u32(out, (uint32_t)count);
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        put_u32(out, (uint32_t)lens[i]);
        put(out, lens[i] ? (const uint8_t *)records + off : NULL, lens[i]);
        off += lens[i];
    }
    return out->failed ? cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory encoding the handshake")
                       : CFX_OK;
}

cfx_status cx_decode_hello_table(const void *data, size_t len, int count, cx_hello *out)
{
    reader r = reader_of(data, len, "rank");
    memset(out, 0, sizeof *out * (size_t)count);
    uint32_t magic = get_u32(&r, "magic");
    if (!r.bad && magic != WIRE_MAGIC_HELLO_TABLE)
        bad(&r, "magic 0x%08x is not a handshake table's (0x%08x)", magic, WIRE_MAGIC_HELLO_TABLE);
    uint32_t n = get_u32(&r, "count");
    if (!r.bad && n != (uint32_t)count)
        bad(&r, "%u records for %d ranks", n, count);
    for (int i = 0; i < count && !r.bad; i++) {
        r.item = i;
        uint32_t rec = get_u32(&r, "record length");
        if (!r.bad && rec > left(&r))
            bad(&r, "record length %u runs past the end (%zu bytes left)", rec, left(&r));
        if (!r.bad)
            get_hello(&r, rec, &out[i]);
    }
    r.item = -1;
    if (!r.bad && r.p != r.end)
        bad(&r, "%zu bytes left over after %d records", left(&r), count);
    if (!r.bad)
        return CFX_OK;
    return cx_fail(CFX_ERR_TRANSPORT, "malformed handshake table from rank 0 (%zu bytes): %s", len,
                   r.why);
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
