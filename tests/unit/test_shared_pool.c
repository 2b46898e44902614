/*
 * Shared tensor memory (cfx_alloc / cfx_free / cfx_is_shared, shared_pool.c): alignment, reuse and coalescing of
 * freed blocks, the errors for foreign pointers, double frees and a full pool, a malformed
 * CFX_SHARED_POOL_BYTES, a second mapping of the pool (what a peer rank sees) reading and writing
 * the same bytes, a forked child's own pool, and allocation from several threads at once.
 * The pool is 64 MiB here (set before its first use), so "full" is reachable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "conflux/conflux.h"
#include "exec/shared_pool.h"

#define POOL_BYTES (64u << 20)

static void *must_alloc(size_t bytes)
{
    void *p = NULL;
    assert_int_equal(cfx_alloc(bytes, &p), CFX_OK);
    assert_non_null(p);
    return p;
}

static void test_alignment_and_use(void **state)
{
    (void)state;
    void *p[5];
    size_t sizes[5] = {0, 1, 63, 65, 3u << 20};
    for (int i = 0; i < 5; i++) {
        p[i] = must_alloc(sizes[i]);
        assert_int_equal((uintptr_t)p[i] % 64, 0);
        memset(p[i], 0x40 + i, sizes[i]);
        uint64_t off;
        assert_true(cx_pool_offset(p[i], sizes[i], &off));
    }
    for (int i = 0; i < 5; i++) /* no block overlaps another */
        for (size_t b = 0; b < sizes[i]; b++)
            assert_int_equal(((unsigned char *)p[i])[b], 0x40 + i);
    assert_int_equal(cfx_is_shared(p[4], sizes[4]), 1);
    assert_int_equal(cfx_is_shared((char *)p[4] + 100, 100), 1);
    assert_int_equal(cfx_is_shared(p[4], POOL_BYTES + 1), 0); /* runs past the pool */
    assert_int_equal(cfx_is_shared(NULL, 0), 0);
    for (int i = 0; i < 5; i++)
        assert_int_equal(cfx_free(p[i]), CFX_OK);
    assert_int_equal(cfx_free(NULL), CFX_OK);
    uint64_t off;
    int local = 0;
    assert_false(cx_pool_offset(&local, sizeof local, &off));
    assert_int_equal(cfx_is_shared(&local, sizeof local), 0);
}

static void test_freed_blocks_coalesce(void **state)
{
    (void)state;
    /* Three neighbours freed middle-first, then last: one extent again, so a block as big as
     * all three fits where the first one was. */
    size_t mb = 1u << 20;
    char *a = must_alloc(4 * mb), *b = must_alloc(4 * mb), *c = must_alloc(4 * mb);
    assert_ptr_equal(b, a + 4 * mb);
    assert_ptr_equal(c, b + 4 * mb);
    assert_int_equal(cfx_free(b), CFX_OK);
    assert_int_equal(cfx_free(a), CFX_OK);
    assert_int_equal(cfx_free(c), CFX_OK);
    char *big = must_alloc(12 * mb);
    assert_ptr_equal(big, a);
    assert_int_equal(cfx_free(big), CFX_OK);
}

static void test_bad_frees(void **state)
{
    (void)state;
    char *p = must_alloc(1000);
    int local = 0;
    assert_int_equal(cfx_free(&local), CFX_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(cfx_last_error(), "not a block from cfx_alloc"));
    assert_int_equal(cfx_free(p + 64), CFX_ERR_INVALID_ARGUMENT); /* inside a block */
    assert_int_equal(cfx_free(p), CFX_OK);
    assert_int_equal(cfx_free(p), CFX_ERR_INVALID_ARGUMENT); /* twice */
    assert_non_null(strstr(cfx_last_error(), "already freed"));
    void **null_out = NULL;
    assert_int_equal(cfx_alloc(8, null_out), CFX_ERR_INVALID_ARGUMENT);
}

static void test_full_pool(void **state)
{
    (void)state;
    void *p = NULL;
    assert_int_equal(cfx_alloc(POOL_BYTES + 1, &p), CFX_ERR_OUT_OF_MEMORY);
    assert_null(p);
    assert_non_null(strstr(cfx_last_error(), "CFX_SHARED_POOL_BYTES"));
    assert_int_equal(cfx_alloc(SIZE_MAX, &p), CFX_ERR_OUT_OF_MEMORY);
    /* The whole pool in one block, then nothing more; freeing it makes room again. */
    void *all = must_alloc(POOL_BYTES);
    assert_int_equal(cfx_alloc(1, &p), CFX_ERR_OUT_OF_MEMORY);
    assert_int_equal(cfx_free(all), CFX_OK);
    p = must_alloc(POOL_BYTES / 2);
    assert_int_equal(cfx_free(p), CFX_OK);
}

/* What a peer rank does: map the pool through /proc and use it at base + offset. */
static void test_second_mapping_sees_the_same_bytes(void **state)
{
    (void)state;
    size_t n = 300000;
    float *x = must_alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)i;
    cx_pool_export e;
    assert_int_equal(cx_pool_get_export(&e), CFX_OK);
    assert_int_equal(e.pid, getpid());
    assert_int_equal(e.size, POOL_BYTES);
    void *view = NULL;
    assert_int_equal(cx_pool_map_peer(&e, &view), CFX_OK);
    uint64_t off;
    assert_true(cx_pool_offset(x, n * sizeof(float), &off));
    float *y = (float *)((char *)view + off);
    assert_ptr_not_equal(x, y);
    for (size_t i = 0; i < n; i += 997)
        assert_true(y[i] == (float)i);
    y[12345] = -1.0f; /* writes through the other mapping are seen here */
    assert_true(x[12345] == -1.0f);
    munmap(view, e.size);
    assert_int_equal(cfx_free(x), CFX_OK);
    cx_pool_export bad = e;
    bad.fd = 1000000;
    assert_int_equal(cx_pool_map_peer(&bad, &view), CFX_ERR_TRANSPORT);
    assert_non_null(strstr(cfx_last_error(), "cannot open the shared pool"));
}

/* A forked child gets a pool of its own: the parent's blocks are not its to free, its own work,
 * and its first pool creation reads CFX_SHARED_POOL_BYTES afresh. */
static void test_fork_child_has_its_own_pool(void **state)
{
    (void)state;
    void *parent_block = must_alloc(4096);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int code = 0;
        if (cfx_free(parent_block) != CFX_ERR_INVALID_ARGUMENT)
            code |= 1;
        if (cfx_is_shared(parent_block, 4096)) /* not this process's pool any more */
            code |= 8;
        setenv("CFX_SHARED_POOL_BYTES", "12x", 1);
        void *p = NULL;
        if (cfx_alloc(16, &p) != CFX_ERR_CONFIG || !strstr(cfx_last_error(), "CFX_SHARED_POOL_BYTES"))
            code |= 2;
        setenv("CFX_SHARED_POOL_BYTES", "1M", 1);
        if (cfx_alloc(16, &p) != CFX_OK || cfx_alloc(2u << 20, &p) != CFX_ERR_OUT_OF_MEMORY)
            code |= 4;
        _exit(code);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(cfx_free(parent_block), CFX_OK);
}

enum { THREADS = 4, ROUNDS = 2000 };

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *held[8] = {0};
    for (int r = 0; r < ROUNDS; r++) {
        int k = (int)(rand_r(&seed) % 8);
        if (held[k]) {
            if (*(unsigned *)held[k] != (uintptr_t)held[k] % 1000003u || cfx_free(held[k]) != CFX_OK)
                return (void *)1;
            held[k] = NULL;
        } else {
            size_t bytes = 4 + rand_r(&seed) % 20000;
            if (cfx_alloc(bytes, &held[k]) != CFX_OK)
                return (void *)1;
            *(unsigned *)held[k] = (unsigned)((uintptr_t)held[k] % 1000003u);
        }
    }
    for (int k = 0; k < 8; k++)
        if (held[k] && cfx_free(held[k]) != CFX_OK)
            return (void *)1;
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1)), 0);
    for (int i = 0; i < THREADS; i++) {
        void *ret = NULL;
        pthread_join(t[i], &ret);
        assert_null(ret);
    }
    /* Everything came back: the whole pool is one free extent again. */
    void *all = must_alloc(POOL_BYTES);
    assert_int_equal(cfx_free(all), CFX_OK);
}

int main(void)
{
    setenv("CFX_SHARED_POOL_BYTES", "64M", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alignment_and_use),
        cmocka_unit_test(test_freed_blocks_coalesce),
        cmocka_unit_test(test_bad_frees),
        cmocka_unit_test(test_full_pool),
        cmocka_unit_test(test_second_mapping_sees_the_same_bytes),
        cmocka_unit_test(test_fork_child_has_its_own_pool),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
