/* Unit tests of what the engine checks of any transport table (cx_transport_check): a table that
 * lacks a required call, or whose capability bits and optional calls disagree, is refused with
 * CFX_ERR_INTERNAL naming the transport and the call; among them the pipelined cross-host pair
 * (cross_allreduce_post and _wait), which counts as filled only when both halves are. The
 * in-process transport's own table passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "transport/transport.h"
#include "transport/transport_local.h"

/* Calls that are never made: the check looks only at which are filled. */
static cfx_status no_gather(cx_transport *t, const void *s, size_t n, void **r, size_t *l)
{
    (void)t, (void)s, (void)n, (void)r, (void)l;
    return CFX_OK;
}
static cfx_status no_bcast(cx_transport *t, void **b, size_t *n, int r)
{
    (void)t, (void)b, (void)n, (void)r;
    return CFX_OK;
}
static cfx_status no_and(cx_transport *t, uint64_t *w, size_t n)
{
    (void)t, (void)w, (void)n;
    return CFX_OK;
}
static cfx_status no_allreduce(cx_transport *t, void *b, size_t n, cfx_dtype d, cfx_reduce_op o)
{
    (void)t, (void)b, (void)n, (void)d, (void)o;
    return CFX_OK;
}
static cfx_status no_allgatherv(cx_transport *t, const void *s, size_t n, void *r,
                                const size_t *rb, const size_t *d)
{
    (void)t, (void)s, (void)n, (void)r, (void)rb, (void)d;
    return CFX_OK;
}
static cfx_status no_broadcast(cx_transport *t, void *b, size_t n, int r)
{
    (void)t, (void)b, (void)n, (void)r;
    return CFX_OK;
}
static cfx_status no_alltoallv(cx_transport *t, const void *s, const size_t *sb, const size_t *sd,
                               void *r, const size_t *rb, const size_t *rd)
{
    (void)t, (void)s, (void)sb, (void)sd, (void)r, (void)rb, (void)rd;
    return CFX_OK;
}
static cfx_status no_reduce_scatter(cx_transport *t, const void *s, void *r, const size_t *c,
                                    cfx_dtype d, cfx_reduce_op o)
{
    (void)t, (void)s, (void)r, (void)c, (void)d, (void)o;
    return CFX_OK;
}
static cfx_status no_barrier(cx_transport *t)
{
    (void)t;
    return CFX_OK;
}
static cfx_status no_wait(cx_transport *t)
{
    (void)t;
    return CFX_OK;
}
static void no_destroy(cx_transport *t) { (void)t; }

static cx_transport_ops every_required(void)
{
    return (cx_transport_ops){
        .name = "test",
        .gather_bytes = no_gather,
        .bcast_bytes = no_bcast,
        .allreduce_and = no_and,
        .allreduce = no_allreduce,
        .allgatherv = no_allgatherv,
        .broadcast = no_broadcast,
        .alltoallv = no_alltoallv,
        .reduce_scatter = no_reduce_scatter,
        .barrier = no_barrier,
        .destroy = no_destroy,
    };
}

/* The check's status on `ops`, its message copied into msg. */
static cfx_status check(const cx_transport_ops *ops, char *msg, size_t len)
{
    cx_transport t = {ops, 0, 1, 0, 1, 0, 1};
    cfx_status st = cx_transport_check(&t);
    snprintf(msg, len, "%s", st ? cx_error_message() : "");
    return st;
}

static void test_required_call_missing(void **state)
{
    (void)state;
    char msg[512];
    cx_transport_ops ops = every_required();
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_OK);
    ops.barrier = NULL;
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_ERR_INTERNAL);
    assert_non_null(strstr(msg, "test transport lacks barrier"));
}

static void test_pipeline_bits_and_calls_agree(void **state)
{
    (void)state;
    char msg[512];
    cx_transport_ops ops = every_required();
    /* The bit, neither call. */
    ops.caps.optional = CX_TRANSPORT_CROSS_PIPELINE;
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_ERR_INTERNAL);
    assert_non_null(strstr(msg, "promise cross_allreduce_post and _wait"));
    /* The bit and one half: still a promise the table does not keep. */
    ops.cross_allreduce_wait = no_wait;
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_ERR_INTERNAL);
    assert_non_null(strstr(msg, "promise cross_allreduce_post and _wait"));
    /* Both halves without the bit: calls the engine would never make. */
    ops.cross_allreduce_post = no_allreduce;
    ops.caps.optional = 0;
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_ERR_INTERNAL);
    assert_non_null(strstr(msg, "omit cross_allreduce_post and _wait"));
    ops.caps.optional = CX_TRANSPORT_CROSS_PIPELINE;
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_OK);
}

static void test_other_optional_bits(void **state)
{
    (void)state;
    char msg[512];
    cx_transport_ops ops = every_required();
    ops.caps.optional = CX_TRANSPORT_CROSS_ALLREDUCE;
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_ERR_INTERNAL);
    assert_non_null(strstr(msg, "promise cross_allreduce,"));
    ops.cross_allreduce = no_allreduce;
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_OK);
    ops.caps.optional = 0;
    assert_int_equal(check(&ops, msg, sizeof msg), CFX_ERR_INTERNAL);
    assert_non_null(strstr(msg, "omit cross_allreduce,"));
}

static void test_local_transport_passes(void **state)
{
    (void)state;
    cx_local_world *w = NULL;
    cx_transport *t = NULL;
    assert_int_equal(cx_local_world_create(1, &w), CFX_OK);
    assert_int_equal(cx_transport_local_create(w, 0, &t), CFX_OK);
    assert_int_equal(cx_transport_check(t), CFX_OK);
    t->ops->destroy(t);
    cx_local_world_release(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_required_call_missing),
        cmocka_unit_test(test_pipeline_bits_and_calls_agree),
        cmocka_unit_test(test_other_optional_bits),
        cmocka_unit_test(test_local_transport_passes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
