/*
 * test_compress - gradient compression on thread ranks (the in-process transport, one host): the
 * shared scenarios of tests/compress/cases.c at 2, 3 and 4 ranks. One host has no cross-host leg,
 * so fp16/bf16 leave the data as it is (bitwise the uncompressed result) and the _EVERYWHERE forms
 * compress every allreduce over the transport.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <cmocka.h>

#include "../compress/cases.h"
#include "support.h"

typedef struct run_arg {
    int which; /* 0 allreduce, 1 gradset, 2 mismatch, 3 errors, 4 error feedback */
    cfx_compression compression;
    int compressed;
} run_arg;

static int run_case(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)rank, (void)size;
    const run_arg *a = arg;
    switch (a->which) {
    case 0: return cz_case_allreduce(ctx, a->compression, a->compressed);
    case 1: return cz_case_gradset(ctx, a->compression, a->compressed);
    case 2: return cz_case_mismatch(ctx);
    case 3: return cz_case_errors(ctx);
    default: return cz_case_error_feedback(ctx, a->compression, a->compressed);
    }
}

static void each_size(int which, cfx_compression c, int compressed)
{
    run_arg a = {which, c, compressed};
    for (int size = 2; size <= 4; size++)
        assert_int_equal(run_ranks(size, run_case, &a, NULL), 0);
}

static void fp16_one_host(void **state) { (void)state; each_size(0, CFX_COMPRESSION_FP16, 0); }
static void bf16_one_host(void **state) { (void)state; each_size(0, CFX_COMPRESSION_BF16, 0); }
static void fp16_everywhere(void **state)
{
    (void)state;
    each_size(0, CFX_COMPRESSION_FP16_EVERYWHERE, 1);
}
static void bf16_everywhere(void **state)
{
    (void)state;
    each_size(0, CFX_COMPRESSION_BF16_EVERYWHERE, 1);
}
static void gradset_everywhere(void **state)
{
    (void)state;
    each_size(1, CFX_COMPRESSION_FP16_EVERYWHERE, 1);
}
static void gradset_one_host(void **state) { (void)state; each_size(1, CFX_COMPRESSION_BF16, 0); }
static void mismatch(void **state) { (void)state; each_size(2, CFX_COMPRESSION_NONE, 0); }
static void feedback_everywhere(void **state)
{
    (void)state;
    each_size(4, CFX_COMPRESSION_FP16_EVERYWHERE, 1);
}
static void feedback_one_host(void **state) { (void)state; each_size(4, CFX_COMPRESSION_FP16, 0); }
static void errors(void **state) { (void)state; each_size(3, CFX_COMPRESSION_NONE, 0); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fp16_one_host),      cmocka_unit_test(bf16_one_host),
        cmocka_unit_test(fp16_everywhere),    cmocka_unit_test(bf16_everywhere),
        cmocka_unit_test(gradset_everywhere), cmocka_unit_test(gradset_one_host),
        cmocka_unit_test(mismatch),           cmocka_unit_test(errors),
        cmocka_unit_test(feedback_everywhere), cmocka_unit_test(feedback_one_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
