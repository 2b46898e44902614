/* transport_local - the in-process transport with thread ranks (see transport_local.h). */
#include "transport/transport_local.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/reduce.h"

typedef struct local_slot {
    const void *send;
    void *recv;
    size_t len;
    const size_t *a, *b; /* per-rank byte counts / displacements, as the op needs */
} local_slot;

/* One direction of point to point between two ranks (local_sendrecv): the sender posts its buffer
 * and waits until the receiver has copied it. */
typedef struct local_mail {
    const void *data;
    size_t len;
    int state; /* 0 empty, 1 posted, 2 being copied */
} local_mail;

struct cx_local_world {
    int size;
    atomic_int refs;
    local_mail *mail;  /* [from * size + to], guarded by mail_mu */
    pthread_mutex_t mail_mu;
    pthread_cond_t mail_cv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long generation;
    local_slot *slots;
    /* Splits (local_split): the worlds being made, by split sequence, until every member took
     * its transport. Guarded by mu. */
    struct local_child *children;
};

typedef struct local_child {
    unsigned long seq;
    cx_local_world *world;
    int taken;
    struct local_child *next;
} local_child;

typedef struct local_transport {
    cx_transport base;
    cx_local_world *world;
    void *acc;         /* allreduce's accumulator, kept and grown (no allocation per call) */
    size_t acc_cap;
    unsigned long splits; /* splits this rank took part in: the next one's sequence */
} local_transport;

cfx_status cx_local_world_create(int size, cx_local_world **out)
{
    if (size < 1)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "a local world needs at least one rank, not %d", size);
    cx_local_world *w = calloc(1, sizeof *w);
    if (!w || !(w->slots = calloc((size_t)size, sizeof *w->slots)) ||
        !(w->mail = calloc((size_t)size * (size_t)size, sizeof *w->mail))) {
        if (w)
            free(w->slots);
        free(w);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a local world of %d ranks", size);
    }
    w->size = size;
    atomic_init(&w->refs, 1);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    pthread_mutex_init(&w->mail_mu, NULL);
    pthread_cond_init(&w->mail_cv, NULL);
    *out = w;
    return CFX_OK;
}

void cx_local_world_release(cx_local_world *w)
{
    if (!w || atomic_fetch_sub(&w->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mail_mu);
    pthread_cond_destroy(&w->mail_cv);
    free(w->mail);
    free(w->slots);
    free(w);
}

static cx_local_world *world_of(cx_transport *t) { return ((local_transport *)t)->world; }

static void barrier(cx_local_world *w)
{
    pthread_mutex_lock(&w->mu);
    unsigned long gen = w->generation;
    if (++w->arrived == w->size) {
        w->arrived = 0;
        w->generation++;
        pthread_cond_broadcast(&w->cv);
    } else {
        while (gen == w->generation)
            pthread_cond_wait(&w->cv, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Publishes this rank's slot and waits until every rank has published. */
static local_slot *publish(cx_transport *t, local_slot slot)
{
    cx_local_world *w = world_of(t);
    w->slots[t->rank] = slot;
    barrier(w);
    return w->slots;
}

static cfx_status local_gather_bytes(cx_transport *t, const void *send, size_t len, void **recv_out,
                                     size_t *lens_out)
{
    local_slot *s = publish(t, (local_slot){.send = send, .len = len});
    cfx_status st = CFX_OK;
    *recv_out = NULL;
    if (t->rank == 0) {
        size_t total = 0;
        for (int r = 0; r < t->size; r++)
            total += s[r].len;
        char *buf = malloc(total ? total : 1);
        if (!buf) {
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory gathering %zu bytes", total);
        } else {
            size_t off = 0;
            for (int r = 0; r < t->size; r++) {
                if (s[r].len)
                    memcpy(buf + off, s[r].send, s[r].len);
                lens_out[r] = s[r].len;
                off += s[r].len;
            }
            *recv_out = buf;
        }
    }
    barrier(world_of(t));
    return st;
}

static cfx_status local_bcast_bytes(cx_transport *t, void **buf, size_t *len, int root)
{
    local_slot *s = publish(t, (local_slot){.send = *buf, .len = *len});
    cfx_status st = CFX_OK;
    if (t->rank != root) {
        size_t n = s[root].len;
        void *copy = malloc(n ? n : 1);
        if (!copy) {
            st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory receiving %zu bytes", n);
        } else {
            if (n)
                memcpy(copy, s[root].send, n);
            *buf = copy;
            *len = n;
        }
    }
    barrier(world_of(t));
    return st;
}

static cfx_status local_allreduce_and(cx_transport *t, uint64_t *words, size_t count)
{
    uint64_t stack[64];
    uint64_t *acc = count <= 64 ? stack : malloc(count * sizeof *acc);
    local_slot *s = publish(t, (local_slot){.send = words, .len = count});
    if (acc) {
        for (size_t i = 0; i < count; i++) {
            uint64_t v = ~0ull;
            for (int r = 0; r < t->size; r++)
                v &= ((const uint64_t *)s[r].send)[i];
            acc[i] = v;
        }
    }
    barrier(world_of(t));
    if (!acc)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a %zu-word bit vector", count);
    memcpy(words, acc, count * sizeof *acc);
    if (acc != stack)
        free(acc);
    return CFX_OK;
}

/* Every rank computes the whole reduction in rank order into a private buffer, so all ranks hold
 * bitwise the same result. */
static cfx_status local_allreduce(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                  cfx_reduce_op op)
{
    size_t bytes = count * cfx_dtype_size(dtype);
    local_transport *lt = (local_transport *)t;
    if (lt->acc_cap < bytes || !lt->acc) {
        free(lt->acc);
        lt->acc_cap = bytes > 4096 ? bytes : 4096;
        if (!(lt->acc = malloc(lt->acc_cap)))
            lt->acc_cap = 0;
    }
    void *acc = lt->acc;
    local_slot *s = publish(t, (local_slot){.send = buf, .len = bytes});
    if (acc) {
        memcpy(acc, s[0].send, bytes);
        for (int r = 1; r < t->size; r++)
            cx_reduce_into(acc, s[r].send, count, dtype, op);
    }
    barrier(world_of(t));
    if (!acc)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte reduction", bytes);
    memcpy(buf, acc, bytes);
    return CFX_OK;
}

static cfx_status local_allgatherv(cx_transport *t, const void *send, size_t send_bytes, void *recv,
                                   const size_t *recv_bytes, const size_t *displs)
{
    local_slot *s = publish(t, (local_slot){.send = send, .len = send_bytes});
    cfx_status st = CFX_OK;
    for (int r = 0; r < t->size; r++) {
        if (s[r].len != recv_bytes[r]) {
            st = cx_fail(CFX_ERR_INTERNAL, "allgatherv: rank %d sent %zu bytes, %zu expected", r,
                         s[r].len, recv_bytes[r]);
            continue;
        }
        if (s[r].len)
            memcpy((char *)recv + displs[r], s[r].send, s[r].len);
    }
    barrier(world_of(t));
    return st;
}

static cfx_status local_broadcast(cx_transport *t, void *buf, size_t bytes, int root)
{
    local_slot *s = publish(t, (local_slot){.send = buf, .len = bytes});
    cfx_status st = CFX_OK;
    if (t->rank != root) {
        if (s[root].len != bytes)
            st = cx_fail(CFX_ERR_INTERNAL, "broadcast: root has %zu bytes, this rank %zu",
                         s[root].len, bytes);
        else if (bytes)
            memcpy(buf, s[root].send, bytes);
    }
    barrier(world_of(t));
    return st;
}

static cfx_status local_alltoallv(cx_transport *t, const void *send, const size_t *send_bytes,
                                  const size_t *sdispls, void *recv, const size_t *recv_bytes,
                                  const size_t *rdispls)
{
    local_slot *s = publish(t, (local_slot){.send = send, .a = send_bytes, .b = sdispls});
    cfx_status st = CFX_OK;
    for (int j = 0; j < t->size; j++) {
        size_t n = s[j].a[t->rank];
        if (n != recv_bytes[j]) {
            st = cx_fail(CFX_ERR_INTERNAL, "alltoallv: rank %d sends %zu bytes to rank %d, %zu "
                         "expected", j, n, t->rank, recv_bytes[j]);
            continue;
        }
        if (n)
            memcpy((char *)recv + rdispls[j], (const char *)s[j].send + s[j].b[t->rank], n);
    }
    barrier(world_of(t));
    return st;
}

static cfx_status local_reduce_scatter(cx_transport *t, const void *send, void *recv,
                                       const size_t *counts, cfx_dtype dtype, cfx_reduce_op op)
{
    size_t esize = cfx_dtype_size(dtype);
    size_t off = 0;
    for (int r = 0; r < t->rank; r++)
        off += counts[r];
    size_t n = counts[t->rank];
    local_slot *s = publish(t, (local_slot){.send = send});
    if (n) {
        memcpy(recv, (const char *)s[0].send + off * esize, n * esize);
        for (int r = 1; r < t->size; r++)
            cx_reduce_into(recv, (const char *)s[r].send + off * esize, n, dtype, op);
    }
    barrier(world_of(t));
    return CFX_OK;
}

static cfx_status local_barrier(cx_transport *t)
{
    barrier(world_of(t));
    return CFX_OK;
}

/* One host and one rank per cross group: local ranks are the job's ranks, cross rank 0 is this
 * rank. The copy is made by the receiver, outside the lock, while the sender waits. */
static cfx_status local_sendrecv(cx_transport *t, cx_group group, const void *send,
                                 size_t send_bytes, int to, void *recv, size_t recv_bytes, int from)
{
    cx_local_world *w = world_of(t);
    int me = t->rank, n = w->size;
    if (group == CX_GROUP_CROSS) {
        to = to < 0 ? -1 : to == 0 ? me : n;
        from = from < 0 ? -1 : from == 0 ? me : n;
    }
    if (to >= n || from >= n)
        return cx_fail(CFX_ERR_INTERNAL, "sendrecv: rank %d is outside the local world of %d",
                       to >= n ? to : from, n);
    if (to == me && from == me) {
        if (send_bytes != recv_bytes)
            return cx_fail(CFX_ERR_INTERNAL, "sendrecv: rank %d sends itself %zu bytes, %zu "
                           "expected", me, send_bytes, recv_bytes);
        memmove(recv, send, send_bytes);
        return CFX_OK;
    }
    cfx_status st = CFX_OK;
    local_mail *out = to >= 0 ? &w->mail[(size_t)me * (size_t)n + (size_t)to] : NULL;
    local_mail *in = from >= 0 ? &w->mail[(size_t)from * (size_t)n + (size_t)me] : NULL;
    pthread_mutex_lock(&w->mail_mu);
    if (out) {
        while (out->state != 0)
            pthread_cond_wait(&w->mail_cv, &w->mail_mu);
        out->data = send;
        out->len = send_bytes;
        out->state = 1;
        pthread_cond_broadcast(&w->mail_cv);
    }
    if (in) {
        while (in->state != 1)
            pthread_cond_wait(&w->mail_cv, &w->mail_mu);
        in->state = 2;
        pthread_mutex_unlock(&w->mail_mu);
        if (in->len != recv_bytes)
            st = cx_fail(CFX_ERR_INTERNAL, "sendrecv: rank %d sent %zu bytes to rank %d, %zu "
                         "expected", from, in->len, me, recv_bytes);
        else if (recv_bytes)
            memcpy(recv, in->data, recv_bytes);
        pthread_mutex_lock(&w->mail_mu);
        in->state = 0;
        pthread_cond_broadcast(&w->mail_cv);
    }
    while (out && out->state != 0) /* taken: the sender's buffer may be reused */
        pthread_cond_wait(&w->mail_cv, &w->mail_mu);
    pthread_mutex_unlock(&w->mail_mu);
    return st;
}

static void local_destroy(cx_transport *t)
{
    free(((local_transport *)t)->acc);
    cx_local_world_release(world_of(t));
    free(t);
}

static cfx_status local_split(cx_transport *t, const int *ranks, size_t n, cx_transport **out)
{
    local_transport *lt = (local_transport *)t;
    cx_local_world *w = lt->world;
    unsigned long seq = lt->splits++;
    *out = NULL;
    int me = -1;
    for (size_t i = 0; i < n; i++)
        if (ranks[i] == t->rank)
            me = (int)i;
    if (me < 0)
        return CFX_OK;
    /* The first member to arrive makes the child world; the last one to take it unlists it. */
    pthread_mutex_lock(&w->mu);
    local_child **link = &w->children;
    while (*link && (*link)->seq != seq)
        link = &(*link)->next;
    cfx_status st = CFX_OK;
    if (!*link) {
        local_child *c = calloc(1, sizeof *c);
        if (!c || (st = cx_local_world_create((int)n, &c->world))) {
            free(c);
            pthread_mutex_unlock(&w->mu);
            return st ? st : cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory splitting a local world");
        }
        c->seq = seq;
        c->next = w->children;
        w->children = c;
        link = &w->children;
    }
    local_child *c = *link;
    st = cx_transport_local_create(c->world, me, out);
    if (++c->taken == (int)n) {
        *link = c->next;
        cx_local_world_release(c->world); /* the members' transports keep it */
        free(c);
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

static const cx_transport_ops local_ops = {
    .name = "local",
    /* Thread ranks already share memory: no segment to add. Calls wait for the peer threads. */
    .caps = {.prefers_host_shm = false, .aborts_in_flight = false,
             .optional = CX_TRANSPORT_SPLIT | CX_TRANSPORT_SENDRECV},
    .gather_bytes = local_gather_bytes,
    .bcast_bytes = local_bcast_bytes,
    .allreduce_and = local_allreduce_and,
    .allreduce = local_allreduce,
    .sendrecv = local_sendrecv,
    .allgatherv = local_allgatherv,
    .broadcast = local_broadcast,
    .alltoallv = local_alltoallv,
    .reduce_scatter = local_reduce_scatter,
    .barrier = local_barrier,
    .split = local_split,
    .destroy = local_destroy,
};

cfx_status cx_transport_local_create(cx_local_world *w, int rank, cx_transport **out)
{
    if (rank < 0 || rank >= w->size)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "rank %d is outside the local world of %d", rank,
                       w->size);
    local_transport *lt = calloc(1, sizeof *lt);
    if (!lt)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a local transport");
    atomic_fetch_add(&w->refs, 1);
    lt->world = w;
    lt->base.ops = &local_ops;
    lt->base.rank = rank;
    lt->base.size = w->size;
    lt->base.local_rank = rank;
    lt->base.local_size = w->size;
    lt->base.cross_rank = 0;
    lt->base.cross_size = 1;
    *out = &lt->base;
    return CFX_OK;
}

cfx_status cx_transport_local_open(const cx_transport_params *p, cx_transport **out)
{
    *out = NULL;
    if (p->store)
        cx_store_destroy(p->store);
    if (p->size > 1)
        return cx_fail(CFX_ERR_CONFIG, "the local transport's ranks are threads of one process: a "
                       "process on its own is a world of one, not rank %d of %d (use mpirun, or a "
                       "launcher over Gloo)", p->rank, p->size);
    cx_local_world *w;
    cfx_status st = cx_local_world_create(1, &w);
    if (st)
        return st;
    st = cx_transport_local_create(w, 0, out);
    cx_local_world_release(w);
    return st;
}
