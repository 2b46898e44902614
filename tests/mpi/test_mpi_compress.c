/*
 * Gradient compression under mpirun: the scenarios of tests/compress/cases.c on a fresh context
 * each. The run's settings say what the data path must do: CFX_TEST_COMPRESSION (fp16, bf16,
 * fp16_everywhere, bf16_everywhere), CFX_TEST_EXPECT_COMPRESSED (1: the path compresses; 0: the
 * results must be those without compression) and CFX_TEST_HOSTS (the number of hosts the job
 * must see, pretend ones with CFX_TEST_LOCAL_SIZE), each checked rather than assumed.
 */
#include <stdlib.h>
#include <string.h>

#include "mpitest.h"
#include "../compress/cases.h"

static cfx_compression compression(void)
{
    const char *v = getenv("CFX_TEST_COMPRESSION");
    if (!v || !strcmp(v, "fp16"))
        return CFX_COMPRESSION_FP16;
    if (!strcmp(v, "bf16"))
        return CFX_COMPRESSION_BF16;
    if (!strcmp(v, "fp16_everywhere"))
        return CFX_COMPRESSION_FP16_EVERYWHERE;
    if (!strcmp(v, "bf16_everywhere"))
        return CFX_COMPRESSION_BF16_EVERYWHERE;
    fail_msg("CFX_TEST_COMPRESSION=%s is none of fp16, bf16, fp16_everywhere, bf16_everywhere", v);
    return CFX_COMPRESSION_NONE;
}

static int env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static cfx_context *open_checked(void)
{
    cfx_context *ctx = mt_open();
    int hosts = env_int("CFX_TEST_HOSTS", 1);
    CHECK(cfx_cross_size(ctx) == hosts, "the job spans %d hosts, the test expects %d",
          cfx_cross_size(ctx), hosts);
    return ctx;
}

/* Runs scenario `which` (0 allreduce, 1 gradient set, 2 mismatch, 3 errors, 4 error feedback) on
 * a fresh context. */
static void run(int which)
{
    cfx_context *ctx = open_checked();
    int compressed = env_int("CFX_TEST_EXPECT_COMPRESSED", 0);
    mt_failures += which == 0   ? cz_case_allreduce(ctx, compression(), compressed)
                   : which == 1 ? cz_case_gradset(ctx, compression(), compressed)
                   : which == 2 ? cz_case_mismatch(ctx)
                   : which == 3 ? cz_case_errors(ctx)
                                : cz_case_error_feedback(ctx, compression(), compressed);
    mt_close(ctx);
    mt_finish();
}

static void allreduce(void **state) { (void)state; run(0); }
static void gradset(void **state) { (void)state; run(1); }
static void mismatch(void **state) { (void)state; run(2); }
static void errors(void **state) { (void)state; run(3); }
static void error_feedback(void **state) { (void)state; run(4); }

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(allreduce),
        cmocka_unit_test(gradset),
        cmocka_unit_test(mismatch),
        cmocka_unit_test(errors),
        cmocka_unit_test(error_feedback),
    };
    return MT_RUN(argc, argv, tests);
}
