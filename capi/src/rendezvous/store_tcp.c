/*
 * store_tcp - the TCP store: a server thread (on rank 0, or in cfxrun: tools/cfxrun speaks the same
 * protocol) holding every key in memory, and a client connection in every rank.
 *
 * Protocol (integers are 32-bit big-endian): on connect the server sends the 10-byte greeting
 * "CFXSTORE1\n" (a client that reads anything else has reached some other program) and its
 * generation (0: any; else the world it serves, see store.h). Requests:
 * 'S' klen key vlen value -> 1 byte (1); 'C' klen key -> 1 byte (1 set, 0 not); 'G' klen key -> 1
 * byte (set or not), then vlen value when set; 'O' klen key vlen value -> 1 byte (1 set now, 0 it
 * was set already and stays as it was: the first value wins). 'S' overwrites (a heartbeat counts
 * up under one key); a client waits by polling 'C'.
 *
 * A store whose port is derived rather than chosen (torchrun's MASTER_PORT + 1, Slurm's job id)
 * may find it taken by another program's socket: the server then takes the next free port of a
 * short range, and holds the job's token under JOB_KEY so that a client trying the range knows
 * its own job's store from another job's.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "rendezvous/store.h"

#define GREETING "CFXSTORE1\n"
#define JOB_KEY "cfx/job-token"
#define GREETING_WAIT_S 3.0 /* trying a range of ports: how long a mute listener may hold us */
#define GREETING_LEN 10
#define KEY_LIMIT 4096u
#define VALUE_LIMIT (256u << 20)

typedef struct entry {
    char *key;
    void *value;
    size_t len;
} entry;

typedef struct tcp_server {
    int listen_fd, wake[2];
    unsigned generation;
    pthread_t thread;
    entry *entries;
    size_t n_entries, cap_entries;
} tcp_server;

typedef struct tcp_store {
    cx_store base;
    int fd;
    double io_timeout_s;
    pthread_mutex_t mu; /* one request at a time on the connection */
    tcp_server *server; /* set in the process that serves */
} tcp_store;

/* ---- byte I/O ------------------------------------------------------------------------------- */

static int read_full(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t r = recv(fd, p, len, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static int read_u32(int fd, uint32_t *v)
{
    unsigned char b[4];
    if (read_full(fd, b, 4))
        return -1;
    *v = get_u32(b);
    return 0;
}

/* A length-prefixed string read into a malloc'ed buffer (NUL-terminated for keys). */
static int read_blob(int fd, uint32_t limit, char **out, uint32_t *len)
{
    if (read_u32(fd, len) || *len > limit)
        return -1;
    char *b = malloc((size_t)*len + 1);
    if (!b || read_full(fd, b, *len)) {
        free(b);
        return -1;
    }
    b[*len] = '\0';
    *out = b;
    return 0;
}

/* ---- server --------------------------------------------------------------------------------- */

static entry *find(tcp_server *s, const char *key)
{
    for (size_t i = 0; i < s->n_entries; i++)
        if (!strcmp(s->entries[i].key, key))
            return &s->entries[i];
    return NULL;
}

/* Answers one request; -1 drops the client (it closed, or sent something malformed). */
static int serve_request(tcp_server *s, int fd)
{
    unsigned char op;
    char *key = NULL, *value = NULL;
    uint32_t klen, vlen;
    if (read_full(fd, &op, 1) || read_blob(fd, KEY_LIMIT, &key, &klen))
        return -1;
    int rc = -1;
    entry *e = find(s, key);
    if ((op == 'S' || op == 'O') && !read_blob(fd, VALUE_LIMIT, &value, &vlen)) {
        unsigned char stored = op == 'S' || !e; /* 'O' leaves a key that is set as it is */
        if (!e && s->n_entries == s->cap_entries) {
            size_t cap = s->cap_entries ? 2 * s->cap_entries : 64;
            entry *grown = realloc(s->entries, cap * sizeof *grown);
            if (!grown)
                goto out;
            s->entries = grown;
            s->cap_entries = cap;
        }
        if (!e) {
            e = &s->entries[s->n_entries++];
            e->key = key;
            e->value = NULL;
            key = NULL;
        }
        if (stored) {
            free(e->value);
            e->value = value;
            e->len = vlen;
            value = NULL;
        }
        rc = write_full(fd, &stored, 1);
    } else if (op == 'C') {
        unsigned char present = e != NULL;
        rc = write_full(fd, &present, 1);
    } else if (op == 'G') {
        unsigned char head[5] = {e != NULL};
        put_u32(head + 1, e ? (uint32_t)e->len : 0);
        rc = write_full(fd, head, e ? 5 : 1);
        if (!rc && e)
            rc = write_full(fd, e->value, e->len);
    }
out:
    free(key);
    free(value);
    return rc;
}

static void *server_main(void *arg)
{
    tcp_server *s = arg;
    struct pollfd *fds = NULL;
    size_t n = 2, cap = 0;
    for (;;) {
        if (n + 1 > cap) {
            size_t grown_cap = cap ? 2 * cap : 16;
            struct pollfd *grown = realloc(fds, grown_cap * sizeof *grown);
            if (!grown)
                break;
            if (!fds) {
                grown[0] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
                grown[1] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
            }
            fds = grown;
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
            int c = accept(s->listen_fd, NULL, NULL);
            if (c >= 0) {
                int one = 1;
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                unsigned char hello[GREETING_LEN + 4];
                memcpy(hello, GREETING, GREETING_LEN);
                put_u32(hello + GREETING_LEN, s->generation);
                if (write_full(c, hello, sizeof hello) == 0)
                    fds[n++] = (struct pollfd){.fd = c, .events = POLLIN};
                else
                    close(c);
            }
        }
        for (size_t i = 2; i < n; i++) {
            if (!fds[i].revents)
                continue;
            if (serve_request(s, fds[i].fd)) {
                close(fds[i].fd);
                fds[i--] = fds[--n];
            }
        }
    }
    for (size_t i = 2; i < n; i++)
        close(fds[i].fd);
    free(fds);
    return NULL;
}

static void server_stop(tcp_server *s)
{
    if (!s)
        return;
    if (write(s->wake[1], "x", 1) == 1)
        pthread_join(s->thread, NULL);
    close(s->wake[0]);
    close(s->wake[1]);
    close(s->listen_fd);
    for (size_t i = 0; i < s->n_entries; i++) {
        free(s->entries[i].key);
        free(s->entries[i].value);
    }
    free(s->entries);
    free(s);
}

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

/* Serves on the first free port of p->port .. p->port + p->port_span - 1; *port_out: which. */
static cfx_status server_start(const cx_tcp_store_params *p, tcp_server **out, int *port_out)
{
    tcp_server *s = calloc(1, sizeof *s);
    if (!s)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for the TCP store's server");
    s->generation = p->generation;
    int span = p->port_span > 1 ? p->port_span : 1, e = 0;
    s->listen_fd = -1;
    for (int i = 0; i < span && s->listen_fd < 0; i++) {
        s->listen_fd = listen_on(p->port + i);
        e = errno;
        *port_out = p->port + i;
    }
    struct sockaddr_storage bound; /* port 0: the one the system chose */
    socklen_t bound_len = sizeof bound;
    if (s->listen_fd >= 0 && p->port == 0 &&
        getsockname(s->listen_fd, (struct sockaddr *)&bound, &bound_len) == 0)
        *port_out = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                      : ((struct sockaddr_in *)&bound)->sin_port);
    if (s->listen_fd < 0) {
        free(s);
        char ports[48];
        snprintf(ports, sizeof ports, span > 1 ? "ports %d-%d" : "port %d", p->port,
                 p->port + span - 1);
        return cx_fail(CFX_ERR_CONFIG, "rendezvous: cannot serve the TCP store on %s: %s%s", ports,
                       strerror(e), e == EADDRINUSE ? " (other programs have them: set "
                       "CFX_RENDEZVOUS_PORT to a free port on rank 0's host)" : "");
    }
    if (p->job_token) {
        s->entries = calloc(1, sizeof *s->entries);
        if (s->entries) {
            s->cap_entries = s->n_entries = 1;
            s->entries[0].key = strdup(JOB_KEY);
            s->entries[0].value = strdup(p->job_token);
            s->entries[0].len = strlen(p->job_token);
        }
    }
    cfx_status st = CFX_OK;
    if (p->job_token && (!s->entries || !s->entries[0].key || !s->entries[0].value))
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for the TCP store's server");
    else if (pipe(s->wake) != 0 || pthread_create(&s->thread, NULL, server_main, s) != 0)
        st = cx_fail(CFX_ERR_INTERNAL, "rendezvous: cannot start the TCP store's server thread");
    if (st) {
        close(s->listen_fd);
        if (s->entries) {
            free(s->entries[0].key);
            free(s->entries[0].value);
        }
        free(s->entries);
        free(s);
        return st;
    }
    *out = s;
    return CFX_OK;
}

/* ---- client --------------------------------------------------------------------------------- */

static cfx_status lost(tcp_store *t, const char *what, const char *key)
{
    return cx_fail(CFX_ERR_PEER_LOST, "rendezvous: the %s stopped answering (%s key \"%s\"): did "
                   "the process serving it (rank 0 or cfxrun) exit?", t->base.where, what, key);
}

static int send_request(tcp_store *t, char op, const char *key, const void *value, size_t vlen)
{
    size_t klen = strlen(key);
    unsigned char head[5];
    head[0] = (unsigned char)op;
    put_u32(head + 1, (uint32_t)klen);
    if (write_full(t->fd, head, 5) || write_full(t->fd, key, klen))
        return -1;
    if (op != 'S' && op != 'O')
        return 0;
    unsigned char len[4];
    put_u32(len, (uint32_t)vlen);
    return write_full(t->fd, len, 4) || write_full(t->fd, value, vlen) ? -1 : 0;
}

static cfx_status check_sizes(const char *key, size_t vlen)
{
    if (strlen(key) > KEY_LIMIT || vlen > VALUE_LIMIT)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "rendezvous: key \"%.64s\" (%zu characters) or its "
                       "value (%zu bytes) is above the TCP store's limits (%u, %u)", key,
                       strlen(key), vlen, KEY_LIMIT, VALUE_LIMIT);
    return CFX_OK;
}

/* 'S' (set: the server answers 1) or 'O' (set once: 1 set now, 0 it was set already). */
static cfx_status tcp_put(cx_store *s, char op, const char *key, const void *data, size_t len)
{
    tcp_store *t = (tcp_store *)s;
    cfx_status st = check_sizes(key, len);
    if (st)
        return st;
    unsigned char answer = 2;
    pthread_mutex_lock(&t->mu);
    int rc = send_request(t, op, key, data, len) || read_full(t->fd, &answer, 1);
    pthread_mutex_unlock(&t->mu);
    if (!rc && (answer == 1 || (op == 'O' && answer == 0)))
        return CFX_OK;
    if (op == 'O') /* a server older than set-once drops the connection at 'O' */
        return cx_fail(CFX_ERR_PEER_LOST, "rendezvous: the %s stopped answering when asked to set "
                       "key \"%s\" once: did the process serving it exit, or is it older than "
                       "this library (a store without set-once)?", t->base.where, key);
    return lost(t, "setting", key);
}

static cfx_status tcp_set(cx_store *s, const char *key, const void *data, size_t len)
{
    return tcp_put(s, 'S', key, data, len);
}

static cfx_status tcp_set_once(cx_store *s, const char *key, const void *data, size_t len)
{
    return tcp_put(s, 'O', key, data, len);
}

static cfx_status tcp_check(cx_store *s, const char *key, int *present)
{
    tcp_store *t = (tcp_store *)s;
    cfx_status st = check_sizes(key, 0);
    if (st)
        return st;
    unsigned char p = 0;
    pthread_mutex_lock(&t->mu);
    int rc = send_request(t, 'C', key, NULL, 0) || read_full(t->fd, &p, 1);
    pthread_mutex_unlock(&t->mu);
    if (rc)
        return lost(t, "looking up", key);
    *present = p == 1;
    return CFX_OK;
}

static cfx_status tcp_get(cx_store *s, const char *key, void **data, size_t *len)
{
    tcp_store *t = (tcp_store *)s;
    cfx_status st = check_sizes(key, 0);
    if (st)
        return st;
    unsigned char present = 0;
    uint32_t n = 0;
    char *buf = NULL;
    pthread_mutex_lock(&t->mu);
    int rc = send_request(t, 'G', key, NULL, 0) || read_full(t->fd, &present, 1) ||
             (present && read_blob(t->fd, VALUE_LIMIT, &buf, &n));
    pthread_mutex_unlock(&t->mu);
    if (rc)
        return lost(t, "reading", key);
    if (!present)
        return cx_fail(CFX_ERR_INTERNAL, "rendezvous: key \"%s\" is not set in the %s", key,
                       s->where);
    *data = buf;
    *len = n;
    return CFX_OK;
}

static void tcp_destroy(cx_store *s)
{
    tcp_store *t = (tcp_store *)s;
    if (t->fd >= 0)
        close(t->fd);
    server_stop(t->server);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* shutdown() (not close: the descriptor stays valid for the thread using it) wakes a blocked
 * recv with an error. */
static void tcp_interrupt(cx_store *s)
{
    tcp_store *t = (tcp_store *)s;
    if (t->fd >= 0)
        shutdown(t->fd, SHUT_RDWR);
}

static const cx_store_ops tcp_ops = {"TCP store", tcp_set, tcp_check, tcp_get, NULL, tcp_interrupt,
                                     tcp_destroy, tcp_set_once};

/* A server that stops answering fails the request instead of hanging the rank. */
static void set_io_timeout(int fd, double seconds)
{
    struct timeval tv = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* One connection attempt to any address of host:port: the socket, or -1 (errno set). */
static int connect_once(const char *host, int port, double io_timeout_s, int *gai_error)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if ((*gai_error = getaddrinfo(host, service, &hints, &res)) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        set_io_timeout(fd, io_timeout_s);
    }
    return fd;
}

/* Whether the store at `fd` holds `token` under JOB_KEY: 1 yes, 0 no (another job's), -1 the
 * connection failed. */
static int holds_token(int fd, const char *token)
{
    unsigned char head[5], present = 0;
    size_t klen = strlen(JOB_KEY);
    head[0] = 'G';
    put_u32(head + 1, (uint32_t)klen);
    char *value = NULL;
    uint32_t vlen = 0;
    if (write_full(fd, head, 5) || write_full(fd, JOB_KEY, klen) || read_full(fd, &present, 1) ||
        (present && read_blob(fd, VALUE_LIMIT, &value, &vlen)))
        return -1;
    int same = present && vlen == strlen(token) && !memcmp(value, token, vlen);
    free(value);
    return same;
}

/* One attempt at this job's store on `port`: the connected socket, or -1 with *why saying what
 * answered (0: nothing; ECONNREFUSED also for an earlier world's server shutting down; EPROTO:
 * some other program; EEXIST: another job's store). */
static int reach_store(const cx_tcp_store_params *p, int port, int *gai, int *why)
{
    /* A store greets at once; a program that accepts and stays mute must not hold a client
     * trying a range of ports for its whole deadline. */
    double greet_s = p->port_span > 1 && p->timeout_s > GREETING_WAIT_S ? GREETING_WAIT_S
                                                                        : p->timeout_s;
    int fd = connect_once(p->host, port, greet_s, gai);
    *why = errno;
    if (fd < 0)
        return -1;
    unsigned char hello[GREETING_LEN + 4];
    int unread = read_full(fd, hello, sizeof hello);
    if (!unread && memcmp(hello, GREETING, GREETING_LEN)) {
        *why = EPROTO;
    } else {
        /* Closed before greeting (a server shutting down), or the server of an earlier world
         * shutting down: this world's is still to come. */
        unsigned served = unread ? ~0u : get_u32(hello + GREETING_LEN);
        *why = ECONNREFUSED;
        if (served == 0 || served == p->generation) {
            int mine = p->job_token ? holds_token(fd, p->job_token) : 1;
            if (mine == 1 && greet_s != p->timeout_s)
                set_io_timeout(fd, p->timeout_s);
            if (mine == 1)
                return fd;
            *why = mine == 0 ? EEXIST : ECONNREFUSED;
        }
    }
    close(fd);
    return -1;
}

/* What reach_store's answer means, for a message. */
static const char *answer_text(int why)
{
    return why == EPROTO   ? "something other than a Conflux store answers"
           : why == EEXIST ? "another job's Conflux store answers"
                           : strerror(why);
}

cfx_status cx_store_tcp_create(const cx_tcp_store_params *p, cx_store **out)
{
    tcp_store *t = calloc(1, sizeof *t);
    if (!t)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "rendezvous: no memory for the TCP store");
    t->fd = -1;
    t->io_timeout_s = p->timeout_s;
    t->base.ops = &tcp_ops;
    pthread_mutex_init(&t->mu, NULL);
    int span = p->port_span > 1 ? p->port_span : 1, served_port = p->port;
    if (span > 1)
        snprintf(t->base.where, sizeof t->base.where, "TCP store at %s:%d-%d", p->host, p->port,
                 p->port + span - 1);
    else
        snprintf(t->base.where, sizeof t->base.where, "TCP store at %s:%d", p->host, p->port);
    cfx_status st = p->serve ? server_start(p, &t->server, &served_port) : CFX_OK;
    if (!st && p->serve && (span > 1 || served_port != p->port)) { /* the server knows its port */
        snprintf(t->base.where, sizeof t->base.where, "TCP store at %s:%d", p->host, served_port);
        span = 1;
    }
    int first = p->serve ? served_port : p->port;
    double deadline = cx_now_s() + p->timeout_s;
    int gai = 0, err = 0;
    long pause_ns = 1000000L;
    while (!st && t->fd < 0) {
        /* The server is reached by the same name in every rank, rank 0 included: a name that does
         * not lead back to rank 0's host fails here too rather than splitting the job. */
        for (int i = 0; i < span && t->fd < 0; i++) {
            int why = 0;
            t->fd = reach_store(p, first + i, &gai, &why);
            if (t->fd < 0 && (why == EPROTO || why == EEXIST) && span == 1) {
                st = cx_fail(CFX_ERR_CONFIG, "rendezvous: %s at %s:%d (set "
                             "CFX_RENDEZVOUS_PORT to a free port)", answer_text(why), p->host,
                             first + i);
                break;
            }
            if (t->fd < 0 && (i == 0 || why != ECONNREFUSED))
                err = why; /* the first port's answer, unless a later one says more */
        }
        if (st || t->fd >= 0)
            break;
        if (cx_now_s() >= deadline) {
            st = cx_fail(CFX_ERR_TIMEOUT, "rendezvous: cannot reach the %s within %g s: %s (is "
                         "rank 0 running, and is %s its host's address?)", t->base.where,
                         p->timeout_s, gai ? gai_strerror(gai) : answer_text(err), p->host);
            break;
        }
        struct timespec pause = {0, pause_ns};
        nanosleep(&pause, NULL);
        pause_ns = pause_ns * 2 > 100000000L ? 100000000L : pause_ns * 2;
    }
    if (st) {
        tcp_destroy(&t->base);
        return st;
    }
    struct sockaddr_storage self;
    socklen_t self_len = sizeof self;
    if (getsockname(t->fd, (struct sockaddr *)&self, &self_len) == 0)
        getnameinfo((struct sockaddr *)&self, self_len, t->base.local_addr,
                    sizeof t->base.local_addr, NULL, 0, NI_NUMERICHOST);
    *out = &t->base;
    return CFX_OK;
}
