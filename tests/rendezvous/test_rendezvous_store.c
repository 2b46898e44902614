/*
 * test_rendezvous_store - the rendezvous stores (TCP, file, callbacks, prefixed views) and the
 * launcher detection, in one process: set/get/wait, a key set late by another thread, deadline
 * expiry (CFX_ERR_TIMEOUT naming the key), a taken port, a foreign server, the discovery order and
 * the meeting place each launcher's variables give.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "base/error.h"
#include "base/launch_env.h"
#include "rendezvous/store.h"

/* A port nothing listens on right now (the kernel's choice for port 0). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static cfx_status tcp_store(const char *host, int port, int serve, unsigned generation,
                            double timeout_s, cx_store **out)
{
    return cx_store_tcp_create(&(cx_tcp_store_params){.host = host, .port = port, .serve = serve,
                                                      .generation = generation,
                                                      .timeout_s = timeout_s},
                               out);
}

static void expect_stored(cx_store *s, const char *key, const char *want)
{
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(cx_store_get(s, key, 5.0, &data, &len), CFX_OK);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(data, want, len);
    free(data);
}

static void expect_timeout_naming(cx_store *s, const char *key)
{
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(cx_store_get(s, key, 0.2, &data, &len), CFX_ERR_TIMEOUT);
    assert_non_null(strstr(cx_error_message(), key));
    assert_null(data);
}

typedef struct late_set {
    cx_store *store;
    const char *key, *value;
} late_set;

static void *set_later(void *p)
{
    late_set *l = p;
    struct timespec pause = {0, 150 * 1000000L};
    nanosleep(&pause, NULL);
    cx_store_set(l->store, l->key, l->value, strlen(l->value));
    return NULL;
}

/* What every store must do: set/get, a value set while another waits, a missing key's deadline,
 * binary values with NUL bytes, the prefixed view's own key space. */
static void exercise(cx_store *a, cx_store *b)
{
    assert_int_equal(cx_store_set(a, "alpha", "one", 3), CFX_OK);
    expect_stored(b, "alpha", "one");
    late_set l = {a, "later/key", "arrived"};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, set_later, &l), 0);
    expect_stored(b, "later/key", "arrived");
    pthread_join(th, NULL);
    expect_timeout_naming(b, "never-set-key");
    const char bin[5] = {1, 0, 2, 0, 3};
    assert_int_equal(cx_store_set(a, "binary", bin, sizeof bin), CFX_OK);
    void *data = NULL;
    size_t len = 0;
    assert_int_equal(cx_store_get(b, "binary", 1.0, &data, &len), CFX_OK);
    assert_int_equal(len, sizeof bin);
    assert_memory_equal(data, bin, sizeof bin);
    free(data);
    cx_store *pa, *pb;
    assert_int_equal(cx_store_prefixed(a, "ctx7", 0, &pa), CFX_OK);
    assert_int_equal(cx_store_prefixed(b, "ctx7", 0, &pb), CFX_OK);
    assert_int_equal(cx_store_set(pa, "alpha", "seven", 5), CFX_OK);
    expect_stored(pb, "alpha", "seven");
    expect_stored(b, "ctx7/alpha", "seven");
    expect_stored(b, "alpha", "one"); /* the unprefixed key is untouched */
    const char *both[2] = {"alpha", "binary"};
    assert_int_equal(cx_store_wait(b, both, 2, 1.0), CFX_OK);
    const char *one_missing[2] = {"alpha", "missing-too"};
    assert_int_equal(cx_store_wait(pb, one_missing, 2, 0.2), CFX_ERR_TIMEOUT);
    assert_non_null(strstr(cx_error_message(), "ctx7/missing-too"));
    cx_store_destroy(pa);
    cx_store_destroy(pb);
}

/* set_once: the first value stays, through b and through prefixed views alike; set overwrites. */
static void exercise_once(cx_store *a, cx_store *b)
{
    assert_int_equal(cx_store_set_once(a, "decision", "first", 5), CFX_OK);
    assert_int_equal(cx_store_set_once(b, "decision", "second", 6), CFX_OK);
    expect_stored(a, "decision", "first");
    expect_stored(b, "decision", "first");
    cx_store *pb;
    assert_int_equal(cx_store_prefixed(b, "ctx8", 0, &pb), CFX_OK);
    assert_int_equal(cx_store_set_once(pb, "decision", "view", 4), CFX_OK);
    assert_int_equal(cx_store_set_once(a, "ctx8/decision", "other", 5), CFX_OK);
    expect_stored(a, "ctx8/decision", "view");
    cx_store_destroy(pb);
    assert_int_equal(cx_store_set(a, "beat", "1", 1), CFX_OK);
    assert_int_equal(cx_store_set(b, "beat", "2", 1), CFX_OK);
    expect_stored(a, "beat", "2");
}

static void test_file_store(void **state)
{
    (void)state;
    char dir[] = "/tmp/cfx-store-XXXXXX";
    assert_non_null(mkdtemp(dir));
    cx_store *a, *b;
    assert_int_equal(cx_store_file_create(dir, &a), CFX_OK);
    assert_int_equal(cx_store_file_create(dir, &b), CFX_OK);
    exercise(a, b);
    exercise_once(a, b);
    cx_store_destroy(a);
    cx_store_destroy(b);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_file_store_bad_dir(void **state)
{
    (void)state;
    cx_store *s = NULL;
    assert_int_equal(cx_store_file_create("/proc/no/such/dir", &s), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "/proc/no/such/dir"));
}

static void test_tcp_store(void **state)
{
    (void)state;
    int port = free_port();
    cx_store *server, *client;
    assert_int_equal(tcp_store("127.0.0.1", port, 1, 1, 5.0, &server), CFX_OK);
    assert_int_equal(tcp_store("localhost", port, 0, 1, 5.0, &client), CFX_OK);
    assert_string_equal(server->local_addr, "127.0.0.1");
    exercise(server, client);
    exercise(client, server); /* the other direction */
    exercise_once(client, server);
    cx_store_destroy(client);
    cx_store_destroy(server);
}

/* Interrupting a view that borrows its store (an elastic world's transport, over the job's
 * membership store) leaves the store working; a view that owns its store interrupts it. */
static void test_tcp_interrupt_through_views(void **state)
{
    (void)state;
    int port = free_port();
    cx_store *server, *shared, *owned, *borrowed_view, *owning_view;
    assert_int_equal(tcp_store("127.0.0.1", port, 1, 1, 5.0, &server), CFX_OK);
    assert_int_equal(tcp_store("127.0.0.1", port, 0, 1, 5.0, &shared), CFX_OK);
    assert_int_equal(tcp_store("127.0.0.1", port, 0, 1, 5.0, &owned), CFX_OK);
    assert_int_equal(cx_store_prefixed(shared, "r1", 0, &borrowed_view), CFX_OK);
    assert_int_equal(cx_store_prefixed(owned, "r1", 1, &owning_view), CFX_OK);
    cx_store_interrupt(borrowed_view);
    assert_int_equal(cx_store_set(shared, "after", "yes", 3), CFX_OK);
    expect_stored(server, "after", "yes");
    cx_store_interrupt(owning_view);
    assert_int_equal(cx_store_set(owning_view, "later", "no", 2), CFX_ERR_PEER_LOST);
    cx_store_destroy(owning_view);
    cx_store_destroy(borrowed_view);
    cx_store_destroy(shared);
    cx_store_destroy(server);
}

/* A client started before the server keeps connecting until the server is up. */
typedef struct late_server {
    int port;
    cx_store *store;
} late_server;

static void *serve_later(void *p)
{
    late_server *l = p;
    struct timespec pause = {0, 300 * 1000000L};
    nanosleep(&pause, NULL);
    if (tcp_store("127.0.0.1", l->port, 1, 1, 5.0, &l->store) != CFX_OK)
        l->store = NULL;
    return NULL;
}

static void test_tcp_client_before_server(void **state)
{
    (void)state;
    late_server l = {free_port(), NULL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, serve_later, &l), 0);
    cx_store *client;
    assert_int_equal(tcp_store("127.0.0.1", l.port, 0, 1, 10.0, &client), CFX_OK);
    pthread_join(th, NULL);
    assert_non_null(l.store);
    assert_int_equal(cx_store_set(client, "k", "v", 1), CFX_OK);
    expect_stored(l.store, "k", "v");
    cx_store_destroy(client);
    cx_store_destroy(l.store);
}

static void test_tcp_no_server_times_out(void **state)
{
    (void)state;
    int port = free_port();
    cx_store *client = NULL;
    assert_int_equal(tcp_store("127.0.0.1", port, 0, 1, 0.3, &client), CFX_ERR_TIMEOUT);
    char want[32];
    snprintf(want, sizeof want, "127.0.0.1:%d", port);
    assert_non_null(strstr(cx_error_message(), want));
}

/* Another program's listener on a port of the kernel's choice (all addresses, or loopback): it
 * accepts into its backlog and never greets. */
static int foreign_listener(uint32_t addr, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(addr)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 4), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static void test_tcp_port_taken(void **state)
{
    (void)state;
    int port, fd = foreign_listener(INADDR_ANY, &port);
    cx_store *s = NULL;
    assert_int_equal(tcp_store("127.0.0.1", port, 1, 1, 1.0, &s), CFX_ERR_CONFIG);
    char want[32];
    snprintf(want, sizeof want, "port %d", port);
    assert_non_null(strstr(cx_error_message(), want));
    assert_non_null(strstr(cx_error_message(), "CFX_RENDEZVOUS_PORT"));
    /* A client reaching that listener (not a Conflux store: it never greets) times out or is told
     * it reached something else; it never takes it for a store. */
    close(fd);
}

/* A derived port may be held by another program and by another job's store: the server takes the
 * next free port of its range, and a client trying the range finds its own job's store by the
 * token (a key set through one is read through the other), never the other job's. */
static void test_tcp_port_range_finds_own_job(void **state)
{
    (void)state;
    int port, fd = foreign_listener(INADDR_ANY, &port);
    cx_tcp_store_params job_a = {.host = "127.0.0.1", .port = port, .port_span = 8,
                                 .job_token = "job a", .serve = 1, .generation = 1,
                                 .timeout_s = 5.0};
    cx_tcp_store_params job_b = job_a;
    job_b.job_token = "job b";
    cx_store *server_a, *server_b, *client_b, *client_a;
    assert_int_equal(cx_store_tcp_create(&job_a, &server_a), CFX_OK);
    assert_int_equal(cx_store_tcp_create(&job_b, &server_b), CFX_OK);
    assert_string_not_equal(server_a->where, server_b->where);
    assert_null(strstr(server_a->where, "port"));
    job_a.serve = job_b.serve = 0;
    assert_int_equal(cx_store_tcp_create(&job_b, &client_b), CFX_OK);
    assert_int_equal(cx_store_tcp_create(&job_a, &client_a), CFX_OK);
    assert_int_equal(cx_store_set(server_a, "whose", "a", 1), CFX_OK);
    assert_int_equal(cx_store_set(server_b, "whose", "b", 1), CFX_OK);
    expect_stored(client_a, "whose", "a");
    expect_stored(client_b, "whose", "b");
    /* A third job finds no store of its own within the deadline, and says where it looked. */
    cx_tcp_store_params job_c = job_a;
    cx_store *client_c = NULL;
    job_c.job_token = "job c";
    job_c.timeout_s = 0.3;
    assert_int_equal(cx_store_tcp_create(&job_c, &client_c), CFX_ERR_TIMEOUT);
    char want[48];
    snprintf(want, sizeof want, "127.0.0.1:%d-%d", port, port + 7);
    assert_non_null(strstr(cx_error_message(), want));
    assert_non_null(strstr(cx_error_message(), "another job's Conflux store answers"));
    cx_store_destroy(client_a);
    cx_store_destroy(client_b);
    cx_store_destroy(server_b);
    cx_store_destroy(server_a);
    close(fd);
}

/* A server that answers with something other than the greeting. */
static void *foreign_server(void *p)
{
    int fd = *(int *)p;
    int c = accept(fd, NULL, NULL);
    if (c >= 0) {
        const char junk[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
        ssize_t w = write(c, junk, sizeof junk - 1);
        (void)w;
        struct timespec pause = {0, 200 * 1000000L};
        nanosleep(&pause, NULL);
        close(c);
    }
    return NULL;
}

static void test_tcp_foreign_server(void **state)
{
    (void)state;
    int port, fd = foreign_listener(INADDR_LOOPBACK, &port);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, foreign_server, &fd), 0);
    cx_store *s = NULL;
    assert_int_equal(tcp_store("127.0.0.1", port, 0, 1, 2.0, &s),
                     CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "something other than a Conflux store"));
    pthread_join(th, NULL);
    close(fd);
}

/* ---- the store handed in as callbacks: a small table, as a Python Store adapter would be ---- */

typedef struct table {
    pthread_mutex_t mu;
    char keys[64][128];
    char values[64][64];
    size_t lens[64];
    int n;
} table;

static int find_key(table *t, const char *key)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->keys[i], key))
            return i;
    return -1;
}

static int table_set(void *user, const char *key, const void *data, size_t len)
{
    table *t = user;
    if (len > sizeof t->values[0])
        return 1;
    pthread_mutex_lock(&t->mu);
    int i = find_key(t, key);
    if (i < 0)
        i = t->n++;
    snprintf(t->keys[i], sizeof t->keys[i], "%s", key);
    if (len)
        memcpy(t->values[i], data, len);
    t->lens[i] = len;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static int table_get(void *user, const char *key, void *buf, size_t cap, size_t *len)
{
    table *t = user;
    pthread_mutex_lock(&t->mu);
    int i = find_key(t, key);
    if (i >= 0) {
        *len = t->lens[i];
        memcpy(buf, t->values[i], t->lens[i] < cap ? t->lens[i] : cap);
    }
    pthread_mutex_unlock(&t->mu);
    return i < 0 ? 2 : 0;
}

static int table_wait(void *user, const char *const *keys, size_t n, double timeout_s)
{
    table *t = user;
    for (double waited = 0;; waited += 0.01) {
        size_t found = 0;
        pthread_mutex_lock(&t->mu);
        for (size_t k = 0; k < n; k++)
            found += find_key(t, keys[k]) >= 0;
        pthread_mutex_unlock(&t->mu);
        if (found == n)
            return 0;
        if (waited >= timeout_s)
            return 1;
        struct timespec pause = {0, 10 * 1000000L};
        nanosleep(&pause, NULL);
    }
}

static void test_callback_store(void **state)
{
    (void)state;
    table t = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cfx_store_callbacks cb = {CFX_STORE_CALLBACKS_VERSION, &t, table_set, table_get, table_wait};
    cx_store *a, *b;
    assert_int_equal(cx_store_from_callbacks(&cb, &a), CFX_OK);
    assert_int_equal(cx_store_from_callbacks(&cb, &b), CFX_OK);
    exercise(a, b);
    /* The callbacks have no compare-and-set: set_once says so rather than overwriting. */
    assert_int_equal(cx_store_set_once(a, "decision", "first", 5), CFX_ERR_UNSUPPORTED);
    assert_non_null(strstr(cx_error_message(), "once"));
    cx_store_destroy(a);
    cx_store_destroy(b);
    cfx_store_callbacks missing = cb;
    missing.wait = NULL;
    assert_int_equal(cx_store_from_callbacks(&missing, &a), CFX_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(cx_error_message(), "wait"));
}

/* ---- launcher detection, through a lookup table instead of the process environment ---------- */

typedef struct vars {
    const char *pairs[40];
} vars;

static const char *lookup(const char *name, void *user)
{
    vars *v = user;
    for (int i = 0; v->pairs[i]; i += 2)
        if (!strcmp(v->pairs[i], name))
            return v->pairs[i + 1];
    return NULL;
}

static void test_launch_torchrun(void **state)
{
    (void)state;
    vars v = {{"RANK", "1", "WORLD_SIZE", "4", "LOCAL_RANK", "1", "LOCAL_WORLD_SIZE", "2",
               "MASTER_ADDR", "node7", "MASTER_PORT", "29500", NULL}};
    cx_launch l;
    assert_int_equal(cx_launch_detect(&l, lookup, &v), CFX_OK);
    assert_int_equal(l.launcher, CX_LAUNCHER_TORCHRUN);
    assert_int_equal(l.rank, 1);
    assert_int_equal(l.size, 4);
    assert_int_equal(l.local_size, 2);
    assert_string_equal(l.store_host, "node7");
    assert_int_equal(l.store_port, 29501); /* never torch's own MASTER_PORT */
    assert_true(l.store_port_span > 1);      /* a derived port may be taken */
    assert_non_null(strstr(l.store_token, "node7:29500"));
    assert_string_equal(l.missing, "");
    vars own = {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "29500",
                 "CFX_RENDEZVOUS_PORT", "31000", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &own), CFX_OK);
    assert_int_equal(l.store_port, 31000);
    assert_true(l.store_port_span <= 1); /* a chosen port is the port */
    assert_string_equal(l.store_token, "");
    vars clash = {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "29500",
                   "CFX_RENDEZVOUS_PORT", "29500", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &clash), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "MASTER_PORT"));
    vars no_addr = {{"RANK", "0", "WORLD_SIZE", "2", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &no_addr), CFX_OK);
    assert_non_null(strstr(l.missing, "MASTER_ADDR"));
    vars bad = {{"RANK", "2", "WORLD_SIZE", "2", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &bad), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "RANK=2"));
    assert_non_null(strstr(cx_error_message(), "WORLD_SIZE=2"));
    vars junk = {{"RANK", "one", "WORLD_SIZE", "2", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &junk), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "RANK=\"one\""));
}

static void test_launch_order_and_sources(void **state)
{
    (void)state;
    cx_launch l;
    /* CFX_* first, then Open MPI, then torchrun. */
    vars all = {{"CFX_RANK", "2", "CFX_SIZE", "3", "CFX_RENDEZVOUS_ADDR", "10.1.2.3:4000",
                 "OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "5", "RANK", "1",
                 "WORLD_SIZE", "7", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &all), CFX_OK);
    assert_int_equal(l.launcher, CX_LAUNCHER_CFX);
    assert_int_equal(l.rank, 2);
    assert_int_equal(l.size, 3);
    assert_string_equal(l.store_host, "10.1.2.3");
    assert_int_equal(l.store_port, 4000);
    assert_int_equal(l.mpi_launch, 1);
    vars mpi = {{"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "5", "RANK", "1",
                 "WORLD_SIZE", "7", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &mpi), CFX_OK);
    assert_int_equal(l.launcher, CX_LAUNCHER_OPENMPI);
    assert_int_equal(l.size, 5);
    vars slurm = {{"SLURM_PROCID", "3", "SLURM_NTASKS", "4", "SLURM_LOCALID", "1",
                   "SLURM_STEP_NODELIST", "node[03-05],gpu1", "SLURM_JOB_ID", "1234",
                   "SLURM_STEP_ID", "0", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &slurm), CFX_OK);
    assert_int_equal(l.launcher, CX_LAUNCHER_SLURM);
    assert_string_equal(l.store_host, "node03");
    assert_int_equal(l.store_port, 20000 + (1234 * 31) % 20000);
    vars horovod = {{"HOROVOD_RANK", "0", "HOROVOD_SIZE", "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                     "h", "HOROVOD_GLOO_RENDEZVOUS_PORT", "1234", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &horovod), CFX_OK);
    assert_int_equal(l.launcher, CX_LAUNCHER_HOROVOD);
    assert_non_null(strstr(l.missing, "HOROVOD_GLOO_RENDEZVOUS_ADDR"));
    vars horovod_dir = {{"HOROVOD_RANK", "1", "HOROVOD_SIZE", "2", "CFX_RENDEZVOUS_DIR",
                         "/shared/rdv", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &horovod_dir), CFX_OK);
    assert_string_equal(l.missing, "");
    assert_string_equal(l.store_dir, "/shared/rdv");
    vars none = {{NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &none), CFX_OK);
    assert_int_equal(l.launcher, CX_LAUNCHER_NONE);
    vars bad_addr = {{"CFX_RANK", "0", "CFX_SIZE", "2", "CFX_RENDEZVOUS_ADDR", "nohostport", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &bad_addr), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_RENDEZVOUS_ADDR=\"nohostport\""));
    vars half = {{"CFX_RANK", "0", "CFX_RENDEZVOUS_ADDR", "h:1", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &half), CFX_OK);
    assert_non_null(strstr(l.missing, "CFX_SIZE"));
}

static void test_launch_scope(void **state)
{
    (void)state;
    cx_launch l;
    vars none = {{"CFX_RANK", "0", "CFX_SIZE", "2", "CFX_RENDEZVOUS_ADDR", "h:1", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &none), CFX_OK);
    assert_string_equal(l.store_scope, "");
    vars scoped = {{"CFX_RANK", "0", "CFX_SIZE", "2", "CFX_RENDEZVOUS_ADDR", "h:1",
                    "CFX_RENDEZVOUS_SCOPE", "ray.run-7_b", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &scoped), CFX_OK);
    assert_string_equal(l.store_scope, "ray.run-7_b");
    vars slash = {{"CFX_RANK", "0", "CFX_SIZE", "2", "CFX_RENDEZVOUS_SCOPE", "run/7", NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &slash), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_RENDEZVOUS_SCOPE is \"run/7\""));
    assert_non_null(strstr(cx_error_message(), "character 4 ('/')"));
    char long_name[100];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    vars too_long = {{"CFX_RANK", "0", "CFX_SIZE", "2", "CFX_RENDEZVOUS_SCOPE", long_name, NULL}};
    assert_int_equal(cx_launch_detect(&l, lookup, &too_long), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "99 characters long; at most 63"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_store),
        cmocka_unit_test(test_file_store_bad_dir),
        cmocka_unit_test(test_tcp_store),
        cmocka_unit_test(test_tcp_interrupt_through_views),
        cmocka_unit_test(test_tcp_client_before_server),
        cmocka_unit_test(test_tcp_no_server_times_out),
        cmocka_unit_test(test_tcp_port_taken),
        cmocka_unit_test(test_tcp_port_range_finds_own_job),
        cmocka_unit_test(test_tcp_foreign_server),
        cmocka_unit_test(test_callback_store),
        cmocka_unit_test(test_launch_torchrun),
        cmocka_unit_test(test_launch_order_and_sources),
        cmocka_unit_test(test_launch_scope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
