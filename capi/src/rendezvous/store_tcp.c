/*
 * store_tcp - the TCP store's client (a connection in every rank) and cx_store_tcp_create, which
 * also starts the server (store_tcp_server.c) in the process that serves: rank 0, or a launcher's
 * tool (tools/cfx-store.c). The protocol is store_tcp_wire.h's.
 *
 * A store whose port is derived rather than chosen (torchrun's MASTER_PORT + 1, Slurm's job id)
 * may find it taken by another program's socket: the server then takes the next free port of a
 * short range, and holds the job's token under CX_STORE_JOB_KEY so that a client trying the range
 * knows its own job's store from another job's.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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
#include "rendezvous/store_tcp_server.h"
#include "rendezvous/store_tcp_wire.h"

#define GREETING_WAIT_S 3.0 /* trying a range of ports: how long a mute listener may hold us */

typedef struct tcp_store {
    cx_store base;
    int fd;
    double io_timeout_s;
    pthread_mutex_t mu;    /* one request at a time on the connection */
    cx_tcp_server *server; /* set in the process that serves */
} tcp_store;

/* ---- client --------------------------------------------------------------------------------- */

static cfx_status lost(tcp_store *t, const char *what, const char *key)
{
    return cx_fail(CFX_ERR_PEER_LOST, "rendezvous: the %s stopped answering (%s key \"%s\"): did "
                   "the process serving it (rank 0, or the launcher) exit?", t->base.where, what,
                   key);
}

static int send_request(tcp_store *t, char op, const char *key, const void *value, size_t vlen)
{
    size_t klen = strlen(key);
    unsigned char head[5];
    head[0] = (unsigned char)op;
    cx_wire_put_u32(head + 1, (uint32_t)klen);
    if (cx_wire_write(t->fd, head, 5) || cx_wire_write(t->fd, key, klen))
        return -1;
    if (op != 'S' && op != 'O')
        return 0;
    unsigned char len[4];
    cx_wire_put_u32(len, (uint32_t)vlen);
    return cx_wire_write(t->fd, len, 4) || cx_wire_write(t->fd, value, vlen) ? -1 : 0;
}

static cfx_status check_sizes(const char *key, size_t vlen)
{
    if (strlen(key) > CX_STORE_KEY_LIMIT || vlen > CX_STORE_VALUE_LIMIT)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "rendezvous: key \"%.64s\" (%zu characters) or "
                       "its value (%zu bytes) is above the TCP store's limits (%u, %u)", key,
                       strlen(key), vlen, CX_STORE_KEY_LIMIT, CX_STORE_VALUE_LIMIT);
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
    int rc = send_request(t, op, key, data, len) || cx_wire_read(t->fd, &answer, 1);
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
    int rc = send_request(t, 'C', key, NULL, 0) || cx_wire_read(t->fd, &p, 1);
    pthread_mutex_unlock(&t->mu);
    if (rc)
        return lost(t, "looking up", key);
    *present = p == 1;
    return CFX_OK;
}

cfx_status cx_store_tcp_lookup(cx_store *s, const char *key, int *present, void **data,
                               size_t *len)
{
    tcp_store *t = (tcp_store *)s;
    cfx_status st = check_sizes(key, 0);
    if (st)
        return st;
    unsigned char set = 0;
    uint32_t n = 0;
    char *buf = NULL;
    pthread_mutex_lock(&t->mu);
    int rc = send_request(t, 'G', key, NULL, 0) || cx_wire_read(t->fd, &set, 1) ||
             (set && cx_wire_read_blob(t->fd, CX_STORE_VALUE_LIMIT, &buf, &n));
    pthread_mutex_unlock(&t->mu);
    if (rc)
        return lost(t, "reading", key);
    *present = set == 1;
    *data = buf;
    *len = n;
    return CFX_OK;
}

static cfx_status tcp_get(cx_store *s, const char *key, void **data, size_t *len)
{
    int present = 0;
    cfx_status st = cx_store_tcp_lookup(s, key, &present, data, len);
    if (!st && !present)
        st = cx_fail(CFX_ERR_INTERNAL, "rendezvous: key \"%s\" is not set in the %s", key,
                     s->where);
    return st;
}

static void tcp_destroy(cx_store *s)
{
    tcp_store *t = (tcp_store *)s;
    if (t->fd >= 0)
        close(t->fd);
    cx_tcp_server_stop(t->server);
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

/* Whether the store at `fd` holds `token` under CX_STORE_JOB_KEY: 1 yes, 0 no (another job's),
 * -1 the connection failed. */
static int holds_token(int fd, const char *token)
{
    unsigned char head[5], present = 0;
    size_t klen = strlen(CX_STORE_JOB_KEY);
    head[0] = 'G';
    cx_wire_put_u32(head + 1, (uint32_t)klen);
    char *value = NULL;
    uint32_t vlen = 0;
    if (cx_wire_write(fd, head, 5) || cx_wire_write(fd, CX_STORE_JOB_KEY, klen) ||
        cx_wire_read(fd, &present, 1) ||
        (present && cx_wire_read_blob(fd, CX_STORE_VALUE_LIMIT, &value, &vlen)))
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
    unsigned char hello[CX_STORE_GREETING_LEN + 4];
    int unread = cx_wire_read(fd, hello, sizeof hello);
    if (!unread && memcmp(hello, CX_STORE_GREETING, CX_STORE_GREETING_LEN)) {
        *why = EPROTO;
    } else {
        /* Closed before greeting (a server shutting down), or the server of an earlier world
         * shutting down: this world's is still to come. */
        unsigned served = unread ? ~0u : cx_wire_get_u32(hello + CX_STORE_GREETING_LEN);
        *why = ECONNREFUSED;
        if (served == 0 || p->generation == 0 || served == p->generation) {
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
    cfx_status st = CFX_OK;
    if (p->serve) {
        cx_tcp_server_params sp = {.port = p->port, .port_span = p->port_span,
                                   .job_token = p->job_token, .generation = p->generation};
        st = cx_tcp_server_start(&sp, &t->server);
        if (!st)
            served_port = cx_tcp_server_port(t->server);
    }
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
                         "%s running, and is %s its host's address?)", t->base.where,
                         p->timeout_s, gai ? gai_strerror(gai) : answer_text(err),
                         p->generation ? "rank 0" : "the process serving it", p->host);
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
