/*
 * bind.h - the one C layer under every binding: the Python, Java and Lua wrappers (conflux.i) and
 * conflux._torch_native. It owns what each language would otherwise write for itself:
 * - a lone collective's request and its submission (cfx_bind_submit): the plain
 *   cfx_allreduce_async, or cfx_allreduce_async_opts when a compression is asked for (keeping the
 *   plain call for the common case keeps its error messages those of cfx_allreduce_async);
 * - the blocking call (cfx_bind_run): submit, wait (all of it, or a first slice), release;
 * - waiting in slices (cfx_bind_wait_sliced), for a binding that must look at signals between them;
 * - init and reform options set by name (cfx_bind_init_option, cfx_bind_reform_option) and
 *   compressions named by string (cfx_bind_compression_code), so that every language accepts the
 *   same names and reports a bad one with the same message;
 * - a rendezvous store's value as one copy (cfx_bind_store_get), for the languages' byte strings.
 * Header-only (static inline) on the public ABI alone: each binding's module compiles it, as C or
 * as C++. A binding keeps only what is its language's: converting its objects, raising its errors.
 */
#ifndef CFX_BIND_H
#define CFX_BIND_H

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conflux/conflux.h"

/* ---- lone collectives ------------------------------------------------------------------------ */

/* The kinds of lone collective a binding's fast path submits (values shared with the languages). */
enum { CFX_BIND_ALLREDUCE = 0, CFX_BIND_BROADCAST = 1, CFX_BIND_BARRIER = 2 };

/* A lone collective: what cfx_bind_submit needs. `arg` is the op (allreduce) or the root rank
 * (broadcast); input, output, the scales and the compression are the allreduce's (output NULL: in
 * place); a barrier uses none of them. */
typedef struct cfx_bind_request {
    int kind;
    const char *name;
    const cfx_tensor *input;
    void *output;
    int arg;
    double prescale, postscale;
    int compression;
} cfx_bind_request;

static inline cfx_status cfx_bind_allreduce_async(cfx_context *ctx, const char *name,
                                                  const cfx_tensor *input, void *output, int op,
                                                  double prescale, double postscale,
                                                  int compression, cfx_handle *out)
{
    cfx_allreduce_options o;
    cfx_status st;
    if (compression == CFX_COMPRESSION_NONE)
        return cfx_allreduce_async(ctx, name, input, output, (cfx_reduce_op)op, prescale,
                                   postscale, out);
    st = cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION);
    o.op = op;
    o.prescale = prescale;
    o.postscale = postscale;
    o.compression = compression;
    return st == CFX_OK ? cfx_allreduce_async_opts(ctx, name, input, output, &o, out) : st;
}

/* Submits `r`; the handle comes back in *out. */
static inline cfx_status cfx_bind_submit(cfx_context *ctx, const cfx_bind_request *r,
                                         cfx_handle *out)
{
    switch (r->kind) {
    case CFX_BIND_ALLREDUCE:
        return cfx_bind_allreduce_async(ctx, r->name, r->input, r->output, r->arg, r->prescale,
                                        r->postscale, r->compression, out);
    case CFX_BIND_BROADCAST: return cfx_broadcast_async(ctx, r->name, r->input, r->arg, out);
    default: return cfx_barrier_async(ctx, out);
    }
}

/* The blocking call: submits `r` and waits up to `wait_s` (< 0: until it completes). Returns the
 * submission's status; *waited is the wait's:
 * - CFX_OK: done, the handle released;
 * - CFX_ERR_TIMEOUT: still pending, *out is the handle (the caller waits for the rest, or keeps
 *   what the engine borrows alive and releases it later);
 * - the collective's failure: the handle released; its message is in cfx_last_error() (a failed
 *   cfx_wait leaves it there), valid until this thread's next failing call. */
static inline cfx_status cfx_bind_run(cfx_context *ctx, const cfx_bind_request *r, double wait_s,
                                      cfx_handle *out, cfx_status *waited)
{
    cfx_status st = cfx_bind_submit(ctx, r, out);
    *waited = st;
    if (st != CFX_OK) return st;
    *waited = cfx_wait(ctx, *out, wait_s);
    if (*waited != CFX_ERR_TIMEOUT) (void)cfx_handle_release(ctx, *out);
    return CFX_OK;
}

/* Waits with wait(arg, t) in slices of at most `slice_s` until it returns anything but
 * CFX_ERR_TIMEOUT or `timeout_s` (< 0: no limit) has passed, calling between(between_arg) after
 * every slice that ended in CFX_ERR_TIMEOUT with time left; a nonzero return from it stops the
 * wait there (*interrupted = 1, the result CFX_ERR_TIMEOUT). `between` may be NULL. */
static inline cfx_status cfx_bind_wait_sliced(cfx_status (*wait)(void *, double), void *arg,
                                              double timeout_s, double slice_s,
                                              int (*between)(void *), void *between_arg,
                                              int *interrupted)
{
    double left = timeout_s;
    *interrupted = 0;
    for (;;) {
        double t = (timeout_s < 0 || left > slice_s) ? slice_s : left;
        cfx_status st = wait(arg, t);
        if (st != CFX_ERR_TIMEOUT) return st;
        if (timeout_s >= 0) {
            left -= t;
            if (left <= 0) return st;
        }
        if (between != NULL && between(between_arg) != 0) {
            *interrupted = 1;
            return st;
        }
    }
}

/* ---- names ------------------------------------------------------------------------------------ */

/* The compressions by name, index = cfx_compression: the names every binding accepts. */
static const char *const cfx_bind_compression_names[CFX_COMPRESSION_COUNT] = {
    "none", "fp16", "bf16", "fp16_everywhere", "bf16_everywhere"};

/* The cfx_compression named `name` (case-insensitive: Java's FP16 too), or -1. */
static inline int cfx_bind_compression_code(const char *name)
{
    for (int i = 0; name != NULL && i < CFX_COMPRESSION_COUNT; i++) {
        const char *known = cfx_bind_compression_names[i];
        size_t k = 0;
        while (known[k] != '\0' && known[k] == tolower((unsigned char)name[k])) k++;
        if (known[k] == '\0' && name[k] == '\0') return i;
    }
    return -1;
}

/* "none, fp16, ..." into buf: the accepted names, for error messages. */
static inline const char *cfx_bind_compression_list(char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < CFX_COMPRESSION_COUNT && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%s", i ? ", " : "", cfx_bind_compression_names[i]);
    return buf;
}

/* A field of an options struct that a binding sets by name (the struct's version is the
 * binding's own): cfx_init_options (cfx_bind_init_fields) and cfx_reform_options
 * (cfx_bind_reform_fields) share one setter, so every language checks both alike. */
enum { CFX_BIND_OPT_INT32, CFX_BIND_OPT_INT64, CFX_BIND_OPT_DOUBLE };
typedef struct cfx_bind_field {
    const char *name;
    int type;
    size_t offset;
} cfx_bind_field;
typedef cfx_bind_field cfx_bind_init_field;

#define CFX_BIND_FIELD(st, field, type)                                                            \
    { #field, type, offsetof(st, field) }
static const cfx_bind_field cfx_bind_init_fields[] = {
    CFX_BIND_FIELD(cfx_init_options, transport, CFX_BIND_OPT_INT32),
    CFX_BIND_FIELD(cfx_init_options, fusion_threshold_bytes, CFX_BIND_OPT_INT64),
    CFX_BIND_FIELD(cfx_init_options, cycle_time_ms, CFX_BIND_OPT_DOUBLE),
    CFX_BIND_FIELD(cfx_init_options, cache_capacity, CFX_BIND_OPT_INT64),
    CFX_BIND_FIELD(cfx_init_options, log_level, CFX_BIND_OPT_INT32),
    CFX_BIND_FIELD(cfx_init_options, deterministic, CFX_BIND_OPT_INT32),
    CFX_BIND_FIELD(cfx_init_options, stall_warning_s, CFX_BIND_OPT_DOUBLE),
    CFX_BIND_FIELD(cfx_init_options, stall_timeout_s, CFX_BIND_OPT_DOUBLE),
    CFX_BIND_FIELD(cfx_init_options, chunk_bytes, CFX_BIND_OPT_INT64),
};
#define CFX_BIND_INIT_FIELD_COUNT (sizeof cfx_bind_init_fields / sizeof cfx_bind_init_fields[0])

/* The fields of cfx_reform_options (elastic worlds, docs/elastic.md). */
static const cfx_bind_field cfx_bind_reform_fields[] = {
    CFX_BIND_FIELD(cfx_reform_options, min_size, CFX_BIND_OPT_INT32),
    CFX_BIND_FIELD(cfx_reform_options, max_size, CFX_BIND_OPT_INT32),
    CFX_BIND_FIELD(cfx_reform_options, timeout_s, CFX_BIND_OPT_DOUBLE),
    CFX_BIND_FIELD(cfx_reform_options, settle_s, CFX_BIND_OPT_DOUBLE),
};
#undef CFX_BIND_FIELD
#define CFX_BIND_REFORM_FIELD_COUNT (sizeof cfx_bind_reform_fields / sizeof cfx_bind_reform_fields[0])

/* The index of field `name` among fields[0..count), or -1 when there is none. */
static inline int cfx_bind_field_index(const cfx_bind_field *fields, size_t count, const char *name)
{
    for (size_t i = 0; name != NULL && i < count; i++)
        if (strcmp(fields[i].name, name) == 0) return (int)i;
    return -1;
}

/* The index of init option `name` in cfx_bind_init_fields, or -1 when there is none. */
static inline int cfx_bind_init_option_index(const char *name)
{
    return cfx_bind_field_index(cfx_bind_init_fields, CFX_BIND_INIT_FIELD_COUNT, name);
}

/* Sets field `name` of the struct at `base` (its fields[0..count)) to `value`. Every field takes
 * a number >= 0, a whole one unless the field is a double (a binding passes true/false as 1/0).
 * CFX_ERR_INVALID_ARGUMENT with a message in `msg` for an unknown name (listing the known ones) or
 * a bad value (naming the option and the value; `kind`, "init" or "reform", starts that message). */
static inline cfx_status cfx_bind_set_field(void *base, const cfx_bind_field *fields, size_t count,
                                            const char *kind, const char *name, double value,
                                            char *msg, size_t msg_size)
{
    int i = cfx_bind_field_index(fields, count, name);
    const cfx_bind_field *f;
    char *field;
    if (i < 0) {
        size_t n = (size_t)snprintf(msg, msg_size, "unknown option '%s' (known:", name ? name : "(null)");
        for (size_t k = 0; k < count && n < msg_size; k++)
            n += (size_t)snprintf(msg + n, msg_size - n, " %s", fields[k].name);
        if (n < msg_size) snprintf(msg + n, msg_size - n, ")");
        return CFX_ERR_INVALID_ARGUMENT;
    }
    f = &fields[i];
    if (!(value >= 0) || isinf(value) ||
        (f->type != CFX_BIND_OPT_DOUBLE && (value != floor(value) || value > 9.0e15)) ||
        (f->type == CFX_BIND_OPT_INT32 && value > 2147483647.0)) {
        snprintf(msg, msg_size, "%s option %s must be a%s number >= 0, not %g", kind, name,
                 f->type == CFX_BIND_OPT_DOUBLE ? "" : " whole", value);
        return CFX_ERR_INVALID_ARGUMENT;
    }
    field = (char *)base + f->offset;
    if (f->type == CFX_BIND_OPT_INT32) {
        int32_t v = (int32_t)value;
        memcpy(field, &v, sizeof v);
    } else if (f->type == CFX_BIND_OPT_INT64) {
        int64_t v = (int64_t)value;
        memcpy(field, &v, sizeof v);
    } else {
        memcpy(field, &value, sizeof value);
    }
    return CFX_OK;
}

/* Sets init option `name` of `o` (filled by cfx_init_options_init) to `value` (cfx_bind_set_field). */
static inline cfx_status cfx_bind_init_option(cfx_init_options *o, const char *name, double value,
                                              char *msg, size_t msg_size)
{
    return cfx_bind_set_field(o, cfx_bind_init_fields, CFX_BIND_INIT_FIELD_COUNT, "init", name,
                              value, msg, msg_size);
}

/* Sets reform option `name` (min_size, max_size, timeout_s, settle_s) of `o` (filled by
 * cfx_reform_options_init) to `value` (cfx_bind_set_field). */
static inline cfx_status cfx_bind_reform_option(cfx_reform_options *o, const char *name,
                                                double value, char *msg, size_t msg_size)
{
    return cfx_bind_set_field(o, cfx_bind_reform_fields, CFX_BIND_REFORM_FIELD_COUNT, "reform",
                              name, value, msg, msg_size);
}

/* ---- the rendezvous store ------------------------------------------------------------------ */

/* cfx_store_get into a malloc'ed copy: *data (the caller frees it) and *len when *present, else
 * *data NULL. A value that grew between the look at its length and the copy is looked up again.
 * CFX_ERR_OUT_OF_MEMORY (no message recorded) when the copy cannot be allocated. */
static inline cfx_status cfx_bind_store_get(cfx_store *store, const char *key, char **data,
                                            size_t *len, int *present)
{
    size_t cap = 0;
    char *buf = NULL;
    *data = NULL;
    for (;;) {
        cfx_status st = cfx_store_get(store, key, buf, cap, len, present);
        if (st != CFX_OK || !*present) {
            free(buf);
            return st;
        }
        if (buf != NULL && *len <= cap) {
            *data = buf;
            return CFX_OK;
        }
        free(buf);
        cap = *len;
        buf = (char *)malloc(cap ? cap : 1);
        if (buf == NULL)
            return CFX_ERR_OUT_OF_MEMORY;
    }
}

#endif /* CFX_BIND_H */
