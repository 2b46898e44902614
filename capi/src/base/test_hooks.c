/* test_hooks - parsing of the CFX_TEST_* variables (see test_hooks.h). */
#include "base/test_hooks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

void cx_test_hooks_off(cx_test_hooks *h)
{
    memset(h, 0, sizeof *h);
    h->wire_major = h->wire_minor = -1;
}

static const char *hook(cx_config_lookup lookup, void *user, const char *name)
{
    const char *v = lookup(name, user);
    return (v && *v) ? v : NULL;
}

/* "MAJOR.MINOR", each 0..65535. */
static cfx_status parse_version(const char *name, const char *text, int32_t *major, int32_t *minor)
{
    unsigned long v[2] = {0, 0};
    const char *p = text;
    for (int i = 0; i < 2; i++) {
        const char *digits = p;
        while (*p >= '0' && *p <= '9' && v[i] <= 65535)
            v[i] = v[i] * 10 + (unsigned long)(*p++ - '0');
        if (p == digits || v[i] > 65535 || *p != (i ? '\0' : '.'))
            return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected MAJOR.MINOR (each 0..65535)", name,
                           text);
        p++;
    }
    *major = (int32_t)v[0];
    *minor = (int32_t)v[1];
    return CFX_OK;
}

/* A whole decimal number in [lo, hi]. */
static cfx_status parse_int(const char *name, const char *text, long lo, long hi, int32_t *out)
{
    errno = 0;
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < lo || v > hi)
        return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected a whole number in %ld..%ld", name, text,
                       lo, hi);
    *out = (int32_t)v;
    return CFX_OK;
}

static cfx_status parse_fail(const char *text, struct cx_fail_test *out)
{
    struct cx_fail_test f = {0, 1, ""};
    const char *p = text;
    char *end = NULL;
    for (;;) {
        errno = 0;
        long r = strtol(p, &end, 10);
        if (end == p || errno || r < 0 || r > 63)
            goto bad;
        f.ranks |= 1ull << r;
        p = end;
        if (*p != ',')
            break;
        p++;
    }
    if (*p++ != ':')
        goto bad;
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (len == 0 || len >= sizeof f.prefix || (colon && strcmp(colon + 1, "done") != 0))
        goto bad;
    memcpy(f.prefix, p, len);
    f.phase = colon ? 2 : 1;
    *out = f;
    return CFX_OK;
bad:
    return cx_fail(CFX_ERR_CONFIG, "CFX_TEST_FAIL=\"%s\": expected RANKS:PREFIX[:done] (ranks "
                   "0..63, comma-separated; a prefix of 1..%zu characters)", text,
                   sizeof f.prefix - 1);
}

cfx_status cx_test_hooks_load(cx_test_hooks *h, cx_config_lookup lookup, void *user)
{
    cx_test_hooks_off(h);
    const char *v;
    cfx_status st = CFX_OK;
    if ((v = hook(lookup, user, "CFX_TEST_WIRE_VERSION")) &&
        (st = parse_version("CFX_TEST_WIRE_VERSION", v, &h->wire_major, &h->wire_minor)))
        return st;
    if ((v = hook(lookup, user, "CFX_TEST_LOCAL_SIZE")) &&
        (st = parse_int("CFX_TEST_LOCAL_SIZE", v, 0, 1 << 20, &h->local_size)))
        return st;
    if ((v = hook(lookup, user, "CFX_TEST_DIRECT_MAP_FAIL"))) {
        int32_t local_rank = 0;
        if ((st = parse_int("CFX_TEST_DIRECT_MAP_FAIL", v, 0, 63, &local_rank)))
            return st;
        h->direct_map_fail = 1ull << local_rank;
    }
    if ((v = hook(lookup, user, "CFX_TEST_DEVICE_PATH"))) {
        if (strcmp(v, "nccl") != 0 && strcmp(v, "staged") != 0)
            return cx_fail(CFX_ERR_CONFIG, "CFX_TEST_DEVICE_PATH=\"%s\": expected nccl or staged",
                           v);
        strcpy(h->device_path, v);
    }
    if ((v = hook(lookup, user, "CFX_TEST_FAIL")) && (st = parse_fail(v, &h->fail)))
        return st;
    return CFX_OK;
}
