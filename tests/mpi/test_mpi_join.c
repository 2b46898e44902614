/*
 * Join never hangs, under mpirun (2, 3 and 4 ranks): with a rank joined, collectives other than
 * allreduce fail at once with CFX_ERR_JOINED on every rank that submits them, even when the ranks'
 * requests differ (unnamed calls whose generated names drift because only some ranks made them),
 * on the slow path and on the cache path; allreduce still takes the joined rank's identity.
 */
#include <string.h>

#include "mpitest.h"

/* Each rank in turn joins first; the others call an unnamed allgather (which must fail, not
 * hang), an allreduce (the joined rank contributes zero), then join too. */
static void rotate(int named)
{
    cfx_context *ctx = mt_open();
    for (int round = 0; round < 2 * mt_size; round++) {
        int first = round % mt_size;
        cfx_handle join = 0;
        if (mt_rank == first) {
            CHECK_OK(cfx_join_async(ctx, &join));
        } else {
            float v[2] = {(float)mt_rank, 1};
            int64_t shape[1] = {2};
            cfx_tensor t = {v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
            cfx_handle h = 0;
            char name[32];
            snprintf(name, sizeof name, "gather.%d", round % 2); /* cached from round 2 on */
            CHECK_OK(cfx_allgather_async(ctx, named ? name : NULL, &t, &h));
            cfx_status st = cfx_wait(ctx, h, 30.0);
            CHECK(st == CFX_ERR_JOINED, "round %d: allgather with rank %d joined: %s (%s)", round,
                  first, cfx_status_string(st), cfx_handle_message(ctx, h));
            const char *msg = cfx_handle_message(ctx, h);
            CHECK(msg && strstr(msg, "only allreduce takes part in join"), "message: %s", msg);
            cfx_handle_release(ctx, h);
            double s = mt_rank + 1;
            int64_t one = 1;
            cfx_tensor ts = {&s, &one, 1, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
            CHECK_OK(cfx_allreduce_async(ctx, "sum", &ts, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
            CHECK_OK(cfx_wait(ctx, h, 30.0));
            cfx_handle_release(ctx, h);
            double want = mt_size * (mt_size + 1) / 2.0 - (first + 1);
            CHECK(s == want, "round %d: sum %g with rank %d joined, expected %g", round, s, first,
                  want);
            CHECK_OK(cfx_join_async(ctx, &join));
        }
        CHECK_OK(cfx_wait(ctx, join, 30.0));
        cfx_handle_release(ctx, join);
    }
    mt_close(ctx);
    mt_finish();
}

static void rotate_unnamed(void **state) { (void)state; rotate(0); }
static void rotate_named(void **state) { (void)state; rotate(1); }

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rotate_unnamed),
        cmocka_unit_test(rotate_named),
    };
    return MT_RUN(argc, argv, tests);
}
