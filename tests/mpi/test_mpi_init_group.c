/*
 * test_mpi_init_group - cfx_init_group (since 1.3): a group whose members alone make its context,
 * meeting over Gloo through a store the caller hands in (here: files in a directory rank 0 made,
 * every key a file). The ranks outside the group never call it and are not waited for: they run
 * their own collectives on the job's context meanwhile. Results are checked against sums computed
 * here from what each member contributed; bad arguments fail naming both values.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mpitest.h"

typedef struct dir_store {
    char dir[256];
} dir_store;

static void key_path(const dir_store *s, const char *key, char *out, size_t cap)
{
    char flat[256];
    size_t i = 0;
    for (; key[i] && i < sizeof flat - 1; i++)
        flat[i] = key[i] == '/' ? '|' : key[i];
    flat[i] = 0;
    snprintf(out, cap, "%s/%s", s->dir, flat);
}

static int ds_set(void *user, const char *key, const void *data, size_t len)
{
    char path[600], tmp[640];
    key_path(user, key, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return -1;
    size_t n = len ? fwrite(data, 1, len, f) : 0;
    fclose(f);
    if (n != len)
        return -1;
    return rename(tmp, path) ? -1 : 0; /* readers see the whole value or none */
}

static int ds_get(void *user, const char *key, void *buf, size_t cap, size_t *len)
{
    char path[600];
    key_path(user, key, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    *len = (size_t)size;
    size_t want = (size_t)size < cap ? (size_t)size : cap;
    size_t got = want ? fread(buf, 1, want, f) : 0;
    fclose(f);
    return got == want ? 0 : -1;
}

static int ds_wait(void *user, const char *const *keys, size_t n, double timeout_s)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        size_t present = 0;
        for (size_t i = 0; i < n; i++) {
            char path[600];
            key_path(user, keys[i], path, sizeof path);
            present += access(path, F_OK) == 0;
        }
        if (present == n)
            return 0;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (timeout_s >= 0 && waited > timeout_s)
            return 1;
        usleep(1000);
    }
}

static dir_store g_store;

/* Rank 0 makes the directory, everyone learns it. */
static void make_store(void)
{
    if (mt_rank == 0) {
        snprintf(g_store.dir, sizeof g_store.dir, "/tmp/cfx_init_group_XXXXXX");
        if (!mkdtemp(g_store.dir))
            g_store.dir[0] = 0;
    }
    MPI_Bcast(g_store.dir, sizeof g_store.dir, MPI_CHAR, 0, MPI_COMM_WORLD);
}

static void remove_store(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0 && g_store.dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_store.dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", g_store.dir);
    }
}

static const cfx_store_callbacks *callbacks(dir_store *s)
{
    static cfx_store_callbacks cb;
    cb = (cfx_store_callbacks){CFX_STORE_CALLBACKS_VERSION, s, ds_set, ds_get, ds_wait};
    return &cb;
}

/* Members: every rank but 0 (at 2 ranks: rank 1 alone, a group of one). Rank 0 never calls
 * cfx_init_group and does its own work on the job's context meanwhile. */
static void test_members_only(void **state)
{
    (void)state;
    make_store();
    cfx_context *job = mt_open();
    if (!(cfx_features() & CFX_FEATURE_GLOO) && mt_size > 2) {
        cfx_context *g = NULL;
        CHECK_ST(cfx_init_group(NULL, callbacks(&g_store), 0, 2, &g), CFX_ERR_UNSUPPORTED);
        mt_close(job);
        remove_store();
        mt_finish();
        return;
    }
    int gsize = mt_size - 1;
    if (mt_rank == 0) {
        /* not a member: carries on without waiting for the group */
        float x[4] = {1, 2, 3, 4};
        const int64_t shape[1] = {4};
        cfx_tensor t = {x, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_handle h;
        cfx_context *alone = NULL;
        CHECK_ST(cfx_init_group(NULL, callbacks(&g_store), 0, 1, &alone), CFX_OK);
        if (alone) {
            CHECK(cfx_rank(alone) == 0 && cfx_size(alone) == 1, "a group of one: rank %d of %d",
                  cfx_rank(alone), cfx_size(alone));
            CHECK_ST(cfx_allreduce_async(alone, NULL, &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h), CFX_OK);
            CHECK_ST(cfx_wait(alone, h, 30.0), CFX_OK);
            cfx_handle_release(alone, h);
            CHECK(x[0] == 1 && x[3] == 4, "a group of one changed its tensor: %g %g", x[0], x[3]);
            cfx_context_free(alone);
        }
    } else {
        cfx_context *g = NULL;
        CHECK_ST(cfx_init_group(NULL, callbacks(&g_store), mt_rank - 1, gsize, &g), CFX_OK);
        if (g) {
            CHECK(cfx_rank(g) == mt_rank - 1 && cfx_size(g) == gsize,
                  "group rank %d of %d, expected %d of %d", cfx_rank(g), cfx_size(g),
                  mt_rank - 1, gsize);
            double x[5];
            for (int i = 0; i < 5; i++)
                x[i] = 10.0 * mt_rank + i;
            const int64_t shape[1] = {5};
            cfx_tensor t = {x, shape, 1, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
            cfx_handle h;
            CHECK_ST(cfx_allreduce_async(g, NULL, &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h), CFX_OK);
            CHECK_ST(cfx_wait(g, h, 60.0), CFX_OK);
            cfx_handle_release(g, h);
            for (int i = 0; i < 5; i++) {
                double want = 0;
                for (int r = 1; r < mt_size; r++)
                    want += 10.0 * r + i;
                CHECK(x[i] == want, "element %d: %g, expected %g", i, x[i], want);
            }
            CHECK_ST(cfx_barrier_async(g, &h), CFX_OK);
            CHECK_ST(cfx_wait(g, h, 60.0), CFX_OK);
            cfx_handle_release(g, h);
            CHECK_ST(cfx_shutdown(g), CFX_OK);
            cfx_context_free(g);
        }
    }
    mt_close(job);
    remove_store();
    mt_finish();
}

static void test_bad_arguments(void **state)
{
    (void)state;
    cfx_context *g = (cfx_context *)0x1;
    dir_store s = {"/nonexistent"};
    CHECK_ST(cfx_init_group(NULL, NULL, 0, 2, &g), CFX_ERR_INVALID_ARGUMENT);
    CHECK(g == NULL, "out not cleared on failure");
    CHECK_ST(cfx_init_group(NULL, callbacks(&s), 2, 2, &g), CFX_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cfx_last_error(), "rank 2 of size 2") != NULL, "message: %s", cfx_last_error());
    CHECK_ST(cfx_init_group(NULL, callbacks(&s), -1, 3, &g), CFX_ERR_INVALID_ARGUMENT);
    CHECK_ST(cfx_init_group(NULL, callbacks(&s), 0, 0, &g), CFX_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cfx_last_error(), "rank 0 of size 0") != NULL, "message: %s", cfx_last_error());
    CHECK_ST(cfx_init_group(NULL, callbacks(&s), 0, 2, NULL), CFX_ERR_INVALID_ARGUMENT);
    cfx_init_options o;
    cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION);
    o.transport = CFX_TRANSPORT_MPI;
    CHECK_ST(cfx_init_group(&o, callbacks(&s), 0, 2, &g), CFX_ERR_INVALID_ARGUMENT);
    CHECK(strstr(cfx_last_error(), "gloo") != NULL, "message: %s", cfx_last_error());
    mt_finish();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_members_only),
    };
    return MT_RUN(argc, argv, tests);
}
