/*
 * test_subset - subset contexts on thread ranks (the in-process transport's split): the shared
 * scenarios of tests/subset/cases.c at 2, 3 and 4 ranks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "../subset/cases.h"
#include "support.h"

typedef int (*case_fn)(cfx_context *ctx);
static int run_case(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)rank, (void)size;
    return (*(case_fn *)arg)(ctx);
}

static void each_size(case_fn fn)
{
    for (int size = 2; size <= 4; size++)
        assert_int_equal(run_ranks(size, run_case, &fn, NULL), 0);
}

static void members(void **state) { (void)state; each_size(ss_case_members); }
static void overlapping(void **state) { (void)state; each_size(ss_case_overlapping); }
static void repeated(void **state) { (void)state; each_size(ss_case_repeated); }
static void gradset(void **state) { (void)state; each_size(ss_case_gradset); }
static void errors(void **state) { (void)state; each_size(ss_case_errors); }
static void parent_shutdown(void **state) { (void)state; each_size(ss_case_parent_shutdown); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(members),     cmocka_unit_test(overlapping), cmocka_unit_test(repeated),
        cmocka_unit_test(gradset),     cmocka_unit_test(errors),      cmocka_unit_test(parent_shutdown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
