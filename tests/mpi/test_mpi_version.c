/*
 * The version handshake under mpirun: ranks claim wire protocol versions (CFX_TEST_WIRE_VERSION,
 * set per rank from WIRE_CLAIMS) and cfx_init must either fail on every rank with
 * CFX_ERR_VERSION and a message naming the ranks and their versions, or, for compatible claims,
 * start a job that reduces correctly.
 *
 * Arguments (NAME=VALUE, see mt_main):
 *   WIRE_CLAIMS=1.0,2.0,...   rank r's claim is entry r ("-" or missing: the build's own version)
 *   EXPECT=version|ok         the outcome every rank must see
 *   EXPECT_TEXT=a|b|...       with EXPECT=version: pieces the message must contain
 */
#include <stdlib.h>
#include <string.h>

#include "mpitest.h"

/* Entry `rank` of a comma-separated list into buf ("" when missing). */
static void entry(const char *list, int rank, char *buf, size_t size)
{
    buf[0] = '\0';
    for (int r = 0; list && *list; r++) {
        const char *end = strchr(list, ',');
        size_t n = end ? (size_t)(end - list) : strlen(list);
        if (r == rank) {
            snprintf(buf, size, "%.*s", (int)n, list);
            return;
        }
        list = end ? end + 1 : list + n;
    }
}

static void check_message(const char *msg)
{
    const char *want = getenv("EXPECT_TEXT");
    char piece[256];
    for (int i = 0; want; i++) {
        const char *end = strchr(want, '|');
        size_t n = end ? (size_t)(end - want) : strlen(want);
        snprintf(piece, sizeof piece, "%.*s", (int)n, want);
        CHECK(strstr(msg, piece) != NULL, "the message lacks '%s': %s", piece, msg);
        if (!end)
            break;
        want = end + 1;
    }
}

static void test_handshake(void **state)
{
    (void)state;
    char claim[64];
    entry(getenv("WIRE_CLAIMS"), mt_rank, claim, sizeof claim);
    if (claim[0] && strcmp(claim, "-") != 0)
        setenv("CFX_TEST_WIRE_VERSION", claim, 1);
    const char *expect = getenv("EXPECT");
    CHECK(expect && (!strcmp(expect, "version") || !strcmp(expect, "ok")), "EXPECT=%s",
          expect ? expect : "(unset)");

    cfx_init_options o;
    CHECK_OK(cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION));
    o.transport = CFX_TRANSPORT_MPI;
    cfx_context *ctx = NULL;
    cfx_status st = cfx_init(&o, &ctx);
    if (expect && !strcmp(expect, "version")) {
        const char *msg = mt_last_error_copy();
        CHECK(st == CFX_ERR_VERSION, "cfx_init returned %d (%s), expected CFX_ERR_VERSION: %s",
              (int)st, cfx_status_string(st), msg);
        CHECK(ctx == NULL, "a context despite the failure");
        check_message(msg);
        cfx_context_free(ctx);
    } else {
        CHECK(st == CFX_OK && ctx, "cfx_init: %s", mt_last_error_copy());
        if (ctx) { /* the job works: each rank contributes rank + 1 */
            float v[16];
            for (int i = 0; i < 16; i++)
                v[i] = (float)(mt_rank + 1);
            int64_t shape[1] = {16};
            cfx_tensor t = {v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
            cfx_handle h;
            CHECK_OK(cfx_allreduce_async(ctx, "after.handshake", &t, NULL, CFX_OP_SUM, 1, 1, &h));
            mt_wait_expect(ctx, h, CFX_OK, "after.handshake");
            float want = (float)(mt_size * (mt_size + 1) / 2);
            for (int i = 0; i < 16; i++)
                CHECK(v[i] == want, "element %d is %g, expected %g", i, v[i], want);
        }
        mt_close(ctx);
    }
    unsetenv("CFX_TEST_WIRE_VERSION");
    mt_finish();
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_handshake)};
    return MT_RUN(argc, argv, tests);
}
