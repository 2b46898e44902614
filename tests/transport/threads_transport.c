/*
 * threads_transport - a transport added the way docs/architecture.md "Adding a transport" says:
 * this file and one line of the registry (transport/registry.c; this test's CMakeLists.txt adds
 * the line to a copy of it), nothing else. It is the local transport's thread ranks under another
 * name ("threads") that meet through a store: rank 0 makes the world of thread ranks and publishes
 * where it is; the others, threads of the same process, find it there. So CFX_TRANSPORT=threads
 * selects it, cfx_features reports its bit, the handshake names it, and membership rounds form its
 * worlds (it meets through a store, and its entry says CX_ENTRY_ELASTIC).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "rendezvous/store.h"
#include "transport/transport.h"
#include "transport/transport_local.h"

cx_transport_create_fn cx_transport_threads_create;

/* The world rank 0 made, handed over under a lock as well as through the store: the store says
 * when it is there, the lock orders its memory for the other threads (a sanitizer sees the
 * hand-over; the store alone, a file or a socket, it cannot). */
static pthread_mutex_t published_mu = PTHREAD_MUTEX_INITIALIZER;
static cx_local_world *published;

/* The local transport's table under this transport's name, filled under published_mu by the first
 * rank to finish (every rank thread gets there at about the same time). */
static cx_transport_ops threads_ops;

cfx_status cx_transport_threads_create(const cx_transport_params *p, cx_transport **out)
{
    *out = NULL;
    cx_store *s = p->store;
    cx_local_world *w = NULL;
    char text[96];
    cfx_status st = CFX_OK;
    if (p->rank == 0) {
        if (!(st = cx_local_world_create(p->size, &w))) {
            pthread_mutex_lock(&published_mu);
            published = w;
            pthread_mutex_unlock(&published_mu);
            snprintf(text, sizeof text, "%d %p", (int)getpid(), (void *)w);
            st = cx_store_set(s, "threads/world", text, strlen(text));
        }
    } else {
        void *data = NULL;
        size_t len = 0;
        st = cx_store_get(s, "threads/world", p->rendezvous_s, &data, &len);
        int pid = 0;
        void *at = NULL;
        if (!st) {
            snprintf(text, sizeof text, "%.*s", (int)(len < sizeof text ? len : sizeof text - 1),
                     (const char *)data);
            if (sscanf(text, "%d %p", &pid, &at) != 2 || pid != (int)getpid())
                st = cx_fail(CFX_ERR_CONFIG, "the threads transport's ranks are threads of one "
                             "process, and rank 0 is in process %d", pid);
        }
        free(data);
        if (!st) {
            pthread_mutex_lock(&published_mu);
            w = published;
            pthread_mutex_unlock(&published_mu);
            if (w != at)
                st = cx_fail(CFX_ERR_INTERNAL, "the threads transport's world moved");
        }
    }
    cx_transport *t = NULL;
    if (!st)
        st = cx_transport_local_create(w, p->rank, &t); /* its own reference on the world */
    char key[64];
    snprintf(key, sizeof key, "threads/joined/%d", p->rank);
    if (!st)
        st = cx_store_set(s, key, "1", 1);
    if (!st && p->rank == 0) { /* the creator's reference goes once every rank holds its own */
        for (int r = 1; !st && r < p->size; r++) {
            snprintf(key, sizeof key, "threads/joined/%d", r);
            const char *keys[] = {key};
            st = cx_store_wait(s, keys, 1, p->rendezvous_s);
        }
    }
    if (p->rank == 0 && w)
        cx_local_world_release(w);
    cx_store_destroy(s);
    if (st) {
        if (t)
            t->ops->destroy(t);
        return st;
    }
    pthread_mutex_lock(&published_mu);
    if (!threads_ops.name) {
        threads_ops = *t->ops;
        threads_ops.name = "threads";
    }
    pthread_mutex_unlock(&published_mu);
    t->ops = &threads_ops;
    *out = t;
    return CFX_OK;
}
