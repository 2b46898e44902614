/*
 * test_rendezvous_init - never a silent world of one: cfx_init in a process whose environment shows
 * a launcher's world of more than one rank either joins it or fails with a message naming the
 * launcher and what is missing. Public ABI only; each case sets the variables a launcher would.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "conflux/conflux.h"

static const char *const launcher_vars[] = {
    "CFX_RANK", "CFX_SIZE", "CFX_LOCAL_RANK", "CFX_LOCAL_SIZE", "CFX_RENDEZVOUS_ADDR",
    "CFX_RENDEZVOUS_DIR", "CFX_RENDEZVOUS_PORT", "CFX_TRANSPORT", "CFX_RENDEZVOUS_TIMEOUT_S",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "HOROVOD_RANK", "HOROVOD_SIZE",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", NULL};

static int clean_env(void **state)
{
    (void)state;
    for (int i = 0; launcher_vars[i]; i++)
        unsetenv(launcher_vars[i]);
    return 0;
}

/* cfx_init fails with `want`, its message holding every one of the NULL-terminated words. */
static void expect_init_fails(cfx_status want, ...)
{
    cfx_context *ctx = NULL;
    cfx_status st = cfx_init(NULL, &ctx);
    const char *msg = cfx_last_error();
    printf("cfx_init: %s: %s\n", cfx_status_string(st), msg);
    assert_int_equal(st, want);
    assert_null(ctx);
    va_list ap;
    va_start(ap, want);
    for (const char *w; (w = va_arg(ap, const char *));) {
        if (!strstr(msg, w))
            fail_msg("the message does not name \"%s\": %s", w, msg);
    }
    va_end(ap);
}

static void set_torchrun(const char *rank, const char *size)
{
    setenv("RANK", rank, 1);
    setenv("WORLD_SIZE", size, 1);
    setenv("LOCAL_RANK", rank, 1);
    setenv("LOCAL_WORLD_SIZE", size, 1);
}

static void test_torchrun_without_master_addr(void **state)
{
    (void)state;
    set_torchrun("1", "2");
    expect_init_fails(CFX_ERR_CONFIG, "torchrun", "rank 1 of 2", "MASTER_ADDR", NULL);
}

static void test_torchrun_with_mpi_asked_for(void **state)
{
    (void)state;
    set_torchrun("0", "2");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
    setenv("CFX_TRANSPORT", "mpi", 1);
    if (cfx_features() & CFX_FEATURE_MPI)
        expect_init_fails(CFX_ERR_CONFIG, "torchrun", "mpirun did not start", NULL);
    else
        expect_init_fails(CFX_ERR_UNSUPPORTED, "no MPI transport", NULL);
}

/* A complete torchrun world whose other rank never comes: a Gloo build waits for it until the
 * rendezvous deadline and says whose world it was joining; a build without Gloo refuses at once. */
static void test_torchrun_peer_never_comes(void **state)
{
    (void)state;
    set_torchrun("1", "2");
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "1", 1); /* the store takes port 2, where nothing serves */
    setenv("CFX_RENDEZVOUS_TIMEOUT_S", "0.5", 1);
    if (cfx_features() & CFX_FEATURE_GLOO)
        expect_init_fails(CFX_ERR_TIMEOUT, "torchrun", "rank 1 of 2", "127.0.0.1:2", NULL);
    else
        expect_init_fails(CFX_ERR_CONFIG, "torchrun", "no Gloo transport", NULL);
}

static void test_slurm_without_nodelist(void **state)
{
    (void)state;
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "4", 1);
    expect_init_fails(CFX_ERR_CONFIG, "Slurm", "rank 0 of 4", "SLURM_STEP_NODELIST", NULL);
}

static void test_horovod_http_rendezvous(void **state)
{
    (void)state;
    setenv("HOROVOD_RANK", "1", 1);
    setenv("HOROVOD_SIZE", "2", 1);
    setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1", 1);
    setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", "1234", 1);
    expect_init_fails(CFX_ERR_CONFIG, "Horovod", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
                      "CFX_RENDEZVOUS_ADDR", NULL);
}

static void test_cfx_vars_without_meeting_place(void **state)
{
    (void)state;
    setenv("CFX_RANK", "0", 1);
    setenv("CFX_SIZE", "3", 1);
    expect_init_fails(CFX_ERR_CONFIG, "CFX_RANK", "rank 0 of 3", "CFX_RENDEZVOUS_ADDR", NULL);
}

static void test_gloo_asked_for_without_launcher(void **state)
{
    (void)state;
    setenv("CFX_TRANSPORT", "gloo", 1);
    expect_init_fails(CFX_ERR_CONFIG, "CFX_RANK", "CFX_SIZE", NULL);
}

static void test_malformed_launcher_variable(void **state)
{
    (void)state;
    set_torchrun("3", "2");
    expect_init_fails(CFX_ERR_CONFIG, "RANK=3", "WORLD_SIZE=2", NULL);
}

/* The store handed in: a world of one rank joins through it (Gloo builds), the callbacks see
 * Conflux's keys; without Gloo the call says so. The callbacks are called from Conflux's threads
 * (its heartbeat too), so the table has a lock, as a real adapter needs. */
#define KS_KEYS 64
typedef struct key_store {
    pthread_mutex_t mu;
    int sets, n;
    char keys[KS_KEYS][256];
    char values[KS_KEYS][512];
    size_t lens[KS_KEYS];
} key_store;

static int ks_find(key_store *s, const char *key)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->keys[i], key))
            return i;
    return -1;
}

static int ks_set(void *user, const char *key, const void *data, size_t len)
{
    key_store *s = user;
    pthread_mutex_lock(&s->mu);
    int i = ks_find(s, key);
    if (i < 0 && s->n < KS_KEYS)
        i = s->n++;
    int ok = i >= 0 && len <= sizeof s->values[0] && strlen(key) < sizeof s->keys[0];
    if (ok) {
        s->sets++;
        snprintf(s->keys[i], sizeof s->keys[i], "%s", key);
        if (len)
            memcpy(s->values[i], data, len);
        s->lens[i] = len;
    }
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : 1;
}

static int ks_get(void *user, const char *key, void *buf, size_t cap, size_t *len)
{
    key_store *s = user;
    pthread_mutex_lock(&s->mu);
    int i = ks_find(s, key);
    if (i >= 0) {
        *len = s->lens[i];
        memcpy(buf, s->values[i], s->lens[i] < cap ? s->lens[i] : cap);
    }
    pthread_mutex_unlock(&s->mu);
    return i < 0;
}

/* One rank: every key it waits for it has set itself, or never will (then: at once, 1). */
static int ks_wait(void *user, const char *const *keys, size_t n, double timeout_s)
{
    key_store *s = user;
    (void)timeout_s;
    pthread_mutex_lock(&s->mu);
    int missing = 0;
    for (size_t i = 0; i < n; i++)
        missing |= ks_find(s, keys[i]) < 0;
    pthread_mutex_unlock(&s->mu);
    return missing;
}

static void test_init_with_store(void **state)
{
    (void)state;
    setenv("CFX_RANK", "0", 1);
    setenv("CFX_SIZE", "1", 1);
    static key_store ks = {.mu = PTHREAD_MUTEX_INITIALIZER};
    cfx_store_callbacks cb = {CFX_STORE_CALLBACKS_VERSION, &ks, ks_set, ks_get, ks_wait};
    cfx_context *ctx = NULL;
    cfx_status st = cfx_init_with_store(NULL, &cb, &ctx);
    if (!(cfx_features() & CFX_FEATURE_GLOO)) {
        assert_int_equal(st, CFX_ERR_UNSUPPORTED);
        assert_non_null(strstr(cfx_last_error(), "no gloo transport"));
        return;
    }
    if (st)
        fail_msg("cfx_init_with_store: %s", cfx_last_error());
    assert_int_equal(cfx_size(ctx), 1);
    /* Rank 0's host went into the store, under this world's key space ("world<N>/world/"). */
    int host_key = 0;
    pthread_mutex_lock(&ks.mu);
    for (int i = 0; i < ks.n; i++) {
        const char *tail = strstr(ks.keys[i], "/world/host/0");
        host_key |= tail && !strncmp(ks.keys[i], "world", 5) && !tail[13];
    }
    pthread_mutex_unlock(&ks.mu);
    assert_true(host_key);
    float x[3] = {1, 2, 3};
    const int64_t shape[1] = {3};
    cfx_tensor t = {.data = x, .shape = shape, .ndim = 1, .dtype = CFX_FLOAT32,
                    .device = CFX_DEVICE_CPU};
    cfx_handle h;
    assert_int_equal(cfx_allreduce_async(ctx, "x", &t, x, CFX_OP_SUM, 1.0, 1.0, &h), CFX_OK);
    assert_int_equal(cfx_wait(ctx, h, 30.0), CFX_OK);
    assert_true(x[0] == 1 && x[1] == 2 && x[2] == 3);
    cfx_handle_release(ctx, h);
    assert_int_equal(cfx_shutdown(ctx), CFX_OK);
    cfx_context_free(ctx);
    assert_int_equal(cfx_init_with_store(NULL, NULL, &ctx), CFX_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_torchrun_without_master_addr, clean_env),
        cmocka_unit_test_setup(test_torchrun_with_mpi_asked_for, clean_env),
        cmocka_unit_test_setup(test_torchrun_peer_never_comes, clean_env),
        cmocka_unit_test_setup(test_slurm_without_nodelist, clean_env),
        cmocka_unit_test_setup(test_horovod_http_rendezvous, clean_env),
        cmocka_unit_test_setup(test_cfx_vars_without_meeting_place, clean_env),
        cmocka_unit_test_setup(test_gloo_asked_for_without_launcher, clean_env),
        cmocka_unit_test_setup(test_malformed_launcher_variable, clean_env),
        cmocka_unit_test_setup(test_init_with_store, clean_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
