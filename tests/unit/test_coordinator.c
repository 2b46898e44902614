/*
 * Unit tests of the coordinator (readiness, order, validation, groups, join, stalls), the response
 * cache (bits, hits, invalidation, LRU eviction) and fusion planning, driven directly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "protocol/cache.h"
#include "base/dtype.h"
#include "protocol/fusion.h"
#include "protocol/negotiate.h"

static cx_request req(const char *name, int coll, int dtype, int64_t n)
{
    cx_request q;
    memset(&q, 0, sizeof q);
    q.name = (char *)name;
    q.coll = (uint8_t)coll;
    q.dtype = (uint8_t)dtype;
    q.op = CFX_OP_SUM;
    q.device = CFX_DEVICE_CPU;
    q.root = -1;
    q.ndim = 1;
    q.shape[0] = n;
    q.prescale = q.postscale = 1.0;
    return q;
}

/* lists[r] = the given requests for rank r (shallow). */
typedef struct job {
    int size;
    cx_request_list lists[8];
    cx_request items[8][8];
} job;

static void job_init(job *j, int size)
{
    memset(j, 0, sizeof *j);
    j->size = size;
    for (int r = 0; r < size; r++) {
        j->lists[r].rank = r;
        j->lists[r].items = j->items[r];
    }
}

static void job_add(job *j, int rank, cx_request q)
{
    j->items[rank][j->lists[rank].count++] = q;
}

static void job_clear(job *j)
{
    for (int r = 0; r < j->size; r++)
        j->lists[r].count = 0;
}

static void ready_order_and_partial(void **state)
{
    (void)state;
    cx_coordinator c;
    assert_int_equal(cx_coordinator_init(&c, 3), CFX_OK);
    job j;
    job_init(&j, 3);
    /* Cycle 1: a and b from everyone but in different orders, c only from rank 2. */
    job_add(&j, 0, req("a", CX_ALLREDUCE, CFX_FLOAT32, 4));
    job_add(&j, 0, req("b", CX_ALLREDUCE, CFX_FLOAT32, 4));
    job_add(&j, 1, req("b", CX_ALLREDUCE, CFX_FLOAT32, 4));
    job_add(&j, 1, req("a", CX_ALLREDUCE, CFX_FLOAT32, 4));
    job_add(&j, 2, req("c", CX_ALLREDUCE, CFX_FLOAT32, 4));
    job_add(&j, 2, req("b", CX_ALLREDUCE, CFX_FLOAT32, 4));
    job_add(&j, 2, req("a", CX_ALLREDUCE, CFX_FLOAT32, 4));
    cx_response_list out = {0};
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    /* b completes first (rank 2 submitted b before a), then a; c is still partial. */
    assert_int_equal(out.count, 2);
    assert_string_equal(out.items[0].name, "b");
    assert_string_equal(out.items[1].name, "a");
    cx_response_list_free(&out);
    /* Cycle 2: the others submit c. */
    job_clear(&j);
    job_add(&j, 0, req("c", CX_ALLREDUCE, CFX_FLOAT32, 4));
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    assert_int_equal(out.count, 0);
    job_clear(&j);
    job_add(&j, 1, req("c", CX_ALLREDUCE, CFX_FLOAT32, 4));
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    assert_int_equal(out.count, 1);
    assert_string_equal(out.items[0].name, "c");
    assert_int_equal(out.items[0].status, CFX_OK);
    cx_response_list_free(&out);
    cx_coordinator_destroy(&c);
}

static void mismatch_messages(void **state)
{
    (void)state;
    struct {
        cx_request a, b;
        const char *expect[3];
    } cases[6];
    cases[0].a = req("t", CX_ALLREDUCE, CFX_FLOAT32, 4);
    cases[0].b = req("t", CX_ALLREDUCE, CFX_INT32, 4);
    cases[0].expect[0] = "float32", cases[0].expect[1] = "int32", cases[0].expect[2] = "dtype";
    cases[1].a = req("t", CX_ALLREDUCE, CFX_FLOAT32, 4);
    cases[1].b = req("t", CX_ALLREDUCE, CFX_FLOAT32, 5);
    cases[1].expect[0] = "[4]", cases[1].expect[1] = "[5]", cases[1].expect[2] = "shape";
    cases[2].a = req("t", CX_ALLREDUCE, CFX_FLOAT32, 4);
    cases[2].b = req("t", CX_ALLGATHER, CFX_FLOAT32, 4);
    cases[2].expect[0] = "allreduce", cases[2].expect[1] = "allgather", cases[2].expect[2] = "collective";
    cases[3].a = req("t", CX_ALLREDUCE, CFX_FLOAT32, 4);
    cases[3].b = cases[3].a;
    cases[3].b.op = CFX_OP_MAX;
    cases[3].expect[0] = "sum", cases[3].expect[1] = "max", cases[3].expect[2] = "op";
    cases[4].a = req("t", CX_ALLREDUCE, CFX_FLOAT32, 4);
    cases[4].b = cases[4].a;
    cases[4].b.postscale = 0.5;
    cases[4].expect[0] = "postscale 1", cases[4].expect[1] = "postscale 0.5", cases[4].expect[2] = "scale";
    cases[5].a = req("t", CX_BROADCAST, CFX_FLOAT32, 4);
    cases[5].a.root = 0;
    cases[5].b = cases[5].a;
    cases[5].b.root = 1;
    cases[5].expect[0] = "root 0", cases[5].expect[1] = "root 1", cases[5].expect[2] = "broadcast";
    for (int k = 0; k < 6; k++) {
        cx_coordinator c;
        assert_int_equal(cx_coordinator_init(&c, 2), CFX_OK);
        job j;
        job_init(&j, 2);
        job_add(&j, 0, cases[k].a);
        job_add(&j, 1, cases[k].b);
        cx_response_list out = {0};
        assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
        assert_int_equal(out.count, 1);
        assert_int_equal(out.items[0].status, CFX_ERR_MISMATCH);
        const char *m = out.items[0].message;
        assert_non_null(strstr(m, "tensor 't'"));
        assert_non_null(strstr(m, "rank 0"));
        assert_non_null(strstr(m, "rank 1"));
        for (int e = 0; e < 3; e++)
            if (!strstr(m, cases[k].expect[e]))
                fail_msg("case %d: '%s' not in: %s", k, cases[k].expect[e], m);
        cx_response_list_free(&out);
        cx_coordinator_destroy(&c);
    }
}

/* Ranks must agree on the kind of memory (CPU or CUDA); the CUDA ordinal is rank-local, so two
 * ranks on different GPU ordinals agree, and the cache and fusion treat them alike. */
static void device_kind_not_ordinal(void **state)
{
    (void)state;
    cx_coordinator c;
    assert_int_equal(cx_coordinator_init(&c, 2), CFX_OK);
    job j;
    job_init(&j, 2);
    cx_request cpu = req("x", CX_ALLREDUCE, CFX_FLOAT32, 4), gpu = cpu, gpu1 = cpu;
    gpu.device = 0;
    gpu1.device = 1;
    job_add(&j, 0, cpu);
    job_add(&j, 1, gpu);
    cx_response_list out = {0};
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    assert_int_equal(out.count, 1);
    assert_int_equal(out.items[0].status, CFX_ERR_MISMATCH);
    assert_string_equal(out.items[0].message, "tensor 'x': mismatched device in allreduce: rank 0 "
                        "has CPU but rank 1 has CUDA device 0");
    cx_response_list_free(&out);

    /* CUDA device 0 on rank 0, CUDA device 1 on rank 1: the same kind, no mismatch. */
    job_clear(&j);
    cx_request y0 = gpu, y1 = gpu1;
    y0.name = y1.name = (char *)"y";
    job_add(&j, 0, y0);
    job_add(&j, 1, y1);
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    assert_int_equal(out.count, 1);
    assert_int_equal(out.items[0].status, CFX_OK);
    assert_true(out.items[0].device != CFX_DEVICE_CPU);

    /* The cached response (rank 0's ordinal) is a hit for rank 1's request on another ordinal,
     * and a CPU request of that name invalidates it. */
    cx_cache cache;
    assert_int_equal(cx_cache_init(&cache, 8), CFX_OK);
    size_t bit = 0, evicted = 0, got = 0;
    assert_true(cx_cache_put(&cache, &out.items[0], &bit, &evicted));
    assert_int_equal(cx_cache_lookup(&cache, &y1, &got), CX_CACHE_HIT);
    assert_int_equal(got, bit);
    cx_request ycpu = y1;
    ycpu.device = CFX_DEVICE_CPU;
    assert_int_equal(cx_cache_lookup(&cache, &ycpu, &got), CX_CACHE_INVALID);
    cx_cache_destroy(&cache);

    /* Fusion: CUDA responses of different ordinals fuse; CPU and CUDA never do. */
    cx_response items[3];
    for (int k = 0; k < 3; k++)
        items[k] = out.items[0];
    items[1].device = 1;
    items[2].device = CFX_DEVICE_CPU;
    assert_int_equal(cx_fusion_batch(items, 3, 0, 1 << 20, 1 << 20), 2);
    cx_response_list_free(&out);
    cx_coordinator_destroy(&c);
}

static void allgather_rows_and_groups(void **state)
{
    (void)state;
    cx_coordinator c;
    assert_int_equal(cx_coordinator_init(&c, 2), CFX_OK);
    job j;
    job_init(&j, 2);
    cx_request g0 = req("g.0", CX_ALLGATHER, CFX_FLOAT32, 3), g1 = req("g.1", CX_ALLGATHER, CFX_FLOAT32, 0);
    g0.group = g1.group = "g";
    g0.group_size = g1.group_size = 2;
    job_add(&j, 0, g0);
    job_add(&j, 1, g0);
    job_add(&j, 0, g1);
    cx_response_list out = {0};
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    assert_int_equal(out.count, 0); /* g.0 is ready but held for its group */
    job_clear(&j);
    g1.shape[0] = 5;
    job_add(&j, 1, g1);
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    assert_int_equal(out.count, 2);
    assert_string_equal(out.items[0].name, "g.0");
    assert_string_equal(out.items[1].name, "g.1");
    assert_int_equal(out.items[1].nrows, 2);
    assert_int_equal(out.items[1].rank_rows[0], 0);
    assert_int_equal(out.items[1].rank_rows[1], 5);
    cx_response_list_free(&out);
    cx_coordinator_destroy(&c);
}

static void join_readiness(void **state)
{
    (void)state;
    cx_coordinator c;
    assert_int_equal(cx_coordinator_init(&c, 3), CFX_OK);
    job j;
    job_init(&j, 3);
    cx_request join = req("join", CX_JOIN, 0, 0);
    job_add(&j, 0, req("x", CX_ALLREDUCE, CFX_FLOAT32, 2));
    job_add(&j, 1, req("x", CX_ALLREDUCE, CFX_FLOAT32, 2));
    job_add(&j, 0, req("y", CX_ALLGATHER, CFX_FLOAT32, 2));
    job_add(&j, 1, req("y", CX_ALLGATHER, CFX_FLOAT32, 2));
    job_add(&j, 2, join);
    cx_response_list out = {0};
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    /* x runs with rank 2 contributing the identity; y fails: allgather cannot run joined. */
    assert_int_equal(out.count, 2);
    assert_string_equal(out.items[0].name, "x");
    assert_int_equal(out.items[0].status, CFX_OK);
    assert_string_equal(out.items[1].name, "y");
    assert_int_equal(out.items[1].status, CFX_ERR_JOINED);
    assert_non_null(strstr(out.items[1].message, "joined: 2"));
    cx_response_list_free(&out);
    job_clear(&j);
    job_add(&j, 1, join);
    job_add(&j, 0, join);
    assert_int_equal(cx_coordinator_process(&c, j.lists, 0.0, &out), CFX_OK);
    assert_int_equal(out.count, 1);
    assert_int_equal(out.items[0].coll, CX_JOIN);
    assert_int_equal(out.items[0].last_joined, 1); /* rank 1 was scanned after rank 0 */
    cx_response_list_free(&out);
    cx_coordinator_destroy(&c);
}

static void stall_deadline(void **state)
{
    (void)state;
    cx_coordinator c;
    assert_int_equal(cx_coordinator_init(&c, 4), CFX_OK);
    job j;
    job_init(&j, 4);
    job_add(&j, 0, req("slow", CX_ALLREDUCE, CFX_FLOAT32, 2));
    job_add(&j, 2, req("slow", CX_ALLREDUCE, CFX_FLOAT32, 2));
    cx_response_list out = {0};
    assert_int_equal(cx_coordinator_process(&c, j.lists, 10.0, &out), CFX_OK);
    cx_logger quiet = {CX_LOG_OFF, 0, 2, 0};
    assert_int_equal(cx_coordinator_check_stalls(&c, 12.0, 1.0, 5.0, &quiet, &out), CFX_OK);
    assert_int_equal(out.count, 0);
    assert_int_equal(cx_coordinator_check_stalls(&c, 15.5, 1.0, 5.0, &quiet, &out), CFX_OK);
    assert_int_equal(out.count, 1);
    assert_int_equal(out.items[0].status, CFX_ERR_STALL);
    assert_non_null(strstr(out.items[0].message, "ranks [0, 2]"));
    assert_non_null(strstr(out.items[0].message, "ranks [1, 3]"));
    cx_response_list_free(&out);
    cx_coordinator_destroy(&c);
}

static cx_response resp(const char *name, int64_t n)
{
    cx_response r;
    memset(&r, 0, sizeof r);
    r.name = strdup(name);
    r.coll = CX_ALLREDUCE;
    r.dtype = CFX_FLOAT32;
    r.device = CFX_DEVICE_CPU;
    r.ndim = 1;
    r.shape[0] = n;
    r.prescale = r.postscale = 1.0;
    return r;
}

static void cache_bits_and_eviction(void **state)
{
    (void)state;
    cx_cache c;
    assert_int_equal(cx_cache_init(&c, 2), CFX_OK);
    cx_response a = resp("a", 4), b = resp("b", 4), d = resp("d", 4);
    size_t bit, evicted;
    assert_true(cx_cache_put(&c, &a, &bit, &evicted));
    assert_int_equal(bit, 0);
    assert_true(cx_cache_put(&c, &b, &bit, &evicted));
    assert_int_equal(bit, 1);
    assert_int_equal(evicted, SIZE_MAX);
    cx_request q = req("a", CX_ALLREDUCE, CFX_FLOAT32, 4);
    assert_int_equal(cx_cache_lookup(&c, &q, &bit), CX_CACHE_HIT);
    assert_int_equal(bit, 0);
    q.shape[0] = 5;
    assert_int_equal(cx_cache_lookup(&c, &q, &bit), CX_CACHE_INVALID);
    q = req("zzz", CX_ALLREDUCE, CFX_FLOAT32, 4);
    assert_int_equal(cx_cache_lookup(&c, &q, &bit), CX_CACHE_MISS);
    /* a used more recently than b: d evicts b and takes its bit. */
    cx_cache_touch(&c, 0);
    assert_true(cx_cache_put(&c, &d, &bit, &evicted));
    assert_int_equal(bit, 1);
    assert_int_equal(evicted, 1);
    q = req("b", CX_ALLREDUCE, CFX_FLOAT32, 4);
    assert_int_equal(cx_cache_lookup(&c, &q, &bit), CX_CACHE_MISS);
    cx_cache_erase(&c, 0);
    q = req("a", CX_ALLREDUCE, CFX_FLOAT32, 4);
    assert_int_equal(cx_cache_lookup(&c, &q, &bit), CX_CACHE_MISS);
    cx_response_free(&a);
    cx_response_free(&b);
    cx_response_free(&d);
    cx_cache_destroy(&c);
}

static void fusion_plan(void **state)
{
    (void)state;
    cx_response items[6];
    items[0] = resp("a", 100);   /* 400 B */
    items[1] = resp("b", 100);
    items[2] = resp("c", 1000);  /* 4000 B: at least the chunk size -> alone */
    items[3] = resp("d", 100);
    items[4] = resp("e", 100);
    items[4].dtype = CFX_FLOAT64; /* another dtype ends a batch */
    items[5] = resp("f", 50);
    items[5].dtype = CFX_FLOAT64;
    assert_int_equal(cx_fusion_batch(items, 6, 0, 1 << 20, 4000), 2);
    assert_int_equal(cx_fusion_batch(items, 6, 2, 1 << 20, 4000), 1);
    assert_int_equal(cx_fusion_batch(items, 6, 3, 1 << 20, 4000), 1);
    assert_int_equal(cx_fusion_batch(items, 6, 4, 1 << 20, 4000), 2);
    assert_int_equal(cx_fusion_batch(items, 6, 0, 500, 4000), 1);  /* threshold reached */
    assert_int_equal(cx_fusion_batch(items, 6, 0, 0, 4000), 1);    /* fusion off */
    for (int i = 0; i < 6; i++)
        cx_response_free(&items[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ready_order_and_partial),
        cmocka_unit_test(mismatch_messages),
        cmocka_unit_test(device_kind_not_ordinal),
        cmocka_unit_test(allgather_rows_and_groups),
        cmocka_unit_test(join_readiness),
        cmocka_unit_test(stall_deadline),
        cmocka_unit_test(cache_bits_and_eviction),
        cmocka_unit_test(fusion_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
