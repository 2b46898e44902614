/*
 * test_adasum - CFX_OP_ADASUM on thread ranks (the in-process transport and its point to point):
 * the shared scenarios of tests/adasum/cases.c at 2, 3 and 4 ranks (3: a rank folded in), and the
 * float64-accumulated kernels (kernels/dot.h) against sums written here.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../adasum/cases.h"
#include "kernels/dot.h"
#include "kernels/reduce.h"
#include "support.h"

double ad_get(const void *buf, cfx_dtype dt, size_t i)
{
    switch (dt) {
    case CFX_FLOAT16: return cx_f16_to_f32(((const uint16_t *)buf)[i]);
    case CFX_BFLOAT16: return cx_bf16_to_f32(((const uint16_t *)buf)[i]);
    case CFX_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

void ad_put(void *buf, cfx_dtype dt, size_t i, double v)
{
    switch (dt) {
    case CFX_FLOAT16: ((uint16_t *)buf)[i] = cx_f32_to_f16((float)v); break;
    case CFX_BFLOAT16: ((uint16_t *)buf)[i] = cx_f32_to_bf16((float)v); break;
    case CFX_FLOAT32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
    }
}

static int run_case(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)rank, (void)size;
    return ((const ad_case *)arg)->run(ctx);
}

/* One scenario at 2, 3 and 4 ranks. */
static void each_size(void **state)
{
    for (int size = 2; size <= 4; size++)
        assert_int_equal(run_ranks(size, run_case, *state, NULL), 0);
}

/* cx_dot3 and cx_axpby on every float dtype, aliasing included, against sums in double here. */
static void kernels(void **state)
{
    (void)state;
    static const cfx_dtype dts[] = {CFX_FLOAT16, CFX_BFLOAT16, CFX_FLOAT32, CFX_FLOAT64};
    enum { N = 1031 };
    for (size_t d = 0; d < 4; d++) {
        cfx_dtype dt = dts[d];
        double a[N], b[N], pa[N], pb[N], pd[N]; /* storage for any dtype (8 bytes an element) */
        double ab = 0, aa = 0, bb = 0;
        for (size_t i = 0; i < N; i++) {
            ad_put(pa, dt, i, sin(0.1 * (double)i));
            ad_put(pb, dt, i, cos(0.07 * (double)i) - 0.25);
            a[i] = ad_get(pa, dt, i);
            b[i] = ad_get(pb, dt, i);
            ab += a[i] * b[i];
            aa += a[i] * a[i];
            bb += b[i] * b[i];
        }
        double got[3] = {1, 2, 3};
        cx_dot3(pa, pb, N, dt, got);
        assert_true(fabs(got[0] - 1 - ab) < 1e-9 && fabs(got[1] - 2 - aa) < 1e-9 &&
                    fabs(got[2] - 3 - bb) < 1e-9);
        double tol = dt == CFX_FLOAT64 ? 1e-15 : dt == CFX_FLOAT32 ? 1e-6 : 1e-2;
        cx_axpby(pd, 0.75, pa, -1.5, pb, N, dt);
        for (size_t i = 0; i < N; i++)
            assert_true(fabs(ad_get(pd, dt, i) - (0.75 * a[i] - 1.5 * b[i])) <= tol * 3);
        /* dst may be a or b: the same bits as into a separate dst */
        double qa[N], qb[N];
        memcpy(qa, pa, sizeof qa);
        memcpy(qb, pb, sizeof qb);
        cx_axpby(qa, 0.75, qa, -1.5, pb, N, dt);
        cx_axpby(qb, 0.75, pa, -1.5, qb, N, dt);
        assert_memory_equal(qa, pd, N * cfx_dtype_size(dt));
        assert_memory_equal(qb, pd, N * cfx_dtype_size(dt));
        assert_false(cx_dot_dtype_ok(CFX_INT32));
    }
}

int main(void)
{
    struct CMUnitTest tests[17] = {cmocka_unit_test(kernels)};
    size_t n = 1;
    for (size_t i = 0; i < ad_ncases && n < 17; i++, n++)
        tests[n] = (struct CMUnitTest){ad_cases[i].name, each_size, NULL, NULL,
                                       (void *)&ad_cases[i]};
    return _cmocka_run_group_tests("test_adasum", tests, n, NULL, NULL);
}
