/*
 * test_subset - subset contexts on thread ranks (the in-process transport's split): the shared
 * scenarios of tests/subset/cases.c at 2, 3 and 4 ranks; and the agreement's verdict
 * (engine/subset.h) on hand-made rows of 3 ranks, each problem named with its rank.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "base/error.h"
#include "engine/subset.h"

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

/* Rows of 3 ranks: each rank's list as cx_subset_encode writes it. */
static cfx_status decide(const int *const lists[3], const size_t lens[3], int *sorted, size_t *n)
{
    int32_t all[3 * 4];
    for (int r = 0; r < 3; r++)
        cx_subset_encode(lists[r], lens[r], 3, all + 4 * r);
    return cx_subset_decide("f", all, 3, sorted, n);
}

static void verdicts(void **state)
{
    (void)state;
    int sorted[8];
    size_t n = 0;
    const int a[] = {2, 0}, b[] = {0, 2}, c[] = {0, 1}, dup[] = {1, 1}, out[] = {0, 3};
    const int *same[3] = {a, b, a};
    assert_int_equal(decide(same, (size_t[]){2, 2, 2}, sorted, &n), CFX_OK);
    assert_true(n == 2 && sorted[0] == 0 && sorted[1] == 2);
    const struct {
        const int *lists[3];
        size_t lens[3];
        const char *want;
    } bad[] = {
        {{a, c, a}, {2, 2, 2}, "rank 0 passed [0, 2], rank 1 passed [0, 1]"},
        {{a, a, dup}, {2, 2, 2}, "rank 2 listed rank 1 twice"},
        {{a, out, a}, {2, 2, 2}, "rank 1 listed rank 3, outside the context's 3 ranks"},
        {{a, a, NULL}, {2, 2, 2}, "rank 2 passed no list (NULL)"},
        {{a, a, a}, {2, 0, 2}, "rank 1 passed an empty list"},
        {{a, a, a}, {2, 2, 4}, "rank 2 passed more ranks than the context has"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfx_status st = decide(bad[i].lists, bad[i].lens, sorted, &n);
        if (st != CFX_ERR_INVALID_ARGUMENT || !strstr(cx_error_message(), bad[i].want))
            fail_msg("case %zu: status %d, \"%s\"; want \"%s\"", i, (int)st, cx_error_message(),
                     bad[i].want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(verdicts),
        cmocka_unit_test(members),     cmocka_unit_test(overlapping), cmocka_unit_test(repeated),
        cmocka_unit_test(gradset),     cmocka_unit_test(errors),      cmocka_unit_test(parent_shutdown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
