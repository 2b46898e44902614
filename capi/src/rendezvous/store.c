/* store - waiting with a deadline, prefixed views, and the store handed in as callbacks (store.h). */
#include "rendezvous/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"

#define POLL_FIRST_NS 1000000L  /* 1 ms: a key set by a peer just now is seen quickly */
#define POLL_MAX_NS 50000000L   /* 50 ms: a long wait costs no CPU to speak of */
/* A watched view waits in slices this long and asks its watch between them: a member written off
 * is noticed within about this much, for one look a member a slice (membership.c's watch). */
#define WATCH_SLICE_S 0.25

static cfx_status not_set_in_time(const cx_store *s, const char *key, double timeout_s)
{
    return cx_fail(CFX_ERR_TIMEOUT, "rendezvous: key \"%s\" was not set in the %s within %g s (a "
                   "rank that never arrived? CFX_RENDEZVOUS_TIMEOUT_S sets the deadline)", key,
                   s->where, timeout_s);
}

cfx_status cx_store_wait(cx_store *s, const char *const *keys, size_t n, double timeout_s)
{
    if (s->ops->wait)
        return s->ops->wait(s, keys, n, timeout_s);
    double deadline = cx_now_s() + timeout_s;
    long pause_ns = POLL_FIRST_NS;
    for (size_t i = 0; i < n;) {
        int present = 0;
        cfx_status st = s->ops->check(s, keys[i], &present);
        if (st)
            return st;
        if (present) {
            i++;
            continue;
        }
        if (cx_now_s() >= deadline)
            return not_set_in_time(s, keys[i], timeout_s);
        struct timespec pause = {0, pause_ns};
        nanosleep(&pause, NULL);
        pause_ns = pause_ns * 2 > POLL_MAX_NS ? POLL_MAX_NS : pause_ns * 2;
    }
    return CFX_OK;
}

cfx_status cx_store_get(cx_store *s, const char *key, double timeout_s, void **data, size_t *len)
{
    cfx_status st = cx_store_wait(s, &key, 1, timeout_s);
    return st ? st : s->ops->get(s, key, data, len);
}

void cx_store_destroy(cx_store *s)
{
    if (s)
        s->ops->destroy(s);
}

void cx_store_interrupt(cx_store *s)
{
    if (s && s->ops->interrupt)
        s->ops->interrupt(s);
}

/* ---- prefixed view ---------------------------------------------------------------------------- */

typedef struct prefixed_store {
    cx_store base;
    cx_store *inner;
    int owns_inner;
    char prefix[256];
    cfx_status (*watch)(void *arg); /* cx_store_prefixed_watch; NULL: waits are plain */
    void *watch_arg;
    void (*free_watch_arg)(void *arg);
} prefixed_store;

#define KEY_MAX 1024

static cfx_status full_key(prefixed_store *p, const char *key, char *out)
{
    if ((size_t)snprintf(out, KEY_MAX, "%s/%s", p->prefix, key) >= KEY_MAX)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "rendezvous: key \"%s/%s\" is longer than %d "
                       "characters", p->prefix, key, KEY_MAX - 1);
    return CFX_OK;
}

static cfx_status prefixed_set(cx_store *s, const char *key, const void *data, size_t len)
{
    prefixed_store *p = (prefixed_store *)s;
    char k[KEY_MAX];
    cfx_status st = full_key(p, key, k);
    return st ? st : cx_store_set(p->inner, k, data, len);
}

static cfx_status prefixed_set_once(cx_store *s, const char *key, const void *data, size_t len)
{
    prefixed_store *p = (prefixed_store *)s;
    char k[KEY_MAX];
    cfx_status st = full_key(p, key, k);
    return st ? st : cx_store_set_once(p->inner, k, data, len);
}

static cfx_status prefixed_check(cx_store *s, const char *key, int *present)
{
    prefixed_store *p = (prefixed_store *)s;
    char k[KEY_MAX];
    cfx_status st = full_key(p, key, k);
    return st ? st : p->inner->ops->check(p->inner, k, present);
}

static cfx_status prefixed_get(cx_store *s, const char *key, void **data, size_t *len)
{
    prefixed_store *p = (prefixed_store *)s;
    char k[KEY_MAX];
    cfx_status st = full_key(p, key, k);
    return st ? st : p->inner->ops->get(p->inner, k, data, len);
}

/* The wait of a watched view: slices of WATCH_SLICE_S, the watch asked after each that timed out;
 * at the deadline the first key still missing is named, as an unwatched wait names it. */
static cfx_status watched_wait(prefixed_store *p, const char *const *full, size_t n,
                               double timeout_s)
{
    double deadline = cx_now_s() + timeout_s;
    for (double left = timeout_s; left > 0; left = deadline - cx_now_s()) {
        double slice = left < WATCH_SLICE_S ? left : WATCH_SLICE_S;
        cfx_status st = cx_store_wait(p->inner, full, n, slice);
        if (st != CFX_ERR_TIMEOUT || (st = p->watch(p->watch_arg)))
            return st;
    }
    for (size_t i = 0; i < n; i++) {
        int present = 0;
        cfx_status st = p->inner->ops->check(p->inner, full[i], &present);
        if (st || !present)
            return st ? st : not_set_in_time(p->inner, full[i], timeout_s);
    }
    return CFX_OK; /* every key came at the last moment */
}

static cfx_status prefixed_wait(cx_store *s, const char *const *keys, size_t n, double timeout_s)
{
    prefixed_store *p = (prefixed_store *)s;
    char **full = calloc(n ? n : 1, sizeof *full);
    cfx_status st = full ? CFX_OK : cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for keys");
    for (size_t i = 0; !st && i < n; i++) {
        if (!(full[i] = malloc(KEY_MAX)))
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for keys");
        else
            st = full_key(p, keys[i], full[i]);
    }
    if (!st)
        st = p->watch ? watched_wait(p, (const char *const *)full, n, timeout_s)
                      : cx_store_wait(p->inner, (const char *const *)full, n, timeout_s);
    for (size_t i = 0; full && i < n; i++)
        free(full[i]);
    free(full);
    return st;
}

static void prefixed_destroy(cx_store *s)
{
    prefixed_store *p = (prefixed_store *)s;
    if (p->owns_inner)
        cx_store_destroy(p->inner);
    if (p->free_watch_arg)
        p->free_watch_arg(p->watch_arg);
    free(p);
}

/* A view that does not own its store borrows it from an owner that outlives the view (an elastic
 * world's transport, the job's membership store): interrupting would end the owner's connection
 * for good, so only the owner may; a call through the view stays bounded by the store's own I/O
 * deadline. */
static void prefixed_interrupt(cx_store *s)
{
    prefixed_store *p = (prefixed_store *)s;
    if (p->owns_inner)
        cx_store_interrupt(p->inner);
}

static const cx_store_ops prefixed_ops = {"prefixed store", prefixed_set, prefixed_check,
                                          prefixed_get, prefixed_wait, prefixed_interrupt,
                                          prefixed_destroy, prefixed_set_once};

cfx_status cx_store_set_once(cx_store *s, const char *key, const void *data, size_t len)
{
    if (!s->ops->set_once)
        return cx_fail(CFX_ERR_UNSUPPORTED, "rendezvous: the %s cannot set a key only once (key "
                       "\"%s\"): it has no compare-and-set", s->where, key);
    return s->ops->set_once(s, key, data, len);
}

cfx_status cx_store_prefixed(cx_store *base, const char *prefix, int owns_base, cx_store **out)
{
    prefixed_store *p = calloc(1, sizeof *p);
    cfx_status st = !p ? cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for a prefixed store")
        : strlen(prefix) >= sizeof p->prefix
        ? cx_fail(CFX_ERR_INVALID_ARGUMENT, "rendezvous: prefix \"%s\" is too long", prefix)
        : CFX_OK;
    if (st) {
        free(p);
        if (owns_base)
            cx_store_destroy(base);
        return st;
    }
    p->base.ops = &prefixed_ops;
    snprintf(p->base.where, sizeof p->base.where, "%s", base->where);
    snprintf(p->base.local_addr, sizeof p->base.local_addr, "%s", base->local_addr);
    p->inner = base;
    p->owns_inner = owns_base;
    snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
    *out = &p->base;
    return CFX_OK;
}

void cx_store_prefixed_watch(cx_store *view, cfx_status (*watch)(void *arg), void *arg,
                             void (*free_arg)(void *arg))
{
    prefixed_store *p = (prefixed_store *)view;
    if (p->free_watch_arg)
        p->free_watch_arg(p->watch_arg);
    p->watch = watch;
    p->watch_arg = arg;
    p->free_watch_arg = free_arg;
}

/* ---- the store handed in through the ABI ------------------------------------------------------ */

typedef struct callback_store {
    cx_store base;
    cfx_store_callbacks cb;
} callback_store;

static cfx_status callback_set(cx_store *s, const char *key, const void *data, size_t len)
{
    callback_store *c = (callback_store *)s;
    int rc = c->cb.set(c->cb.user, key, data, len);
    return rc ? cx_fail(CFX_ERR_TRANSPORT, "rendezvous: the store's set callback returned %d for "
                        "key \"%s\"", rc, key) : CFX_OK;
}

static cfx_status callback_check(cx_store *s, const char *key, int *present)
{
    callback_store *c = (callback_store *)s;
    int rc = c->cb.wait(c->cb.user, &key, 1, 0.0);
    if (rc != 0 && rc != 1)
        return cx_fail(CFX_ERR_TRANSPORT, "rendezvous: the store's wait callback returned %d for "
                       "key \"%s\"", rc, key);
    *present = rc == 0;
    return CFX_OK;
}

static cfx_status callback_get(cx_store *s, const char *key, void **data, size_t *len)
{
    callback_store *c = (callback_store *)s;
    size_t cap = 256;
    for (;;) {
        char *buf = malloc(cap);
        size_t need = 0;
        if (!buf)
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for key \"%s\"", key);
        int rc = c->cb.get(c->cb.user, key, buf, cap, &need);
        if (rc) {
            free(buf);
            return cx_fail(CFX_ERR_TRANSPORT, "rendezvous: the store's get callback returned %d for "
                           "key \"%s\"", rc, key);
        }
        if (need <= cap) {
            *data = buf;
            *len = need;
            return CFX_OK;
        }
        free(buf);
        cap = need;
    }
}

static cfx_status callback_wait(cx_store *s, const char *const *keys, size_t n, double timeout_s)
{
    callback_store *c = (callback_store *)s;
    int rc = c->cb.wait(c->cb.user, keys, n, timeout_s);
    if (rc == 1) {
        size_t missing = 0; /* name the first key still unset */
        while (missing + 1 < n && c->cb.wait(c->cb.user, &keys[missing], 1, 0.0) == 0)
            missing++;
        return cx_fail(CFX_ERR_TIMEOUT, "rendezvous: key \"%s\" was not set in the %s within %g s "
                       "(a rank that never arrived?)", n ? keys[missing] : "", s->where, timeout_s);
    }
    return rc ? cx_fail(CFX_ERR_TRANSPORT, "rendezvous: the store's wait callback returned %d", rc)
              : CFX_OK;
}

static void callback_destroy(cx_store *s) { free(s); }

static const cx_store_ops callback_ops = {"callback store", callback_set, callback_check,
                                          callback_get, callback_wait, NULL, callback_destroy,
                                          NULL /* cfx_store_callbacks has no compare-and-set */};

cfx_status cx_store_from_callbacks(const cfx_store_callbacks *cb, cx_store **out)
{
    if (!cb || cb->version != CFX_STORE_CALLBACKS_VERSION || !cb->set || !cb->get || !cb->wait)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_init_with_store: store is %s",
                       !cb ? "NULL" : cb->version != CFX_STORE_CALLBACKS_VERSION
                       ? "of an unknown version (expected CFX_STORE_CALLBACKS_VERSION)"
                       : "missing a callback (set, get and wait are all required)");
    callback_store *c = calloc(1, sizeof *c);
    if (!c)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for the store");
    c->base.ops = &callback_ops;
    snprintf(c->base.where, sizeof c->base.where, "store handed to cfx_init_with_store");
    c->cb = *cb;
    *out = &c->base;
    return CFX_OK;
}
