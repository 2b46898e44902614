/* autotune - coordinate descent over a small grid of engine parameters (see autotune.h). */
#include "observe/autotune.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

enum { P_FUSION, P_CHUNK, P_CYCLE, P_COUNT };

/* Candidates per parameter: a few values around the defaults, wide enough to matter. */
static const double candidates[P_COUNT][5] = {
    {1 << 20, 4 << 20, 16 << 20, 64 << 20, 128 << 20},
    {256 << 10, 1 << 20, 4 << 20, 16 << 20, 0},
    {0.5, 1, 2, 5, 0},
};
static const int ncandidates[P_COUNT] = {5, 4, 4};
static const char *const param_names[P_COUNT] = {"fusion_threshold", "chunk_bytes", "cycle_time_ms"};

struct cx_autotune {
    cx_tune_params current;
    double window_s;
    const cx_logger *log;
    FILE *csv;
    int param, cand;       /* what is being measured; param == P_COUNT: settled */
    int warmups_left, repeats;
    double scores[CX_AUTOTUNE_REPEATS];
    double best_score[P_COUNT];
    int best_cand;
    double best_median;
    double window_start;   /* < 0: the next update opens a window */
    uint64_t window_bytes;
    int samples;
};

static void set_param(cx_tune_params *p, int which, double v)
{
    if (which == P_FUSION)
        p->fusion_threshold = (int64_t)v;
    else if (which == P_CHUNK)
        p->chunk_bytes = (int64_t)v;
    else
        p->cycle_time_ms = v;
}

cfx_status cx_autotune_create(const cx_tune_params *start, double window_s, const char *csv_path,
                              const cx_logger *log, cx_autotune **out)
{
    cx_autotune *at = calloc(1, sizeof *at);
    if (!at)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the autotuner");
    at->current = *start;
    at->window_s = window_s > 0 ? window_s : 0.5;
    at->log = log;
    at->window_start = -1;
    at->best_median = -1;
    at->warmups_left = 1;
    if (csv_path && csv_path[0]) {
        if (!(at->csv = fopen(csv_path, "w"))) {
            free(at);
            return cx_fail(CFX_ERR_CONFIG, "CFX_AUTOTUNE_LOG=\"%s\": cannot open for writing",
                           csv_path);
        }
        fprintf(at->csv, "sample,time_s,fusion_threshold,chunk_bytes,cycle_time_ms,"
                "bytes_per_s,kind\n");
        fflush(at->csv);
    }
    /* The first candidate of the first parameter starts at once. */
    set_param(&at->current, P_FUSION, candidates[P_FUSION][0]);
    *out = at;
    return CFX_OK;
}

void cx_autotune_destroy(cx_autotune *at)
{
    if (!at)
        return;
    if (at->csv)
        fclose(at->csv);
    free(at);
}

bool cx_autotune_settled(const cx_autotune *at) { return at->param >= P_COUNT; }
int cx_autotune_samples(const cx_autotune *at) { return at->samples; }

static void csv_row(cx_autotune *at, double now, double score, const char *kind)
{
    if (!at->csv)
        return;
    fprintf(at->csv, "%d,%.6f,%lld,%lld,%g,%.1f,%s\n", at->samples, now,
            (long long)at->current.fusion_threshold, (long long)at->current.chunk_bytes,
            at->current.cycle_time_ms, score, kind);
    fflush(at->csv);
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++) /* insertion sort: n is tiny */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The current candidate is measured: keep it if best, move to the next candidate or parameter. */
static void next_candidate(cx_autotune *at, double now)
{
    double m = median(at->scores, at->repeats);
    if (m > at->best_median) {
        at->best_median = m;
        at->best_cand = at->cand;
    }
    at->repeats = 0;
    at->warmups_left = 1;
    if (++at->cand < ncandidates[at->param]) {
        set_param(&at->current, at->param, candidates[at->param][at->cand]);
        return;
    }
    double best = candidates[at->param][at->best_cand];
    set_param(&at->current, at->param, best);
    at->best_score[at->param] = at->best_median;
    cx_log(at->log, CX_LOG_INFO, "autotune", "%s: best %g (%.3g bytes/s)", param_names[at->param],
           best, at->best_median);
    at->param++;
    at->cand = 0;
    at->best_cand = 0;
    at->best_median = -1;
    if (at->param < P_COUNT) {
        set_param(&at->current, at->param, candidates[at->param][0]);
        return;
    }
    csv_row(at, now, at->best_score[P_COUNT - 1], "settled");
    cx_log(at->log, CX_LOG_INFO, "autotune", "settled: fusion threshold %lld B, chunk %lld B, "
           "cycle time %g ms (%.3g bytes/s)", (long long)at->current.fusion_threshold,
           (long long)at->current.chunk_bytes, at->current.cycle_time_ms,
           at->best_score[P_COUNT - 1]);
}

bool cx_autotune_update(cx_autotune *at, double now, uint64_t bytes, cx_tune_params *next)
{
    if (at->param >= P_COUNT)
        return false;
    if (at->window_start < 0) {
        at->window_start = now;
        at->window_bytes = 0;
        return false;
    }
    at->window_bytes += bytes;
    double elapsed = now - at->window_start;
    if (elapsed < at->window_s || at->window_bytes == 0)
        return false;
    double score = (double)at->window_bytes / elapsed;
    at->samples++;
    bool warmup = at->warmups_left > 0;
    csv_row(at, now, score, warmup ? "warmup" : "measure");
    at->window_start = now;
    at->window_bytes = 0;
    if (warmup) {
        at->warmups_left--;
        return false;
    }
    at->scores[at->repeats++] = score;
    if (at->repeats < CX_AUTOTUNE_REPEATS)
        return false;
    cx_tune_params before = at->current;
    next_candidate(at, now);
    if (!memcmp(&before, &at->current, sizeof before))
        return false;
    *next = at->current;
    return true;
}

cx_tune_params cx_autotune_params(const cx_autotune *at) { return at->current; }
