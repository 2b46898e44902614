/*
 * store_calls (api) - the public rendezvous store, cfx_store (conflux.h, since 1.4): the engine's
 * TCP store served by the caller (rendezvous/store_tcp_server.c, with its events) or spoken to as
 * a client (rendezvous/store_tcp.c), so that launchers outside the engine (the Spark and Ray
 * drivers, cfxrun's cfx-store) serve and use the one store implementation there is.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "rendezvous/store.h"
#include "rendezvous/store_tcp_server.h"
#include "rendezvous/store_tcp_wire.h"

struct cfx_store {
    cx_tcp_server *server; /* a served store */
    int events;            /* served with events */
    cx_store *client;      /* a client */
    int port;
    cx_tcp_event last; /* the event handed out last: its key and value are the caller's to read */
};

static void drop_last(cfx_store *s)
{
    free(s->last.key);
    free(s->last.value);
    s->last = (cx_tcp_event){0};
}

cfx_status cfx_store_serve(int port, int events, cfx_store **out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_serve: out is NULL");
    *out = NULL;
    if (port < 0 || port > 65535)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_serve: port %d is outside 0..65535 "
                       "(0: a free one)", port);
    if (events != 0 && events != 1)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_serve: events %d is neither 0 (keep "
                       "none) nor 1 (queue them for cfx_store_next_event)", events);
    cfx_store *s = calloc(1, sizeof *s);
    if (!s)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cfx_store_serve: no memory for the store");
    /* Generation 0: a launcher's server serves every world its job forms. */
    cfx_status st = cx_tcp_server_start(&(cx_tcp_server_params){.port = port, .events = events},
                                        &s->server);
    if (st) {
        free(s);
        return st;
    }
    s->port = cx_tcp_server_port(s->server);
    s->events = events;
    *out = s;
    return CFX_OK;
}

cfx_status cfx_store_connect(const char *host, int port, double timeout_s, cfx_store **out)
{
    if (!out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_connect: out is NULL");
    *out = NULL;
    if (!host || !host[0])
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_connect: host is %s",
                       host ? "empty" : "NULL");
    if (port < 1 || port > 65535)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_connect: port %d is outside 1..65535",
                       port);
    if (!(timeout_s >= 0) || isinf(timeout_s))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_connect: timeout_s %g is not a "
                       "number of seconds >= 0", timeout_s);
    cfx_store *s = calloc(1, sizeof *s);
    if (!s)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cfx_store_connect: no memory for the store");
    /* Generation 0: whichever server answers (a launcher's serves every world). */
    cfx_status st = cx_store_tcp_create(&(cx_tcp_store_params){.host = host, .port = port,
                                                                .timeout_s = timeout_s},
                                        &s->client);
    if (st) {
        free(s);
        return st;
    }
    s->port = port;
    *out = s;
    return CFX_OK;
}

int cfx_store_port(const cfx_store *store)
{
    if (!store) {
        cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_port: store is NULL");
        return -1;
    }
    return store->port;
}

/* The arguments of every call with a key: CFX_OK, or INVALID_ARGUMENT naming the call and what. */
static cfx_status check_key(const char *call, const cfx_store *store, const char *key)
{
    if (!store)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: store is NULL", call);
    if (!key)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: key is NULL", call);
    if (strlen(key) > CX_STORE_KEY_LIMIT)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "%s: key \"%.64s...\" is %zu bytes long, above "
                       "the store's limit of %u", call, key, strlen(key), CX_STORE_KEY_LIMIT);
    return CFX_OK;
}

cfx_status cfx_store_set(cfx_store *store, const char *key, const void *data, size_t len)
{
    cfx_status st = check_key("cfx_store_set", store, key);
    if (st)
        return st;
    if (!data && len)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_set: data is NULL with len %zu (key "
                       "\"%s\")", len, key);
    if (len > CX_STORE_VALUE_LIMIT)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_set: the value of key \"%s\" is %zu "
                       "bytes, above the store's limit of %u", key, len, CX_STORE_VALUE_LIMIT);
    if (store->server)
        return cx_tcp_server_set(store->server, key, data, len);
    return cx_store_set(store->client, key, data ? data : "", len);
}

cfx_status cfx_store_get(cfx_store *store, const char *key, void *buf, size_t cap, size_t *len,
                         int *present)
{
    cfx_status st = check_key("cfx_store_get", store, key);
    if (st)
        return st;
    if (!len || !present)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_get: %s is NULL (key \"%s\")",
                       !len ? "len" : "present", key);
    if (!buf && cap)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_get: buf is NULL with cap %zu (key "
                       "\"%s\")", cap, key);
    *len = 0;
    *present = 0;
    if (store->server) {
        cx_tcp_server_get(store->server, key, buf, cap, len, present);
        return CFX_OK;
    }
    /* One request: 'G' answers whether the key is set and its value together. */
    void *data = NULL;
    size_t n = 0;
    st = cx_store_tcp_lookup(store->client, key, present, &data, &n);
    if (st || !*present)
        return st;
    if (cap)
        memcpy(buf, data, n < cap ? n : cap);
    *len = n;
    free(data);
    return CFX_OK;
}

cfx_status cfx_store_next_event(cfx_store *store, double timeout_s, cfx_store_event *out)
{
    if (!store || !out)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_next_event: %s is NULL",
                       !store ? "store" : "out");
    if (out->version != CFX_STORE_EVENT_VERSION)
        return cx_fail(CFX_ERR_VERSION, "cfx_store_next_event: event version %u is unknown to "
                       "this library (it knows %d)", out->version, CFX_STORE_EVENT_VERSION);
    if (!store->server)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_next_event: the store is a client "
                       "(events are the serving process's: cfx_store_serve)");
    if (!store->events)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_next_event: the store was served "
                       "without events (cfx_store_serve's events 0)");
    if (!(timeout_s >= 0))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_store_next_event: timeout_s %g is not a "
                       "number of seconds >= 0", timeout_s);
    drop_last(store);
    cfx_status st = cx_tcp_server_next_event(store->server, timeout_s, &store->last);
    out->kind = store->last.kind;
    out->connection = store->last.connection;
    out->key = store->last.key;
    out->value = store->last.value;
    out->len = store->last.len;
    return st;
}

void cfx_store_free(cfx_store *store)
{
    if (!store)
        return;
    cx_tcp_server_stop(store->server);
    cx_store_destroy(store->client);
    drop_last(store);
    free(store);
}
