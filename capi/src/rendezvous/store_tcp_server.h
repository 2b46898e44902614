/*
 * store_tcp_server - the TCP store's server: a thread holding every key in memory and answering
 * clients (store_tcp_wire.h's protocol). It serves the engine's own stores (rank 0's, through
 * cx_store_tcp_create) and the public cfx_store (api/store_calls.c: cfxrun's cfx-store tool, the
 * Spark and Ray drivers), which also sets and reads keys in place and reads the server's events:
 * a key a client set, a client's connection that ended.
 */
#ifndef CFX_STORE_TCP_SERVER_H
#define CFX_STORE_TCP_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

typedef struct cx_tcp_server cx_tcp_server;

typedef struct cx_tcp_server_params {
    int port;              /* 0: a free one */
    int port_span;         /* the first free port of port .. port + span - 1 (0 or 1: port) */
    const char *job_token; /* held under CX_STORE_JOB_KEY when set (store.h) */
    unsigned generation;   /* sent in the greeting (store.h) */
    int events;            /* queue events for cx_tcp_server_next_event (else none are kept) */
} cx_tcp_server_params;

/* Starts serving on every address: CFX_ERR_CONFIG naming the ports when they are all taken. */
cfx_status cx_tcp_server_start(const cx_tcp_server_params *p, cx_tcp_server **out);

/* The port it serves on. */
int cx_tcp_server_port(const cx_tcp_server *s);

/* Sets a key in place (no event). */
cfx_status cx_tcp_server_set(cx_tcp_server *s, const char *key, const void *data, size_t len);

/* One look at a key: *present, its length in *len, its first min(len, cap) bytes in buf. */
void cx_tcp_server_get(cx_tcp_server *s, const char *key, void *buf, size_t cap, size_t *len,
                       int *present);

/* One event: kind a cfx_store_event_kind; key and value malloc'ed (the receiver frees them). */
typedef struct cx_tcp_event {
    int kind;
    uint64_t connection;
    char *key;
    void *value;
    size_t len;
} cx_tcp_event;

/* The oldest queued event, waiting up to timeout_s for one: CFX_ERR_TIMEOUT (ev->kind NONE). */
cfx_status cx_tcp_server_next_event(cx_tcp_server *s, double timeout_s, cx_tcp_event *ev);

/* Stops the thread, closes every connection and frees the server (and its queued events). */
void cx_tcp_server_stop(cx_tcp_server *s);

#endif /* CFX_STORE_TCP_SERVER_H */
