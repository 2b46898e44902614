/* handshake - versions and features agreed at init (see handshake.h). */
#include "protocol/handshake.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "transport/registry.h"

/* Distinct (versions, features) classes a message lists; further ranks are counted. */
#define MAX_CLASSES 8
#define TEXT_MAX 1536

void cx_hello_self(const cx_config *cfg, cx_hello *out)
{
    memset(out, 0, sizeof *out);
    out->lib_major = CFX_VERSION_MAJOR;
    out->lib_minor = CFX_VERSION_MINOR;
    out->lib_patch = CFX_VERSION_PATCH;
    out->wire_major = CX_WIRE_VERSION_MAJOR;
    out->wire_minor = CX_WIRE_VERSION_MINOR;
    if (cfg->test.wire_major >= 0) {
        out->wire_major = (uint16_t)cfg->test.wire_major;
        out->wire_minor = (uint16_t)cfg->test.wire_minor;
    }
    out->features = cx_transport_features(); /* the transports this build has (registry.h) */
#if defined(CFX_HAVE_CUDA) && CFX_HAVE_CUDA
    out->features |= CFX_FEATURE_CUDA;
#endif
#if defined(CFX_HAVE_NCCL) && CFX_HAVE_NCCL
    out->features |= CFX_FEATURE_NCCL;
#endif
    out->readable = true;
}

/* A bounded text being appended to; what does not fit is cut with "...". */
typedef struct text {
    char buf[TEXT_MAX];
    size_t len;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...)
{
    if (t->len >= sizeof t->buf - 4) /* full: already cut */
        return;
    size_t room = sizeof t->buf - 4 - t->len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, room, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < room) {
        t->len += (size_t)n;
        return;
    }
    memcpy(t->buf + sizeof t->buf - 5, "...", 4); /* right after what fitted */
    t->len = sizeof t->buf - 4;
}

static bool same_class(const cx_hello *a, const cx_hello *b)
{
    if (!a->readable || !b->readable)
        return !a->readable && !b->readable && a->bytes == b->bytes;
    return a->wire_major == b->wire_major && a->wire_minor == b->wire_minor &&
           a->lib_major == b->lib_major && a->lib_minor == b->lib_minor &&
           a->lib_patch == b->lib_patch && a->features == b->features;
}

/* The features' names: a transport's is its registry name, the others the device paths'. */
static void add_features(text *t, uint32_t f)
{
    const char *sep = "";
    for (int b = 0; b < 32; b++) {
        uint32_t bit = 1u << b;
        if (!(f & bit))
            continue;
        const char *name = cx_transport_feature_name(bit);
        if (!name)
            name = bit == CFX_FEATURE_CUDA ? "cuda" : bit == CFX_FEATURE_NCCL ? "nccl" : NULL;
        if (name)
            add(t, "%s%s", sep, name);
        else
            add(t, "%sbit %d", sep, b);
        sep = "+";
    }
    if (!*sep)
        add(t, "none");
}

static void add_hello(text *t, const cx_hello *h)
{
    if (!h->readable) {
        add(t, "no Conflux handshake (%u bytes)", h->bytes);
        return;
    }
    add(t, "wire protocol %u.%u (Conflux %u.%u.%u, features ", h->wire_major, h->wire_minor,
        h->lib_major, h->lib_minor, h->lib_patch);
    add_features(t, h->features);
    add(t, ")");
}

/* "rank 3" or "ranks 0-2, 5": the ranks in class `c` (class_of[r] == c), ascending. */
static void add_ranks(text *t, const int *class_of, int size, int c)
{
    int count = 0;
    for (int r = 0; r < size; r++)
        count += class_of[r] == c;
    add(t, count == 1 ? "rank " : "ranks ");
    const char *sep = "";
    for (int r = 0; r < size; r++) {
        if (class_of[r] != c)
            continue;
        int last = r;
        while (last + 1 < size && class_of[last + 1] == c)
            last++;
        if (last > r)
            add(t, "%s%d-%d", sep, r, last);
        else
            add(t, "%s%d", sep, r);
        sep = ", ";
        r = last;
    }
}

/* "rank 1: wire protocol 2.0 (...); ranks 0, 2: wire protocol 1.0 (...)". */
static void add_classes(text *t, const cx_hello *all, const int *class_of, int size,
                        const int *first, int nclasses)
{
    int others = 0;
    for (int r = 0; r < size; r++)
        others += class_of[r] < 0;
    for (int c = 0; c < nclasses; c++) {
        add(t, "%s", c ? "; " : "");
        add_ranks(t, class_of, size, c);
        add(t, ": ");
        add_hello(t, &all[first[c]]);
    }
    if (others)
        add(t, "; and %d more rank%s in further combinations", others, others == 1 ? "" : "s");
}

cfx_status cx_hello_verdict(const cx_hello *all, int size, int rank, const cx_logger *log)
{
    int *class_of = malloc(sizeof *class_of * (size_t)size);
    if (!class_of)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the handshake of %d ranks", size);
    int first[MAX_CLASSES], nclasses = 0;
    bool readable = true, same_major = true;
    for (int r = 0; r < size; r++) {
        readable = readable && all[r].readable;
        same_major = same_major && all[r].wire_major == all[0].wire_major;
        class_of[r] = -1;
        for (int c = 0; c < nclasses && class_of[r] < 0; c++)
            if (same_class(&all[r], &all[first[c]]))
                class_of[r] = c;
        if (class_of[r] < 0 && nclasses < MAX_CLASSES) {
            first[nclasses] = r;
            class_of[r] = nclasses++;
        }
    }
    text t = {.len = 0};
    add_classes(&t, all, class_of, size, first, nclasses);
    free(class_of);
    if (!readable)
        return cx_fail(CFX_ERR_VERSION, "ranks cannot talk: some sent no handshake this library "
                       "reads (Conflux %d.%d.%d): %s", CFX_VERSION_MAJOR, CFX_VERSION_MINOR,
                       CFX_VERSION_PATCH, t.buf);
    if (!same_major)
        return cx_fail(CFX_ERR_VERSION, "ranks cannot talk: their wire protocol major versions "
                       "differ (every rank needs the same): %s", t.buf);
    if (nclasses > 1 && rank == 0)
        cx_log(log, CX_LOG_WARNING, "handshake", "ranks run different versions or builds that speak "
               "compatible wire protocols, going on: %s", t.buf);
    return CFX_OK;
}

cfx_status cx_handshake(cx_transport *t, const cx_config *cfg, const cx_logger *log)
{
    if (t->size == 1)
        return CFX_OK;
    cx_hello mine;
    cx_hello_self(cfg, &mine);
    cx_bytes rec = {0};
    /* A rank that cannot encode still takes part (with no record), so no rank waits forever. */
    cx_encode_hello(&mine, &rec);
    size_t *lens = calloc((size_t)t->size, sizeof *lens);
    if (!lens) {
        cx_bytes_free(&rec);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the handshake");
    }
    void *gathered = NULL;
    cfx_status st = t->ops->gather_bytes(t, rec.data, rec.failed ? 0 : rec.len, &gathered, lens);
    cx_bytes_free(&rec);
    cx_bytes table = {0};
    if (!st && t->rank == 0 && cx_encode_hello_table(gathered, lens, t->size, &table))
        cx_bytes_free(&table); /* the others get an empty table, and fail to read it */
    free(gathered);
    free(lens);
    if (st)
        return st;
    void *buf = table.data;
    size_t len = table.len;
    st = t->ops->bcast_bytes(t, &buf, &len, 0);
    cx_hello *all = st ? NULL : malloc(sizeof *all * (size_t)t->size);
    if (!st && !all)
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the handshake of %d ranks", t->size);
    if (!st)
        st = cx_decode_hello_table(buf, len, t->size, all);
    if (!st)
        st = cx_hello_verdict(all, t->size, t->rank, log);
    if (t->rank != 0)
        free(buf);
    cx_bytes_free(&table);
    free(all);
    return st;
}
