/*
 * Autotune: the tuner alone on a synthetic throughput surface (it must find the best grid point
 * and settle), and a 2-rank job on thread ranks with CFX_AUTOTUNE where the parameters change
 * while allreduces keep giving exact results, every rank ends with the coordinator's values, and
 * the CSV has one row per window and a "settled" row.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "observe/autotune.h"
#include "engine/context.h"
#include "support.h"
#include "protocol/wire.h"

static char csv_path[256];

static int count_lines(const char *path, const char *sub, int *distinct_fusion)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[512];
    int n = 0;
    long long seen[64];
    int nseen = 0;
    while (fgets(line, sizeof line, f)) {
        if (sub && !strstr(line, sub))
            continue;
        n++;
        long long fus;
        int sample;
        double t;
        if (distinct_fusion && sscanf(line, "%d,%lf,%lld", &sample, &t, &fus) == 3) {
            bool known = false;
            for (int i = 0; i < nseen; i++)
                known = known || seen[i] == fus;
            if (!known && nseen < 64)
                seen[nseen++] = fus;
        }
    }
    fclose(f);
    if (distinct_fusion)
        *distinct_fusion = nseen;
    return n;
}

/* Throughput peaking at fusion 16 MiB, chunk 4 MiB, cycle 2 ms (bytes per second). */
static double surface(const cx_tune_params *p)
{
    double f = (double)p->fusion_threshold / (16 << 20), c = (double)p->chunk_bytes / (4 << 20);
    double score = 1e9;
    score /= 1 + (f > 1 ? f - 1 : 1 / f - 1) * 0.3;
    score /= 1 + (c > 1 ? c - 1 : 1 / c - 1) * 0.2;
    score /= 1 + (p->cycle_time_ms > 2 ? p->cycle_time_ms - 2 : 2 / p->cycle_time_ms - 1) * 0.1;
    return score;
}

static void tuner_finds_best(void **state)
{
    (void)state;
    cx_logger log = {CX_LOG_OFF, 0, 2, 0};
    cx_tune_params start = {128 << 20, 1 << 20, 1.0}, next;
    cx_autotune *at;
    assert_int_equal(cx_autotune_create(&start, 0.1, csv_path, &log, &at), CFX_OK);
    cx_tune_params in_use = cx_autotune_params(at); /* the engine adopts the first candidate */
    assert_int_equal(in_use.fusion_threshold, 1 << 20);
    int changes = 0;
    double now = 0;
    cx_autotune_update(at, now, 0, &next); /* opens the first window */
    for (int i = 0; i < 10000 && !cx_autotune_settled(at); i++) {
        now += 0.05;
        /* Applied one update late, as the engine does (the warm-up window absorbs it). */
        uint64_t bytes = (uint64_t)(surface(&in_use) * 0.05);
        if (cx_autotune_update(at, now, bytes, &next)) {
            in_use = next;
            changes++;
        }
    }
    assert_true(cx_autotune_settled(at));
    assert_int_equal(in_use.fusion_threshold, 16 << 20);
    assert_int_equal(in_use.chunk_bytes, 4 << 20);
    assert_true(in_use.cycle_time_ms == 2.0);
    /* 13 candidates: 12 switches within the grid, at most one more to the best of the last. */
    assert_true(changes >= 12 && changes <= 13);
    /* One row per window: (1 warm-up + 3 repeats) x 13 candidates, a header and "settled". */
    assert_int_equal(cx_autotune_samples(at), 4 * 13);
    assert_false(cx_autotune_update(at, now + 1, 1000, &next)); /* settled: no more changes */
    cx_autotune_destroy(at);
    assert_int_equal(count_lines(csv_path, NULL, NULL), 1 + 4 * 13 + 1);
    assert_int_equal(count_lines(csv_path, ",settled", NULL), 1);
    assert_int_equal(count_lines(csv_path, ",warmup", NULL), 13);
}

/* The tuned parameters ride after the response list's items (CX_LIST_TUNED), bounds-checked. */
static void tuned_list_on_the_wire(void **state)
{
    (void)state;
    cx_response_list l = {0}, back;
    l.flags = CX_LIST_TUNED;
    l.tuned_fusion_threshold = 16 << 20;
    l.tuned_chunk_bytes = 4 << 20;
    l.tuned_cycle_time_ms = 2.5;
    cx_bytes b = {0};
    assert_int_equal(cx_encode_responses(&l, &b), CFX_OK);
    assert_int_equal(cx_decode_responses(b.data, b.len, &back), CFX_OK);
    assert_true(back.flags & CX_LIST_TUNED);
    assert_int_equal(back.tuned_fusion_threshold, 16 << 20);
    assert_int_equal(back.tuned_chunk_bytes, 4 << 20);
    assert_true(back.tuned_cycle_time_ms == 2.5);
    cx_response_list_free(&back);
    assert_int_not_equal(cx_decode_responses(b.data, b.len - 1, &back), CFX_OK); /* cut short */
    cx_response_list_free(&back);
    cx_bytes_free(&b);
    l.tuned_chunk_bytes = 8; /* below the minimum: refused */
    assert_int_equal(cx_encode_responses(&l, &b), CFX_OK);
    assert_int_not_equal(cx_decode_responses(b.data, b.len, &back), CFX_OK);
    cx_response_list_free(&back);
    cx_bytes_free(&b);
}

/* ---- the engine: 2 thread ranks with CFX_AUTOTUNE ---- */

static void with_autotune(cx_config *cfg)
{
    cfg->autotune = 1;
    cfg->autotune_window_s = 0.02;
    snprintf(cfg->autotune_log, sizeof cfg->autotune_log, "%s", csv_path);
}

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define NT 12
static int64_t final_cfg[2][3];

static int tuned_rank(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)arg;
    static const int64_t sizes[NT] = {1, 64, 256, 1000, 4096, 20000, 65536, 100000, 262144,
                                      300000, 1 << 20, 7};
    float *bufs[NT];
    for (int t = 0; t < NT; t++)
        bufs[t] = calloc((size_t)sizes[t], sizeof(float));
    double t0 = mono();
    int settled_at = -1;
    float go = 1;
    for (int step = 0; go > 0; step++) {
        cfx_handle h[NT + 1];
        int64_t shapes[NT + 1][1];
        for (int t = 0; t < NT; t++) {
            for (int64_t i = 0; i < sizes[t]; i += 997)
                bufs[t][i] = (float)(rank + t + step % 7);
            cfx_tensor x = tensor1d(bufs[t], shapes[t], sizes[t], CFX_FLOAT32);
            char name[32];
            snprintf(name, sizeof name, "g%d", t);
            RANK_CHECK(cfx_allreduce_async(ctx, name, &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h[t]) == CFX_OK,
                       "submit: %s", cfx_last_error());
        }
        /* Rank 0 decides when to stop (all ranks must run the same steps): a few steps after the
         * tuner settled (its CSV says so), or after 120 s (then the checks below fail). */
        if (rank == 0 && settled_at < 0 && count_lines(csv_path, ",settled", NULL) > 0)
            settled_at = step;
        go = rank == 0 && (settled_at < 0 || step < settled_at + 20) && mono() - t0 < 120.0 ? 1.0f : 0.0f;
        cfx_tensor g = tensor1d(&go, shapes[NT], 1, CFX_FLOAT32);
        RANK_CHECK(cfx_allreduce_async(ctx, "go", &g, NULL, CFX_OP_SUM, 1.0, 1.0, &h[NT]) == CFX_OK,
                   "submit go");
        for (int t = 0; t <= NT; t++) {
            RANK_CHECK(cfx_wait(ctx, h[t], 60) == CFX_OK, "wait: %s", cfx_handle_message(ctx, h[t]));
            cfx_handle_release(ctx, h[t]);
        }
        for (int t = 0; t < NT; t++) {
            float want = (float)(size * (t + step % 7) + size * (size - 1) / 2);
            for (int64_t i = 0; i < sizes[t]; i += 997)
                RANK_CHECK(bufs[t][i] == want, "step %d tensor %d: %g, expected %g", step, t,
                           bufs[t][i], want);
        }
    }
    for (int t = 0; t < NT; t++)
        free(bufs[t]);
    cfx_shutdown(ctx); /* the background thread is done: its configuration can be read */
    final_cfg[rank][0] = ctx->cfg.fusion_threshold;
    final_cfg[rank][1] = ctx->cfg.chunk_bytes;
    final_cfg[rank][2] = (int64_t)(ctx->cfg.cycle_time_ms * 1000);
    return 0;
}

static void engine_tunes_and_settles(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(2, tuned_rank, NULL, with_autotune), 0);
    int distinct = 0;
    assert_true(count_lines(csv_path, ",measure", &distinct) >= 3 * 13);
    assert_true(distinct >= 5); /* every fusion candidate was tried */
    assert_int_equal(count_lines(csv_path, ",settled", NULL), 1);
    /* Every rank ends with the settled row's values. */
    FILE *f = fopen(csv_path, "r");
    char line[512], settled[512] = "";
    while (fgets(line, sizeof line, f))
        if (strstr(line, ",settled"))
            snprintf(settled, sizeof settled, "%s", line);
    fclose(f);
    int sample;
    double t, cyc, score;
    long long fus, chunk;
    assert_int_equal(sscanf(settled, "%d,%lf,%lld,%lld,%lf,%lf", &sample, &t, &fus, &chunk, &cyc,
                            &score), 6);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(final_cfg[r][0], fus);
        assert_int_equal(final_cfg[r][1], chunk);
        assert_int_equal(final_cfg[r][2], (int64_t)(cyc * 1000));
    }
}

static int setup(void **state)
{
    (void)state;
    snprintf(csv_path, sizeof csv_path, "/tmp/cfx-test-autotune.%d.csv", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(csv_path);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tuner_finds_best),
        cmocka_unit_test(tuned_list_on_the_wire),
        cmocka_unit_test(engine_tunes_and_settles),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
