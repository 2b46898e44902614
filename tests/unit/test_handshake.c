/* Unit tests of the version handshake: thread ranks whose contexts claim wire protocol versions
 * (as CFX_TEST_WIRE_VERSION would), the verdict on hand-made tables, and the table's codec. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/error.h"
#include "engine/context.h"
#include "protocol/handshake.h"
#include "support.h"
#include "transport/transport_local.h"

#define MAX_RANKS 8

typedef struct job {
    world_rank at; /* first: run_world_threads fills it */
    int major, minor; /* the claim; -1 = the build's own */
    const char *log_file;
    cfx_status status;
    char message[CX_ERROR_MAX];
} job;

static void *rank_main(void *p)
{
    job *j = p;
    cx_config cfg;
    cfx_context *ctx = NULL;
    cfx_status st = cx_config_load(&cfg, NULL);
    cfg.test.wire_major = j->major;
    cfg.test.wire_minor = j->minor;
    if (j->log_file)
        snprintf(cfg.log_file, sizeof cfg.log_file, "%s", j->log_file);
    j->status = open_world_rank(&j->at, &cfg, st, &ctx, j->message, sizeof j->message);
    if (ctx) {
        cfx_shutdown(ctx);
        cfx_context_free(ctx);
    }
    return NULL;
}

/* Runs `n` ranks claiming majors[r].minors[r] and fills jobs[]. */
static void run_claims(int n, const int *majors, const int *minors, const char *log_file,
                       job *jobs)
{
    for (int r = 0; r < n; r++)
        jobs[r] = (job){.major = majors[r], .minor = minors[r],
                        .log_file = r == 0 ? log_file : NULL};
    run_world_threads(n, rank_main, jobs, sizeof *jobs);
}

static void same_versions_start(void **state)
{
    (void)state;
    job jobs[3];
    run_claims(3, (int[]){-1, -1, -1}, (int[]){-1, -1, -1}, NULL, jobs);
    for (int r = 0; r < 3; r++)
        assert_int_equal(jobs[r].status, CFX_OK);
}

static void other_major_fails_everywhere(void **state)
{
    (void)state;
    job jobs[4];
    int other = CX_WIRE_VERSION_MAJOR + 1;
    run_claims(4, (int[]){-1, other, -1, -1}, (int[]){-1, 0, -1, -1}, NULL, jobs);
    char mine[64], theirs[64];
    snprintf(mine, sizeof mine, "ranks 0, 2-3: wire protocol %d.%d (", CX_WIRE_VERSION_MAJOR,
             CX_WIRE_VERSION_MINOR);
    snprintf(theirs, sizeof theirs, "rank 1: wire protocol %d.0 (Conflux ", other);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(jobs[r].status, CFX_ERR_VERSION);
        assert_non_null(strstr(jobs[r].message, "ranks cannot talk"));
        assert_non_null(strstr(jobs[r].message, mine));
        assert_non_null(strstr(jobs[r].message, theirs));
        assert_string_equal(jobs[r].message, jobs[0].message); /* every rank says the same */
    }
}

static void other_minor_goes_on_with_a_line(void **state)
{
    (void)state;
    char path[] = "/tmp/cfx-handshake-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    job jobs[2];
    run_claims(2, (int[]){-1, CX_WIRE_VERSION_MAJOR}, (int[]){-1, CX_WIRE_VERSION_MINOR + 3}, path,
               jobs);
    assert_int_equal(jobs[0].status, CFX_OK);
    assert_int_equal(jobs[1].status, CFX_OK);
    char line[4096] = "";
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(line, 1, sizeof line - 1, f);
    line[n] = '\0';
    fclose(f);
    unlink(path);
    char minor[64];
    snprintf(minor, sizeof minor, "rank 1: wire protocol %d.%d (", CX_WIRE_VERSION_MAJOR,
             CX_WIRE_VERSION_MINOR + 3);
    assert_non_null(strstr(line, "handshake warning"));
    assert_non_null(strstr(line, "going on"));
    assert_non_null(strstr(line, minor));
}

static cx_hello hello(int major, int minor)
{
    cx_config cfg = {.test.wire_major = major, .test.wire_minor = minor};
    cx_hello h;
    cx_hello_self(&cfg, &h);
    return h;
}

static void verdict_names_ranges_and_unreadable(void **state)
{
    (void)state;
    cx_logger quiet = {.level = CX_LOG_OFF, .fd = -1};
    cx_hello all[8];
    for (int r = 0; r < 8; r++)
        all[r] = hello(1, 0);
    all[4] = hello(1, 2);
    all[7] = hello(1, 2);
    assert_int_equal(cx_hello_verdict(all, 8, 0, &quiet), CFX_OK);
    memset(&all[5], 0, sizeof all[5]); /* rank 5 sent 7 bytes nobody can read */
    all[5].bytes = 7;
    assert_int_equal(cx_hello_verdict(all, 8, 0, &quiet), CFX_ERR_VERSION);
    const char *msg = cx_error_message();
    assert_non_null(strstr(msg, "some sent no handshake"));
    assert_non_null(strstr(msg, "ranks 0-3, 6: wire protocol 1.0 ("));
    assert_non_null(strstr(msg, "ranks 4, 7: wire protocol 1.2 ("));
    assert_non_null(strstr(msg, "rank 5: no Conflux handshake (7 bytes)"));
}

static void verdict_bounds_long_jobs(void **state)
{
    (void)state;
    enum { N = 4096 };
    cx_hello *all = calloc(N, sizeof *all);
    for (int r = 0; r < N; r++)
        all[r] = hello(r % 2 ? 1 : 2, r % 40); /* 40 combinations, alternating ranks */
    cx_logger quiet = {.level = CX_LOG_OFF, .fd = -1};
    assert_int_equal(cx_hello_verdict(all, N, 0, &quiet), CFX_ERR_VERSION);
    const char *msg = cx_error_message();
    assert_true(strlen(msg) < CX_ERROR_MAX);
    assert_true(strstr(msg, "further combinations") || strstr(msg, "..."));
    free(all);
}

static void table_codec(void **state)
{
    (void)state;
    cx_hello in[3] = {hello(1, 0), hello(3, 9), hello(1, 1)};
    in[1].features = 0xffu;
    cx_bytes recs = {0};
    size_t lens[3];
    for (int r = 0; r < 3; r++) {
        size_t before = recs.len;
        assert_int_equal(cx_encode_hello(&in[r], &recs), CFX_OK);
        lens[r] = recs.len - before;
    }
    lens[2] += 5; /* a later version's record with more fields: still readable */
    uint8_t extra[5] = {1, 2, 3, 4, 5};
    uint8_t buf[256];
    memcpy(buf, recs.data, recs.len);
    memcpy(buf + recs.len, extra, sizeof extra);
    cx_bytes table = {0};
    assert_int_equal(cx_encode_hello_table(buf, lens, 3, &table), CFX_OK);
    cx_hello out[3];
    assert_int_equal(cx_decode_hello_table(table.data, table.len, 3, out), CFX_OK);
    for (int r = 0; r < 3; r++) {
        assert_true(out[r].readable);
        assert_int_equal(out[r].wire_major, in[r].wire_major);
        assert_int_equal(out[r].wire_minor, in[r].wire_minor);
        assert_int_equal(out[r].lib_major, CFX_VERSION_MAJOR);
        assert_int_equal(out[r].features, in[r].features);
        assert_int_equal(out[r].bytes, lens[r]);
    }
    /* The wrong number of ranks, and every truncation, are transport errors naming rank 0. */
    assert_int_equal(cx_decode_hello_table(table.data, table.len, 2, out), CFX_ERR_TRANSPORT);
    assert_non_null(strstr(cx_error_message(), "from rank 0"));
    for (size_t len = 0; len < table.len; len++)
        assert_int_equal(cx_decode_hello_table(table.data, len, 3, out), CFX_ERR_TRANSPORT);
    cx_bytes_free(&table);
    cx_bytes_free(&recs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(same_versions_start),
        cmocka_unit_test(other_major_fails_everywhere),
        cmocka_unit_test(other_minor_goes_on_with_a_line),
        cmocka_unit_test(verdict_names_ranges_and_unreadable),
        cmocka_unit_test(verdict_bounds_long_jobs),
        cmocka_unit_test(table_codec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
