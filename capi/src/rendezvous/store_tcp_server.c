/*
 * store_tcp_server - the TCP store's server thread (store_tcp_server.h).
 *
 * One thread polls the listening socket and every client, and answers one request at a time. The
 * table of keys and the event queue are shared with the serving process's own calls (set, get,
 * next_event) under one mutex; the thread holds it only to touch them, never across socket I/O.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "rendezvous/store_tcp_server.h"
#include "rendezvous/store_tcp_wire.h"

typedef struct entry {
    char *key;
    void *value;
    size_t len;
} entry;

typedef struct event_node {
    struct event_node *next;
    cx_tcp_event ev;
} event_node;

struct cx_tcp_server {
    int listen_fd, wake[2], port, events;
    unsigned generation;
    pthread_t thread;
    pthread_mutex_t mu; /* guards entries and the event queue */
    pthread_cond_t queued;
    entry *entries;
    size_t n_entries, cap_entries;
    event_node *head, *tail;
};

/* A client the thread serves: its socket and its connection id. */
typedef struct client {
    int fd;
    uint64_t id;
} client;

/* ---- the table ------------------------------------------------------------------------------ */

static entry *find(cx_tcp_server *s, const char *key)
{
    for (size_t i = 0; i < s->n_entries; i++)
        if (!strcmp(s->entries[i].key, key))
            return &s->entries[i];
    return NULL;
}

/* Stores key -> value (both malloc'ed: taken on success); the caller holds mu. The entry, or
 * NULL without memory. */
static entry *put(cx_tcp_server *s, char *key, void *value, size_t len)
{
    entry *e = find(s, key);
    if (!e && s->n_entries == s->cap_entries) {
        size_t cap = s->cap_entries ? 2 * s->cap_entries : 64;
        entry *grown = realloc(s->entries, cap * sizeof *grown);
        if (!grown)
            return NULL;
        s->entries = grown;
        s->cap_entries = cap;
    }
    if (e) {
        free(key);
        free(e->value);
    } else {
        e = &s->entries[s->n_entries++];
        e->key = key;
    }
    e->value = value;
    e->len = len;
    return e;
}

/* Queues an event (copying key and value); the caller holds mu. Without memory the event is lost
 * rather than the request: the server keeps serving. */
static void queue_event(cx_tcp_server *s, int kind, uint64_t connection, const char *key,
                        const void *value, size_t len)
{
    if (!s->events)
        return;
    event_node *n = calloc(1, sizeof *n);
    if (!n)
        return;
    n->ev = (cx_tcp_event){.kind = kind, .connection = connection};
    if (key) {
        n->ev.key = strdup(key);
        n->ev.value = malloc(len ? len : 1);
        n->ev.len = len;
        if (!n->ev.key || !n->ev.value) {
            free(n->ev.key);
            free(n->ev.value);
            free(n);
            return;
        }
        memcpy(n->ev.value, value, len);
    }
    if (s->tail)
        s->tail->next = n;
    else
        s->head = n;
    s->tail = n;
    pthread_cond_signal(&s->queued);
}

/* ---- requests ------------------------------------------------------------------------------- */

/* Answers one request of client c; -1 drops it (it closed, or sent something malformed). */
static int serve_request(cx_tcp_server *s, const client *c)
{
    unsigned char op;
    char *key = NULL, *value = NULL;
    uint32_t klen, vlen = 0;
    if (cx_wire_read(c->fd, &op, 1) || cx_wire_read_blob(c->fd, CX_STORE_KEY_LIMIT, &key, &klen))
        return -1;
    int rc = -1;
    if (op == 'S' || op == 'O') {
        if (cx_wire_read_blob(c->fd, CX_STORE_VALUE_LIMIT, &value, &vlen))
            goto out;
        pthread_mutex_lock(&s->mu);
        /* 'O' leaves a key that is set as it is (the first value wins) and answers 0. */
        unsigned char stored = op == 'S' || !find(s, key);
        entry *e = stored ? put(s, key, value, vlen) : NULL;
        if (e)
            queue_event(s, CFX_STORE_EVENT_SET, c->id, e->key, e->value, e->len);
        pthread_mutex_unlock(&s->mu);
        if (stored && !e)
            goto out;
        if (stored)
            key = value = NULL; /* the table has them */
        rc = cx_wire_write(c->fd, &stored, 1);
    } else if (op == 'C' || op == 'G') {
        pthread_mutex_lock(&s->mu);
        entry *e = find(s, key);
        unsigned char head[5] = {e != NULL};
        cx_wire_put_u32(head + 1, e ? (uint32_t)e->len : 0);
        if (e && op == 'G' && (value = malloc(e->len ? e->len : 1)) != NULL)
            memcpy(value, e->value, e->len);
        pthread_mutex_unlock(&s->mu);
        if (op == 'C')
            rc = cx_wire_write(c->fd, head, 1);
        else if (!e || value) /* no memory for the copy: drop the client rather than lie */
            rc = cx_wire_write(c->fd, head, e ? 5 : 1) ||
                 (e && cx_wire_write(c->fd, value, cx_wire_get_u32(head + 1)));
    }
out:
    free(key);
    free(value);
    return rc;
}

/* Greets a new client: 0, or -1 (then it is closed). */
static int greet(cx_tcp_server *s, int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char hello[CX_STORE_GREETING_LEN + 4];
    memcpy(hello, CX_STORE_GREETING, CX_STORE_GREETING_LEN);
    cx_wire_put_u32(hello + CX_STORE_GREETING_LEN, s->generation);
    return cx_wire_write(fd, hello, sizeof hello);
}

static void *server_main(void *arg)
{
    cx_tcp_server *s = arg;
    struct pollfd *fds = NULL; /* [0] wake, [1] listen, then one per client */
    client *clients = NULL;    /* clients[i] is fds[i + 2]'s */
    size_t n = 2, cap = 0;
    uint64_t next_id = 1;
    for (;;) {
        if (n + 1 > cap) {
            size_t grown_cap = cap ? 2 * cap : 16;
            struct pollfd *grown = realloc(fds, grown_cap * sizeof *grown);
            if (grown)
                fds = grown;
            client *grown_clients = grown ? realloc(clients, grown_cap * sizeof *clients) : NULL;
            if (!grown_clients)
                break;
            clients = grown_clients;
            if (!cap) {
                fds[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
                fds[1] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
            }
            cap = grown_cap;
        }
        if (poll(fds, (nfds_t)n, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (fds[0].revents)
            break;
        if (fds[1].revents & POLLIN) {
            int fd = accept(s->listen_fd, NULL, NULL);
            if (fd >= 0 && greet(s, fd) == 0) {
                clients[n - 2] = (client){fd, next_id++};
                fds[n++] = (struct pollfd){.fd = fd, .events = POLLIN};
            } else if (fd >= 0) {
                close(fd);
            }
        }
        for (size_t i = 2; i < n; i++) {
            if (!fds[i].revents || !serve_request(s, &clients[i - 2]))
                continue;
            close(fds[i].fd);
            pthread_mutex_lock(&s->mu);
            queue_event(s, CFX_STORE_EVENT_CLOSED, clients[i - 2].id, NULL, NULL, 0);
            pthread_mutex_unlock(&s->mu);
            /* The last client takes this one's place (its events keep their order: each
             * client's are queued by this one thread, as they happen). */
            fds[i] = fds[n - 1];
            clients[i - 2] = clients[n - 3];
            n--;
            i--;
        }
    }
    for (size_t i = 2; i < n; i++)
        close(fds[i].fd);
    free(fds);
    free(clients);
    return NULL;
}

/* ---- starting and stopping ------------------------------------------------------------------ */

/* A listening socket on `port` (all addresses), or -1 with errno set. */
static int listen_on(int port)
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int v6 = fd >= 0;
    if (!v6)
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (v6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port),
                              .sin6_addr = IN6ADDR_ANY_INIT};
    struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    int rc = v6 ? bind(fd, (struct sockaddr *)&a6, sizeof a6)
                : bind(fd, (struct sockaddr *)&a4, sizeof a4);
    if (rc != 0 || listen(fd, 1024) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* The listening socket on the first free port of the span (s->port: which), or CFX_ERR_CONFIG. */
static cfx_status open_listener(cx_tcp_server *s, const cx_tcp_server_params *p)
{
    int span = p->port_span > 1 ? p->port_span : 1, e = 0;
    for (int i = 0; i < span && s->listen_fd < 0; i++) {
        s->listen_fd = listen_on(p->port + i);
        e = errno;
        s->port = p->port + i;
    }
    if (s->listen_fd < 0) {
        char ports[48];
        snprintf(ports, sizeof ports, span > 1 ? "ports %d-%d" : "port %d", p->port,
                 p->port + span - 1);
        return cx_fail(CFX_ERR_CONFIG, "rendezvous: cannot serve the TCP store on %s: %s%s", ports,
                       strerror(e), e != EADDRINUSE ? "" : span > 1
                       ? " (other programs have them: set CFX_RENDEZVOUS_PORT to a free port on "
                         "the host that serves the store)"
                       : " (another program has it: set CFX_RENDEZVOUS_PORT to a free port on the "
                         "host that serves the store)");
    }
    struct sockaddr_storage bound; /* port 0: the one the system chose */
    socklen_t bound_len = sizeof bound;
    if (p->port == 0 && getsockname(s->listen_fd, (struct sockaddr *)&bound, &bound_len) == 0)
        s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    return CFX_OK;
}

static void free_server(cx_tcp_server *s)
{
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    for (size_t i = 0; i < s->n_entries; i++) {
        free(s->entries[i].key);
        free(s->entries[i].value);
    }
    free(s->entries);
    for (event_node *n = s->head, *next; n; n = next) {
        next = n->next;
        free(n->ev.key);
        free(n->ev.value);
        free(n);
    }
    pthread_cond_destroy(&s->queued);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

cfx_status cx_tcp_server_start(const cx_tcp_server_params *p, cx_tcp_server **out)
{
    cx_tcp_server *s = calloc(1, sizeof *s);
    if (!s)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for the TCP store's server");
    s->listen_fd = -1;
    s->generation = p->generation;
    s->events = p->events;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC); /* next_event's deadline */
    pthread_cond_init(&s->queued, &attr);
    pthread_condattr_destroy(&attr);
    cfx_status st = open_listener(s, p);
    if (!st && p->job_token && cx_tcp_server_set(s, CX_STORE_JOB_KEY, p->job_token,
                                                 strlen(p->job_token)))
        st = CFX_ERR_OUT_OF_MEMORY;
    if (!st && pipe(s->wake) != 0)
        st = cx_fail(CFX_ERR_INTERNAL, "rendezvous: cannot make the TCP store server's pipe: %s",
                     strerror(errno));
    else if (!st && pthread_create(&s->thread, NULL, server_main, s) != 0) {
        close(s->wake[0]);
        close(s->wake[1]);
        st = cx_fail(CFX_ERR_INTERNAL, "rendezvous: cannot start the TCP store's server thread");
    }
    if (st) {
        free_server(s);
        return st;
    }
    *out = s;
    return CFX_OK;
}

void cx_tcp_server_stop(cx_tcp_server *s)
{
    if (!s)
        return;
    if (write(s->wake[1], "x", 1) == 1)
        pthread_join(s->thread, NULL);
    close(s->wake[0]);
    close(s->wake[1]);
    free_server(s);
}

int cx_tcp_server_port(const cx_tcp_server *s) { return s->port; }

/* ---- the serving process's own calls -------------------------------------------------------- */

cfx_status cx_tcp_server_set(cx_tcp_server *s, const char *key, const void *data, size_t len)
{
    char *k = strdup(key);
    void *v = malloc(len ? len : 1);
    if (k && v && len)
        memcpy(v, data, len);
    pthread_mutex_lock(&s->mu);
    int rc = k && v && put(s, k, v, len) ? 0 : -1;
    pthread_mutex_unlock(&s->mu);
    if (rc) {
        free(k);
        free(v);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory to set key \"%.64s\" (%zu "
                       "bytes) in the TCP store", key, len);
    }
    return CFX_OK;
}

void cx_tcp_server_get(cx_tcp_server *s, const char *key, void *buf, size_t cap, size_t *len,
                       int *present)
{
    pthread_mutex_lock(&s->mu);
    entry *e = find(s, key);
    *present = e != NULL;
    *len = e ? e->len : 0;
    if (e && cap)
        memcpy(buf, e->value, e->len < cap ? e->len : cap);
    pthread_mutex_unlock(&s->mu);
}

cfx_status cx_tcp_server_next_event(cx_tcp_server *s, double timeout_s, cx_tcp_event *ev)
{
    if (timeout_s > 1e8) /* no overflow of the deadline */
        timeout_s = 1e8;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    time_t whole = (time_t)timeout_s;
    until.tv_sec += whole;
    until.tv_nsec += (long)((timeout_s - (double)whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (!s->head && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&s->queued, &s->mu, &until);
    event_node *n = s->head;
    if (n) {
        s->head = n->next;
        if (!s->head)
            s->tail = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (!n) {
        *ev = (cx_tcp_event){.kind = CFX_STORE_EVENT_NONE};
        return cx_fail(CFX_ERR_TIMEOUT, "rendezvous: no event at the TCP store within %g s",
                       timeout_s);
    }
    *ev = n->ev;
    free(n);
    return CFX_OK;
}
