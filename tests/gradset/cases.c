/* cases - the gradient-set scenarios shared by the thread-rank and mpirun tests (see cases.h). */
#include "cases.h"
#include "../common/case_check.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


enum { NGRADS = 14 };

typedef struct grad_desc {
    int64_t shape[2];
    int64_t n;
    cfx_dtype dtype;
} grad_desc;

static grad_desc desc_of(int gid)
{
    grad_desc d = {{gid % 3 + 1, gid + 2}, 0, gid % 4 == 3 ? CFX_FLOAT64 : CFX_FLOAT32};
    d.n = d.shape[0] * d.shape[1];
    return d;
}

/* What rank r puts in element j of gradient gid, at a step and local pass. */
static double contribution(int r, int gid, int64_t j, int step, int pass)
{
    return (r + 1) * 2.0 + gid % 5 + (double)(j % 7) * 0.5 + step + pass * 0.25;
}

static void put(void *p, cfx_dtype dt, int64_t j, double v)
{
    if (dt == CFX_FLOAT64)
        ((double *)p)[j] = v;
    else
        ((float *)p)[j] = (float)v;
}

static double get(const void *p, cfx_dtype dt, int64_t j)
{
    return dt == CFX_FLOAT64 ? ((const double *)p)[j] : ((const float *)p)[j];
}

/* This rank's registration order: a rank-dependent rotation of a stride through the gradients. */
static int gid_at(int k, int rank) { return (k * 5 + rank * 3) % NGRADS; }

static char *grad_name(int gid, char *buf)
{
    sprintf(buf, "layer%02d.weight", gid);
    return buf;
}

/* Creates and fills a set of the NGRADS gradients; bufs[k] are this rank's buffers (registration
 * order), owned or malloc'ed. */
static cfx_status make_set(cfx_context *ctx, const char *name, const cfx_gradset_options *o,
                           cfx_gradset **set, void **bufs, int32_t *index)
{
    int rank = cfx_rank(ctx);
    cfx_status st = cfx_gradset_create(ctx, name, o, set);
    for (int k = 0; k < NGRADS && !st; k++) {
        int gid = gid_at(k, rank);
        grad_desc d = desc_of(gid);
        char n[32];
        bufs[k] = o->owned ? NULL : calloc((size_t)d.n, 8);
        cfx_tensor t = {bufs[k], d.shape, 2, d.dtype, CFX_DEVICE_CPU, NULL};
        st = cfx_gradset_add(*set, grad_name(gid, n), &t, &index[k]);
    }
    if (!st)
        st = cfx_gradset_commit(*set);
    for (int k = 0; k < NGRADS && !st && o->owned; k++)
        st = cfx_gradset_data(*set, index[k], &bufs[k]);
    return st;
}

static int check_results(cfx_context *ctx, void **bufs, int step, int passes, double prescale)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    for (int k = 0; k < NGRADS; k++) {
        int gid = gid_at(k, rank);
        grad_desc d = desc_of(gid);
        for (int64_t j = 0; j < d.n; j++) {
            double want = 0;
            for (int r = 0; r < size; r++)
                for (int p = 0; p < passes; p++)
                    want += prescale * contribution(r, gid, j, step, p);
            want /= size;
            double got = get(bufs[k], d.dtype, j);
            if (fabs(got - want) > 1e-5 * fabs(want)) {
                CASE_CHECK(0, "step %d gradient %d element %lld: %.9g, expected %.9g", step, gid,
                         (long long)j, got, want);
                return failures;
            }
        }
    }
    return failures;
}

int gs_case_steps(cfx_context *ctx, int owned)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    cfx_gradset_options o;
    CASE_OK(cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION));
    o.owned = owned;
    o.bucket_bytes = 64; /* many buckets: several gradients in some, alone in others */
    cfx_gradset *set = NULL;
    void *bufs[NGRADS];
    int32_t index[NGRADS];
    cfx_status st = make_set(ctx, owned ? "steps.owned" : "steps.borrowed", &o, &set, bufs, index);
    CASE_CHECK(st == CFX_OK, "make_set: %s", cfx_last_error());
    unsigned seed = 12345u + (unsigned)rank;
    for (int step = 0; step < 3 && !st; step++) {
        for (int k = 0; k < NGRADS; k++) {
            grad_desc d = desc_of(gid_at(k, rank));
            for (int64_t j = 0; j < d.n; j++)
                put(bufs[k], d.dtype, j, contribution(rank, gid_at(k, rank), j, step, 0));
        }
        int order[NGRADS];
        for (int k = 0; k < NGRADS; k++)
            order[k] = step == 0 ? NGRADS - 1 - k : k;
        if (step == 1)
            for (int k = NGRADS - 1; k > 0; k--) {
                seed = seed * 1103515245u + 12345u;
                int j = (int)((seed >> 8) % (unsigned)(k + 1)), tmp = order[k];
                order[k] = order[j];
                order[j] = tmp;
            }
        for (int k = 0; k < NGRADS; k++) {
            int i = order[k];
            if (rank == 0 && size > 1 && gid_at(i, rank) == 4)
                continue; /* unused here: reduced as it is by wait */
            CASE_OK(cfx_gradset_ready(set, index[i]));
        }
        CASE_OK(cfx_gradset_wait(set, 60.0));
        failures += check_results(ctx, bufs, step, 1, 1.0);
    }
    cfx_gradset_free(set);
    for (int k = 0; k < NGRADS && !owned; k++)
        free(bufs[k]);
    return failures;
}

int gs_case_accumulate(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx);
    cfx_gradset_options o;
    cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    o.accumulate_steps = 2;
    o.prescale = 0.5;
    cfx_gradset *set = NULL;
    void *bufs[NGRADS];
    int32_t index[NGRADS];
    CASE_OK(make_set(ctx, "accumulate", &o, &set, bufs, index));
    for (int step = 0; step < 2 && set; step++) {
        for (int pass = 0; pass < 2; pass++) {
            for (int k = NGRADS - 1; k >= 0; k--) { /* backward: accumulate, then mark */
                grad_desc d = desc_of(gid_at(k, rank));
                for (int64_t j = 0; j < d.n; j++) {
                    double prev = pass ? get(bufs[k], d.dtype, j) : 0.0;
                    put(bufs[k], d.dtype, j, prev + contribution(rank, gid_at(k, rank), j, step, pass));
                }
                CASE_OK(cfx_gradset_ready(set, index[k]));
            }
        }
        CASE_CHECK(cfx_gradset_ready(set, index[0]) == CFX_ERR_INVALID_ARGUMENT,
                 "a third ready in a step of accumulate_steps 2 was accepted");
        CASE_CHECK(strstr(cfx_last_error(), "marked ready") != NULL, "message: %s", cfx_last_error());
        CASE_OK(cfx_gradset_wait(set, 60.0));
        failures += check_results(ctx, bufs, step, 2, 0.5);
    }
    cfx_gradset_free(set);
    return failures;
}

int gs_case_mismatch(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    float buf[64];
    /* 1: the last rank has [4, 2] where the others have [2, 4]. */
    cfx_gradset_options o;
    cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    o.owned = 0;
    cfx_gradset *set = NULL;
    int32_t i0, i1;
    CASE_OK(cfx_gradset_create(ctx, "mismatch.shape", &o, &set));
    int64_t good[2] = {2, 4}, bad[2] = {4, 2}, one[1] = {3};
    cfx_tensor a = {buf, rank == size - 1 ? bad : good, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_tensor b = {buf + 16, one, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CASE_OK(cfx_gradset_add(set, "fc.bias", &b, &i1));
    CASE_OK(cfx_gradset_add(set, "fc.weight", &a, &i0));
    cfx_status st = cfx_gradset_commit(set);
    char want[128];
    snprintf(want, sizeof want, "on rank 0 but float32 [4, 2] on rank %d", size - 1);
    CASE_CHECK(st == CFX_ERR_MISMATCH, "commit returned %s", cfx_status_string(st));
    CASE_CHECK(strstr(cfx_last_error(), "'fc.weight' is float32 [2, 4]") &&
             strstr(cfx_last_error(), want), "message: %s", cfx_last_error());
    cfx_gradset_free(set);
    /* 2: rank 1 lacks a gradient. */
    CASE_OK(cfx_gradset_create(ctx, "mismatch.missing", &o, &set));
    CASE_OK(cfx_gradset_add(set, "fc.weight", &(cfx_tensor){buf, good, 2, CFX_FLOAT32,
                                                          CFX_DEVICE_CPU, NULL}, &i0));
    if (rank != 1)
        CASE_OK(cfx_gradset_add(set, "fc.bias", &b, &i1));
    st = cfx_gradset_commit(set);
    CASE_CHECK(st == CFX_ERR_MISMATCH, "commit returned %s", cfx_status_string(st));
    CASE_CHECK(strstr(cfx_last_error(), "gradient 'fc.bias' (float32 [3]) is registered on rank 0 "
                                      "but not on rank 1"), "message: %s", cfx_last_error());
    cfx_gradset_free(set);
    /* The context still works: a good set afterwards. */
    CASE_OK(cfx_gradset_create(ctx, "mismatch.after", &o, &set));
    for (int j = 0; j < 3; j++)
        buf[16 + j] = (float)(rank + j);
    CASE_OK(cfx_gradset_add(set, "fc.bias", &b, &i1));
    CASE_OK(cfx_gradset_commit(set));
    CASE_OK(cfx_gradset_wait(set, 60.0)); /* nothing marked: reduced as it is */
    for (int j = 0; j < 3; j++) {
        double want_v = (size - 1) / 2.0 + j;
        CASE_CHECK(fabs(buf[16 + j] - want_v) < 1e-5, "element %d: %g, expected %g", j, buf[16 + j],
                 want_v);
    }
    cfx_gradset_free(set);
    return failures;
}

typedef struct half_job {
    cfx_gradset *set;
    const int32_t *index;
    int from, to;
    int errors;
} half_job;

static void *mark_half(void *arg)
{
    half_job *h = arg;
    for (int k = h->to - 1; k >= h->from; k--)
        h->errors += cfx_gradset_ready(h->set, h->index[k]) != CFX_OK;
    return NULL;
}

int gs_case_threads(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx);
    cfx_gradset_options o;
    cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    o.bucket_bytes = 128;
    cfx_gradset *set = NULL;
    void *bufs[NGRADS];
    int32_t index[NGRADS];
    CASE_OK(make_set(ctx, "threads", &o, &set, bufs, index));
    for (int step = 0; step < 4 && set; step++) {
        for (int k = 0; k < NGRADS; k++) {
            grad_desc d = desc_of(gid_at(k, rank));
            for (int64_t j = 0; j < d.n; j++)
                put(bufs[k], d.dtype, j, contribution(rank, gid_at(k, rank), j, step, 0));
        }
        half_job jobs[2] = {{set, index, 0, NGRADS / 2, 0}, {set, index, NGRADS / 2, NGRADS, 0}};
        pthread_t th[2];
        for (int t = 0; t < 2; t++)
            pthread_create(&th[t], NULL, mark_half, &jobs[t]);
        for (int t = 0; t < 2; t++)
            pthread_join(th[t], NULL);
        CASE_CHECK(jobs[0].errors + jobs[1].errors == 0, "ready failed: %s", cfx_last_error());
        CASE_OK(cfx_gradset_wait(set, 60.0));
        failures += check_results(ctx, bufs, step, 1, 1.0);
    }
    cfx_gradset_free(set);
    return failures;
}

int gs_case_sum_int(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    cfx_gradset_options o;
    cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    o.op = CFX_OP_SUM;
    o.prescale = 2.0;
    cfx_gradset *set = NULL;
    int32_t ia, ib;
    int64_t na[1] = {1000}, nb[1] = {7};
    CASE_OK(cfx_gradset_create(ctx, "sum.int", &o, &set));
    CASE_OK(cfx_gradset_add(set, "counts", &(cfx_tensor){NULL, na, 1, CFX_INT32, CFX_DEVICE_CPU,
                                                       NULL}, &ia));
    CASE_OK(cfx_gradset_add(set, "totals", &(cfx_tensor){NULL, nb, 1, CFX_INT64, CFX_DEVICE_CPU,
                                                       NULL}, &ib));
    CASE_OK(cfx_gradset_commit(set));
    int32_t *a = NULL;
    int64_t *b = NULL;
    CASE_OK(cfx_gradset_data(set, ia, (void **)&a));
    CASE_OK(cfx_gradset_data(set, ib, (void **)&b));
    for (int step = 0; step < 2 && a && b; step++) {
        for (int j = 0; j < 1000; j++)
            a[j] = rank * 1000 + j + step;
        for (int j = 0; j < 7; j++)
            b[j] = (int64_t)rank << 33 | j;
        CASE_OK(cfx_gradset_ready(set, ib));
        CASE_OK(cfx_gradset_ready(set, ia));
        CASE_OK(cfx_gradset_wait(set, 60.0));
        for (int j = 0; j < 1000; j++) {
            int64_t want = 0;
            for (int r = 0; r < size; r++)
                want += 2 * (r * 1000 + j + step);
            if (a[j] != want) {
                CASE_CHECK(0, "counts[%d] = %d, expected %lld", j, a[j], (long long)want);
                break;
            }
        }
        for (int j = 0; j < 7; j++) {
            int64_t want = 0;
            for (int r = 0; r < size; r++)
                want += 2 * ((int64_t)r << 33 | j);
            CASE_CHECK(b[j] == want, "totals[%d] = %lld, expected %lld", j, (long long)b[j],
                     (long long)want);
        }
    }
    cfx_gradset_free(set);
    return failures;
}

int gs_case_shutdown_pending(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx);
    cfx_gradset_options o;
    cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    cfx_gradset *set = NULL;
    void *bufs[NGRADS];
    int32_t index[NGRADS];
    CASE_OK(make_set(ctx, "shutdown", &o, &set, bufs, index));
    cfx_handle h = 0; /* every rank has committed (and attached) before rank 0 stops */
    CASE_OK(cfx_barrier_async(ctx, &h));
    CASE_OK(cfx_wait(ctx, h, 60.0));
    cfx_handle_release(ctx, h);
    if (rank == 0) {
        struct timespec pause = {0, 100 * 1000 * 1000}; /* the others mark and wait meanwhile */
        nanosleep(&pause, NULL);
        CASE_OK(cfx_shutdown(ctx));
        cfx_status st = cfx_gradset_wait(set, 30.0);
        CASE_CHECK(st == CFX_ERR_SHUT_DOWN, "wait after shutdown: %s", cfx_status_string(st));
    } else {
        for (int k = 0; k < NGRADS; k++) { /* rank 0 may have stopped the job already */
            cfx_status rs = cfx_gradset_ready(set, index[k]);
            CASE_CHECK(rs == CFX_OK || rs == CFX_ERR_SHUT_DOWN, "ready: %s", cfx_last_error());
        }
        cfx_status st = cfx_gradset_wait(set, 30.0);
        CASE_CHECK(st == CFX_ERR_SHUT_DOWN, "pending wait: %s (%s)", cfx_status_string(st),
                 cfx_last_error());
        CASE_CHECK(strstr(cfx_last_error(), "gradient set 'shutdown'") &&
                 strstr(cfx_last_error(), "rank"), "message: %s", cfx_last_error());
        CASE_CHECK(cfx_gradset_ready(set, index[0]) == CFX_ERR_SHUT_DOWN, "ready after the stop");
    }
    cfx_gradset_free(set);
    return failures;
}

int gs_case_errors(cfx_context *ctx)
{
    int failures = 0;
    cfx_gradset_options o;
    CASE_CHECK(cfx_gradset_options_init(&o, 99) == CFX_ERR_VERSION, "unknown options version");
    cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
    cfx_gradset *set = NULL;
    o.accumulate_steps = 0;
    CASE_CHECK(cfx_gradset_create(ctx, "bad", &o, &set) == CFX_ERR_INVALID_ARGUMENT && !set,
             "accumulate_steps 0 accepted");
    o.accumulate_steps = 1;
    o.prescale = NAN;
    CASE_CHECK(cfx_gradset_create(ctx, "bad", &o, &set) == CFX_ERR_INVALID_ARGUMENT, "NaN prescale");
    CASE_CHECK(strstr(cfx_last_error(), "finite") != NULL, "message: %s", cfx_last_error());
    o.prescale = 1.0;
    CASE_CHECK(cfx_gradset_create(NULL, "x", &o, &set) == CFX_ERR_NOT_INITIALIZED, "NULL context");
    CASE_OK(cfx_gradset_create(ctx, "errors", NULL, &set));
    float data[4];
    int64_t n[1] = {4};
    int32_t i;
    cfx_tensor t = {data, n, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    CASE_CHECK(cfx_gradset_add(set, "w", &t, &i) == CFX_ERR_INVALID_ARGUMENT,
             "data in an owned set accepted");
    t.data = NULL;
    CASE_OK(cfx_gradset_add(set, "w", &t, &i));
    CASE_CHECK(cfx_gradset_add(set, "w", &t, &i) == CFX_ERR_DUPLICATE_NAME, "duplicate name");
    CASE_CHECK(strstr(cfx_last_error(), "'w'") != NULL, "message: %s", cfx_last_error());
    t.dtype = 99;
    CASE_CHECK(cfx_gradset_add(set, "v", &t, &i) == CFX_ERR_INVALID_ARGUMENT, "bad dtype");
    CASE_CHECK(cfx_gradset_ready(set, 0) == CFX_ERR_INVALID_ARGUMENT, "ready before commit");
    CASE_CHECK(strstr(cfx_last_error(), "not committed") != NULL, "message: %s", cfx_last_error());
    CASE_OK(cfx_gradset_commit(set));
    CASE_CHECK(cfx_gradset_ready(set, 5) == CFX_ERR_INVALID_ARGUMENT, "index out of range");
    CASE_CHECK(cfx_gradset_add(set, "late", &t, &i) == CFX_ERR_INVALID_ARGUMENT, "add after commit");
    CASE_CHECK(cfx_gradset_wait(set, NAN) == CFX_ERR_INVALID_ARGUMENT, "NaN timeout");
    CASE_OK(cfx_gradset_wait(set, 60.0));
    cfx_gradset_free(set);
    cfx_gradset_free(NULL);
    return failures;
}

/* The plan's small first bucket: gradients as backward produces them (the last registered first),
 * small ones that fill the first bucket to just under 1 MiB, then one that no longer fits, then
 * large ones (several MiB). With bucket_bytes 0 (the default: first bucket 1 MiB, then the default
 * size) and with bucket_bytes 96 KiB (below 1 MiB: every bucket, the first too, at most that), the
 * gradients are marked ready one by one, last registered first, and every element must equal the
 * average over ranks computed here. */
enum { FB_SMALL = 24, FB_GRADS = FB_SMALL + 3 };

static int64_t fb_count(int k)
{
    /* registration order: two large (3 MiB, 2 MiB of float32), one of 300 KiB, then FB_SMALL of
     * 40 KiB (960 KiB in all: they alone fit the first bucket) */
    return k == 0 ? 786432 : k == 1 ? 524288 : k == 2 ? 76800 : 10240;
}

static int first_bucket_steps(cfx_context *ctx, int64_t bucket_bytes, const char *name)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    cfx_gradset_options o;
    CASE_OK(cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION));
    o.bucket_bytes = bucket_bytes;
    cfx_gradset *set = NULL;
    int32_t index[FB_GRADS];
    float *bufs[FB_GRADS] = {0};
    int64_t shape[FB_GRADS][1];
    CASE_OK(cfx_gradset_create(ctx, name, &o, &set));
    for (int k = 0; k < FB_GRADS && set; k++) {
        char n[32];
        shape[k][0] = fb_count(k);
        snprintf(n, sizeof n, "fb%02d.weight", k);
        CASE_OK(cfx_gradset_add(set, n, &(cfx_tensor){NULL, shape[k], 1, CFX_FLOAT32, CFX_DEVICE_CPU,
                                                     NULL}, &index[k]));
    }
    CASE_OK(cfx_gradset_commit(set));
    for (int k = 0; k < FB_GRADS && set; k++)
        CASE_OK(cfx_gradset_data(set, index[k], (void **)&bufs[k]));
    for (int step = 0; step < 2 && bufs[FB_GRADS - 1]; step++) {
        for (int k = FB_GRADS - 1; k >= 0; k--) { /* backward's order: fill, then mark ready */
            for (int64_t j = 0; j < fb_count(k); j++)
                bufs[k][j] = (float)contribution(rank, k, j, step, 0);
            CASE_OK(cfx_gradset_ready(set, index[k]));
        }
        CASE_OK(cfx_gradset_wait(set, 60.0));
        for (int k = 0; k < FB_GRADS; k++)
            for (int64_t j = 0; j < fb_count(k); j++) {
                double want = 0;
                for (int r = 0; r < size; r++)
                    want += (float)contribution(r, k, j, step, 0);
                want /= size;
                if (fabs(bufs[k][j] - want) > 1e-5 * fabs(want)) {
                    CASE_CHECK(0, "%s step %d gradient %d element %lld: %.9g, expected %.9g", name, step,
                               k, (long long)j, (double)bufs[k][j], want);
                    k = FB_GRADS;
                    break;
                }
            }
    }
    cfx_gradset_free(set);
    return failures;
}

int gs_case_first_bucket(cfx_context *ctx)
{
    return first_bucket_steps(ctx, 0, "first_bucket.default") +
           first_bucket_steps(ctx, 96 << 10, "first_bucket.96k");
}
