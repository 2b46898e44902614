/*
 * store - the key-value store the ranks of a job meet through before any transport exists: set a
 * key, look it up, wait for keys with a deadline. Values are byte strings; a key is set once.
 *
 * Implementations: a TCP store (store_tcp.c: a client in every rank, and store_tcp_server.c's
 * server thread on rank 0 or in a launcher: cfxrun's cfx-store, the Spark and Ray drivers through
 * the public cfx_store), a file store (store_file.c: a directory every rank sees), and a store
 * handed in through the ABI as callbacks (store.c: cfx_store_callbacks, e.g. torch.distributed's
 * Store from Python). A prefixed view (store.c) gives each transport context its own key space.
 */
#ifndef CFX_STORE_H
#define CFX_STORE_H

#include <stddef.h>

#include "conflux/conflux.h"

#ifdef __cplusplus
extern "C" { /* the Gloo transport (C++) meets through it */
#endif

typedef struct cx_store cx_store;

typedef struct cx_store_ops {
    const char *name; /* "TCP store", "file store", "callback store" */
    cfx_status (*set)(cx_store *s, const char *key, const void *data, size_t len);
    /* One look: *present = 1 when the key is set. */
    cfx_status (*check)(cx_store *s, const char *key, int *present);
    /* The value of a key that is set (after a wait): *data malloc'ed (the caller frees it). */
    cfx_status (*get)(cx_store *s, const char *key, void **data, size_t *len);
    /* Optional: waits for every key until timeout_s; CFX_ERR_TIMEOUT naming the first key missing.
     * NULL: cx_store_wait polls check with a backoff. */
    cfx_status (*wait)(cx_store *s, const char *const *keys, size_t n, double timeout_s);
    /* Optional: makes a call blocked on a silent server (and every later call) fail at once, so
     * a thread using the store can be joined. */
    void (*interrupt)(cx_store *s);
    void (*destroy)(cx_store *s);
    /* Optional: sets the key unless it is set, atomically across every process of the store: the
     * first value stays, and a later call changes nothing (and succeeds). What a decision that
     * several processes may make at once needs (a membership round's); `set` overwrites. NULL:
     * the store cannot (cx_store_set_once says so). */
    cfx_status (*set_once)(cx_store *s, const char *key, const void *data, size_t len);
} cx_store_ops;

struct cx_store {
    const cx_store_ops *ops;
    char where[320]; /* for messages: "TCP store at host:port", "file store in /dir" */
    /* The address this process reaches the store from (TCP store: the connection's local
     * address), "" when unknown: the interface a transport's peers can reach this host on. */
    char local_addr[64];
};

/* Waits until every key is set or timeout_s passed (CFX_ERR_TIMEOUT naming the key and the store). */
cfx_status cx_store_wait(cx_store *s, const char *const *keys, size_t n, double timeout_s);

/* Waits for one key, then returns its value (*data malloc'ed). */
cfx_status cx_store_get(cx_store *s, const char *key, double timeout_s, void **data, size_t *len);

static inline cfx_status cx_store_set(cx_store *s, const char *key, const void *data, size_t len)
{
    return s->ops->set(s, key, data, len);
}

/* See cx_store_ops.set_once: CFX_ERR_UNSUPPORTED for a store without it (a store handed in as
 * callbacks). Read the key afterwards for the value that stays. */
cfx_status cx_store_set_once(cx_store *s, const char *key, const void *data, size_t len);

void cx_store_destroy(cx_store *s);

/* See cx_store_ops.interrupt; a no-op for stores without one. */
void cx_store_interrupt(cx_store *s);

/* A view of `base` whose keys all start with "prefix/". With owns_base the view frees base (also
 * when this call fails) and its interrupt interrupts base; otherwise base must outlive the view,
 * and interrupting the view leaves base alone. */
cfx_status cx_store_prefixed(cx_store *base, const char *prefix, int owns_base, cx_store **out);

/* Makes every wait through the prefixed view `view` give up early once watch(arg) returns a
 * failure: the wait goes in slices of a quarter second, asks the watch after each, and returns
 * the watch's failure. free_arg (may be NULL) frees arg with the view or the next watch. For a
 * key space whose waits are pointless once something else is known: an elastic world forming
 * while its launcher marks one of its members gone (engine/membership.c). */
void cx_store_prefixed_watch(cx_store *view, cfx_status (*watch)(void *arg), void *arg,
                             void (*free_arg)(void *arg));

/* The store handed in through the ABI (the callbacks are copied; their user pointer is borrowed). */
cfx_status cx_store_from_callbacks(const cfx_store_callbacks *cb, cx_store **out);

/* A file store in `dir` (created when missing). */
cfx_status cx_store_file_create(const char *dir, cx_store **out);

/* Where a TCP store is and who serves it. */
typedef struct cx_tcp_store_params {
    const char *host;
    int port;
    /* Ports port .. port + port_span - 1 may hold the store (0 or 1: exactly port). A derived
     * port may be taken by another program: the server takes the first free one, and clients
     * try each, taking the store that holds job_token (required with a span above 1). */
    int port_span;
    const char *job_token; /* NULL: any Conflux store at the port is this job's */
    int serve;             /* this process starts the server first (all addresses) */
    /* (>= 1) numbers the worlds one job forms one after another on the same port: a server of an
     * earlier world that is still shutting down is passed over (a launcher's server says 0: it
     * serves every generation; a client that says 0 takes whichever server answers: a launcher's
     * own client, cfx_store_connect). */
    unsigned generation;
    double timeout_s; /* clients connect until then (the server may start later) */
} cx_tcp_store_params;

/* A TCP store client, and its server when p->serve is set (it lives until cx_store_destroy):
 * CFX_ERR_CONFIG naming the ports when they are all taken, or when another program or another
 * job's store answers at a chosen port. */
cfx_status cx_store_tcp_create(const cx_tcp_store_params *p, cx_store **out);

/* One look at a key of a TCP store's client (one request): *present, and when set its value
 * (*data malloc'ed, the caller frees it). */
cfx_status cx_store_tcp_lookup(cx_store *s, const char *key, int *present, void **data,
                               size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* CFX_STORE_H */
