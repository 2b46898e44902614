/*
 * Gradient sets under mpirun (2, 3 and 4 ranks): the scenarios of tests/gradset/cases.c over the
 * MPI transport and the shared-memory data path (owned storage takes the direct path), each on a
 * fresh context, every rank's failures agreed at the end of each test.
 */
#include "mpitest.h"
#include "../gradset/cases.h"

typedef int (*case_fn)(cfx_context *ctx);

static void run(case_fn fn)
{
    cfx_context *ctx = mt_open();
    mt_failures += fn(ctx);
    mt_close(ctx);
    mt_finish();
}

static int steps_owned(cfx_context *ctx) { return gs_case_steps(ctx, 1); }
static int steps_borrowed(cfx_context *ctx) { return gs_case_steps(ctx, 0); }
static void owned_steps(void **state) { (void)state; run(steps_owned); }
static void borrowed_steps(void **state) { (void)state; run(steps_borrowed); }
static void accumulate(void **state) { (void)state; run(gs_case_accumulate); }
static void mismatch(void **state) { (void)state; run(gs_case_mismatch); }
static void threads(void **state) { (void)state; run(gs_case_threads); }
static void sum_int(void **state) { (void)state; run(gs_case_sum_int); }
static void errors(void **state) { (void)state; run(gs_case_errors); }
static void first_bucket(void **state) { (void)state; run(gs_case_first_bucket); }
static void shutdown_pending(void **state) { (void)state; run(gs_case_shutdown_pending); }

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(owned_steps),
        cmocka_unit_test(borrowed_steps),
        cmocka_unit_test(accumulate),
        cmocka_unit_test(mismatch),
        cmocka_unit_test(threads),
        cmocka_unit_test(sum_int),
        cmocka_unit_test(first_bucket),
        cmocka_unit_test(errors),
        cmocka_unit_test(shutdown_pending),
    };
    return MT_RUN(argc, argv, tests);
}
