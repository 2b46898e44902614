/*
 * Subset contexts under mpirun (2, 3 and 4 ranks): the scenarios of tests/subset/cases.c over MPI
 * sub-communicators (and shared memory among each subset's ranks), each on a fresh context.
 */
#include "mpitest.h"
#include "../subset/cases.h"

typedef int (*case_fn)(cfx_context *ctx);

static void run(case_fn fn)
{
    cfx_context *ctx = mt_open();
    mt_failures += fn(ctx);
    mt_close(ctx);
    mt_finish();
}

static void members(void **state) { (void)state; run(ss_case_members); }
static void overlapping(void **state) { (void)state; run(ss_case_overlapping); }
static void repeated(void **state) { (void)state; run(ss_case_repeated); }
static void gradset(void **state) { (void)state; run(ss_case_gradset); }
static void errors(void **state) { (void)state; run(ss_case_errors); }
static void parent_shutdown(void **state) { (void)state; run(ss_case_parent_shutdown); }

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(members),     cmocka_unit_test(overlapping), cmocka_unit_test(repeated),
        cmocka_unit_test(gradset),     cmocka_unit_test(errors),      cmocka_unit_test(parent_shutdown),
    };
    return MT_RUN(argc, argv, tests);
}
