/*
 * The timeline on thread ranks: per-rank file names, every phase of every tensor and a "ready"
 * mark per rank on the coordinator, start/stop at run time, the size cap, JSON escaping, and that
 * tools/cfx-timeline loads the files (with and without the closing bracket).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/context.h"
#include "support.h"
#include "observe/timeline.h"

static char dir[256];
static char tl_path[512];
static int64_t tl_cap;

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    if (len)
        *len = got;
    return s;
}

static int count(const char *s, const char *sub)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub))
        n++;
    return n;
}

/* A file of the repository, found from this file's path (tests/unit/test_timeline.c). */
static void tool_path(char *out, size_t size, const char *rel)
{
    snprintf(out, size, "%s", __FILE__);
    char *p = strstr(out, "tests/unit/test_timeline.c");
    if (p)
        snprintf(p, size - (size_t)(p - out), "%s", rel);
}

static void rank_path_names(void **state)
{
    (void)state;
    char out[256];
    cx_timeline_rank_path("/tmp/tl.json", 3, out, sizeof out);
    assert_string_equal(out, "/tmp/tl.rank3.json");
    cx_timeline_rank_path("/tmp/a.b/tl", 0, out, sizeof out);
    assert_string_equal(out, "/tmp/a.b/tl.rank0");
    cx_timeline_rank_path("/tmp/tl-%r.trace.json", 12, out, sizeof out);
    assert_string_equal(out, "/tmp/tl-12.trace.json");
    cx_timeline_rank_path("/tmp/.hidden", 1, out, sizeof out);
    assert_string_equal(out, "/tmp/.hidden.rank1");
}

/* ---- a 3-rank job with CFX_TIMELINE ---- */

#define NT 5
static const int64_t sizes[NT] = {1, 100, 1000, 300000, 5};

static void env_timeline(cx_config *cfg)
{
    snprintf(cfg->timeline, sizeof cfg->timeline, "%s", tl_path);
    cfg->timeline_cycles = 1;
    cfg->chunk_bytes = 1 << 20; /* the 1.2 MB tensor runs alone; the rest fuse */
    if (tl_cap)
        cfg->timeline_max_bytes = tl_cap;
}

static int steps_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    int steps = arg ? *(int *)arg : 3;
    float *bufs[NT];
    for (int t = 0; t < NT; t++)
        bufs[t] = malloc(sizeof(float) * (size_t)sizes[t]);
    for (int s = 0; s < steps; s++) {
        cfx_handle h[NT];
        int64_t shapes[NT][1];
        for (int t = 0; t < NT; t++) {
            for (int64_t i = 0; i < sizes[t]; i++)
                bufs[t][i] = (float)(rank + t + s);
            cfx_tensor x = tensor1d(bufs[t], shapes[t], sizes[t], CFX_FLOAT32);
            char name[64];
            snprintf(name, sizeof name, "grad \"%d\"\\x", t); /* quotes and backslash: escaped */
            RANK_CHECK(cfx_allreduce_async(ctx, name, &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h[t]) == CFX_OK,
                       "submit: %s", cfx_last_error());
        }
        for (int t = 0; t < NT; t++) {
            RANK_CHECK(cfx_wait(ctx, h[t], 60) == CFX_OK, "wait: %s", cfx_handle_message(ctx, h[t]));
            cfx_handle_release(ctx, h[t]);
            float want = (float)(size * (t + s) + size * (size - 1) / 2);
            RANK_CHECK(bufs[t][sizes[t] - 1] == want, "tensor %d: %g, expected %g", t,
                       bufs[t][sizes[t] - 1], want);
        }
    }
    for (int t = 0; t < NT; t++)
        free(bufs[t]);
    return 0;
}

static void three_ranks_every_phase(void **state)
{
    (void)state;
    snprintf(tl_path, sizeof tl_path, "%s/job.json", dir);
    tl_cap = 0;
    assert_int_equal(run_ranks(3, steps_rank, NULL, env_timeline), 0);
    for (int r = 0; r < 3; r++) {
        char path[600];
        snprintf(path, sizeof path, "%s/job.rank%d.json", dir, r);
        char *s = slurp(path, NULL);
        assert_non_null(s);
        assert_true(strncmp(s, "[\n", 2) == 0);
        size_t n = strlen(s);
        assert_true(n > 3 && strcmp(s + n - 3, "\n]\n") == 0); /* shutdown closed it */
        for (int t = 0; t < NT; t++) {
            char lane[128];
            snprintf(lane, sizeof lane, "\"args\":{\"name\":\"grad \\\"%d\\\"\\\\x\"}", t);
            assert_int_equal(count(s, lane), 1);
        }
        /* 3 steps x NT tensors, every phase */
        assert_int_equal(count(s, "\"cat\":\"queued\""), 3 * NT);
        assert_int_equal(count(s, "\"cat\":\"negotiate\""), 3 * NT);
        assert_int_equal(count(s, "\"cat\":\"pack\""), 3 * NT);
        assert_int_equal(count(s, "\"cat\":\"collective\""), 3 * NT);
        assert_int_equal(count(s, "\"cat\":\"unpack\""), 3 * NT);
        assert_true(count(s, "\"cat\":\"cycle\"") > 0);
        if (r == 0) /* first step negotiated through the coordinator: one mark per rank per tensor */
            for (int k = 0; k < 3; k++) {
                char mark[32];
                snprintf(mark, sizeof mark, "\"rank %d ready\"", k);
                assert_true(count(s, mark) >= NT);
            }
        else
            assert_int_equal(count(s, "\"cat\":\"ready\""), 0);
        free(s);
    }
    /* The tool's loader reads the files and finds every phase of every tensor. */
    char check[600], cmd[2048];
    tool_path(check, sizeof check, "tests/observe/tlcheck.py");
    if (access(check, R_OK) == 0 && access("/usr/bin/python3", X_OK) == 0) {
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s --ranks 3 --tensors %d --occurrences 9 "
                 "%s/job.rank0.json %s/job.rank1.json %s/job.rank2.json", check, NT, dir, dir, dir);
        assert_int_equal(system(cmd), 0);
    }
}

/* ---- start and stop at run time ---- */

static int runtime_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)size;
    (void)arg;
    char path[600];
    snprintf(path, sizeof path, "%s/rt.json", dir);
    RANK_CHECK(cfx_timeline_stop(ctx) == CFX_OK, "stop without a timeline");
    RANK_CHECK(cfx_timeline_start(ctx, NULL, 0) == CFX_ERR_INVALID_ARGUMENT, "NULL path");
    RANK_CHECK(cfx_timeline_start(ctx, path, 0) == CFX_OK, "start: %s", cfx_last_error());
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1];
    cfx_tensor x = tensor1d(v, shape, 4, CFX_FLOAT32);
    RANK_CHECK(allreduce_wait(ctx, "rt.a", &x, CFX_OP_SUM) == CFX_OK, "allreduce");
    RANK_CHECK(cfx_timeline_stop(ctx) == CFX_OK, "stop");
    /* Stopped: the file is complete now, on this rank. */
    char mine[600];
    snprintf(mine, sizeof mine, "%s/rt.rank%d.json", dir, rank);
    char *s = slurp(mine, NULL);
    RANK_CHECK(s && count(s, "\"name\":\"UNPACK\"") == 1 && s[strlen(s) - 2] == ']',
               "file after stop: %s", s ? s : "(missing)");
    free(s);
    RANK_CHECK(allreduce_wait(ctx, "rt.b", &x, CFX_OP_SUM) == CFX_OK, "allreduce while off");
    cfx_shutdown(ctx);
    RANK_CHECK(cfx_timeline_start(ctx, path, 0) == CFX_ERR_SHUT_DOWN, "start after shutdown");
    RANK_CHECK(cfx_timeline_stop(ctx) == CFX_OK, "stop after shutdown");
    return 0;
}

static void start_stop_at_run_time(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, runtime_rank, NULL, NULL), 0);
    assert_int_equal(cfx_timeline_start(NULL, "x", 0), CFX_ERR_NOT_INITIALIZED);
}

/* ---- the size cap ---- */

static void size_cap(void **state)
{
    (void)state;
    snprintf(tl_path, sizeof tl_path, "%s/cap.json", dir);
    tl_cap = 8192;
    int steps = 40;
    assert_int_equal(run_ranks(2, steps_rank, &steps, env_timeline), 0);
    tl_cap = 0;
    for (int r = 0; r < 2; r++) {
        char path[600];
        snprintf(path, sizeof path, "%s/cap.rank%d.json", dir, r);
        size_t len;
        char *s = slurp(path, &len);
        assert_non_null(s);
        assert_true(len <= 8192);
        assert_int_equal(count(s, "timeline size cap reached"), 1);
        free(s);
    }
}

/* ---- the writer alone: escaping, lanes, records ---- */

/* A timeline path whose directories do not exist yet is created; one under a file is refused. */
static void missing_directories(void **state)
{
    (void)state;
    char path[700];
    snprintf(path, sizeof path, "%s/new/deeper/tl.json", dir);
    cx_logger log = {CX_LOG_OFF, 0, 2, 0};
    cx_timeline *tl = NULL;
    assert_int_equal(cx_timeline_create(path, 0, 0, false, &log, &tl), CFX_OK);
    cx_timeline_destroy(tl);
    char *s = slurp(path, NULL);
    assert_non_null(s); /* a complete, empty trace */
    free(s);
    snprintf(path, sizeof path, "%s/new/deeper/tl.json/below.json", dir); /* tl.json is a file */
    tl = NULL;
    assert_int_equal(cx_timeline_create(path, 0, 0, false, &log, &tl), CFX_ERR_CONFIG);
    assert_null(tl);
    assert_non_null(strstr(cfx_last_error(), "cannot create directory"));
    assert_non_null(strstr(cfx_last_error(), "tl.json"));
}

static void writer_records(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/direct.json", dir);
    cx_logger log = {CX_LOG_OFF, 0, 2, 0};
    cx_timeline *tl;
    assert_int_equal(cx_timeline_create(path, 7, 0, false, &log, &tl), CFX_OK);
    cx_timeline_seen(tl, "a\nb\t\x01", 1.0, 1.5);
    cx_timeline_negotiated(tl, "a\nb\t\x01", 2.0);
    cx_timeline_negotiated(tl, "never seen", 2.0); /* no NEGOTIATE: no start known */
    cx_timeline_phase(tl, "a\nb\t\x01", CX_TL_COLLECTIVE, "ALLREDUCE", 2.0, 2.25, 64, 2);
    cx_timeline_mark(tl, "a\nb\t\x01", "rank 3 ready", 3, 1.75);
    cx_timeline_cycle(tl, 9, 1.0, 3.0);
    cx_timeline_destroy(tl);
    char *s = slurp(path, NULL);
    assert_non_null(s);
    assert_non_null(strstr(s, "\"args\":{\"name\":\"a\\u000ab\\u0009\\u0001\"}"));
    assert_non_null(strstr(s, "{\"name\":\"QUEUED\",\"cat\":\"queued\",\"ph\":\"X\",\"pid\":7,"
                              "\"tid\":1,\"ts\":1000000.000,\"dur\":500000.000}"));
    assert_non_null(strstr(s, "\"name\":\"NEGOTIATE\",\"cat\":\"negotiate\",\"ph\":\"X\",\"pid\":7,"
                              "\"tid\":1,\"ts\":1500000.000,\"dur\":500000.000}"));
    assert_non_null(strstr(s, "\"dur\":250000.000,\"args\":{\"bytes\":64,\"fused\":2}}"));
    assert_non_null(strstr(s, "\"args\":{\"rank\":3}}"));
    assert_non_null(strstr(s, "\"args\":{\"cycle\":9}}"));
    assert_int_equal(count(s, "\"cat\":\"negotiate\""), 1);
    assert_int_equal(count(s, "\"tid\":2,"), 2); /* "never seen": a lane, named and sorted */
    free(s);
}

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/cfx-test-timeline.XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rank_path_names),
        cmocka_unit_test(writer_records),
        cmocka_unit_test(three_ranks_every_phase),
        cmocka_unit_test(start_stop_at_run_time),
        cmocka_unit_test(size_cap),
        cmocka_unit_test(missing_directories),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
