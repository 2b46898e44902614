/* cases - subset-context scenarios shared by the thread-rank and mpirun tests (see cases.h). */
#include "cases.h"
#include "../common/case_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* Blocking SUM allreduce of one double on c. */
static cfx_status sum1(cfx_context *c, const char *name, double *v)
{
    int64_t one = 1;
    cfx_tensor t = {v, &one, 1, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
    cfx_handle h = 0;
    cfx_status st = cfx_allreduce_async(c, name, &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h);
    if (!st)
        st = cfx_wait(c, h, 60.0);
    if (h)
        cfx_handle_release(c, h);
    return st;
}

static int member_of(const int *ranks, int n, int r)
{
    for (int i = 0; i < n; i++)
        if (ranks[i] == r)
            return 1;
    return 0;
}

/* Checks a subset made from `ranks`: membership, its numbering and a sum over its members. */
static int check_subset(cfx_context *ctx, cfx_context *sub, const int *ranks, int n, const char *tag)
{
    int failures = 0, rank = cfx_rank(ctx);
    int in = member_of(ranks, n, rank);
    CASE_CHECK(in == (sub != NULL), "%s: member %d, got a context %d", tag, in, sub != NULL);
    if (!sub)
        return failures;
    int below = 0;
    for (int i = 0; i < n; i++)
        below += ranks[i] < rank;
    CASE_CHECK(cfx_size(sub) == n && cfx_rank(sub) == below, "%s: rank %d of %d, expected %d of %d",
             tag, cfx_rank(sub), cfx_size(sub), below, n);
    double v = rank + 1, want = 0;
    for (int i = 0; i < n; i++)
        want += ranks[i] + 1;
    CASE_OK(sum1(sub, tag, &v));
    CASE_CHECK(v == want, "%s: sum %g, expected %g", tag, v, want);
    return failures;
}

int ss_case_members(cfx_context *ctx)
{
    int failures = 0, size = cfx_size(ctx);
    int even[8], n_even = 0, rest[8], n_rest = 0;
    for (int r = 0; r < size; r++) {
        if (r % 2 == 0)
            even[n_even++] = r;
        if (r != 0)
            rest[n_rest++] = size - r; /* given in descending order */
    }
    cfx_context *a = NULL, *b = (cfx_context *)&failures;
    CASE_OK(cfx_context_create_subset(ctx, even, (size_t)n_even, &a));
    CASE_OK(cfx_context_create_subset(ctx, rest, (size_t)n_rest, &b));
    failures += check_subset(ctx, a, even, n_even, "even");
    failures += check_subset(ctx, b, rest, n_rest, "not-0");
    double v = 1; /* the parent still works beside them */
    CASE_OK(sum1(ctx, "parent", &v));
    CASE_CHECK(v == size, "parent sum %g", v);
    if (a) {
        CASE_OK(cfx_shutdown(a));
        cfx_context_free(a);
    }
    if (b) {
        CASE_OK(cfx_shutdown(b));
        cfx_context_free(b);
    }
    return failures;
}

int ss_case_overlapping(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    int lo[2] = {0, 1}, hi[2] = {size - 2, size - 1};
    cfx_context *a = NULL, *b = NULL;
    CASE_OK(cfx_context_create_subset(ctx, lo, 2, &a));
    CASE_OK(cfx_context_create_subset(ctx, hi, 2, &b));
    for (int round = 0; round < 5; round++) {
        /* Both at once: submit on each, then wait for each. */
        double va = rank + round, vb = 10.0 * rank + round;
        int64_t one = 1;
        cfx_tensor ta = {&va, &one, 1, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
        cfx_tensor tb = {&vb, &one, 1, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
        cfx_handle ha = 0, hb = 0;
        if (a)
            CASE_OK(cfx_allreduce_async(a, "x", &ta, NULL, CFX_OP_SUM, 1.0, 1.0, &ha));
        if (b)
            CASE_OK(cfx_allreduce_async(b, "x", &tb, NULL, CFX_OP_SUM, 1.0, 1.0, &hb));
        if (a) {
            CASE_OK(cfx_wait(a, ha, 60.0));
            cfx_handle_release(a, ha);
            CASE_CHECK(va == 0 + 1 + 2.0 * round, "round %d low: %g", round, va);
        }
        if (b) {
            CASE_OK(cfx_wait(b, hb, 60.0));
            cfx_handle_release(b, hb);
            CASE_CHECK(vb == 10.0 * (2 * size - 3) + 2.0 * round, "round %d high: %g", round, vb);
        }
    }
    cfx_shutdown(a), cfx_shutdown(b);
    cfx_context_free(a);
    cfx_context_free(b);
    return failures;
}

int ss_case_repeated(cfx_context *ctx)
{
    int failures = 0, size = cfx_size(ctx);
    for (int round = 0; round < 6; round++) {
        int ranks[8], n = 0;
        for (int r = size - 1; r >= 0; r--) /* every rank but one, in descending order */
            if (r != round % size)
                ranks[n++] = r;
        cfx_context *s = NULL;
        CASE_OK(cfx_context_create_subset(ctx, ranks, (size_t)n, &s));
        char tag[32];
        snprintf(tag, sizeof tag, "round%d", round);
        failures += check_subset(ctx, s, ranks, n, tag);
        if (s)
            CASE_OK(cfx_shutdown(s));
        cfx_context_free(s);
    }
    return failures;
}

int ss_case_gradset(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    int ranks[8], n = 0;
    for (int r = 1; r < size; r++)
        ranks[n++] = r;
    if (size == 2)
        ranks[n++] = 0;
    cfx_context *s = NULL;
    CASE_OK(cfx_context_create_subset(ctx, ranks, (size_t)n, &s));
    if (s) {
        cfx_gradset *set = NULL;
        int64_t shape[1] = {5};
        int32_t i0;
        CASE_OK(cfx_gradset_create(s, "sub", NULL, &set));
        CASE_OK(cfx_gradset_add(set, "w", &(cfx_tensor){NULL, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU,
                                                      NULL}, &i0));
        CASE_OK(cfx_gradset_commit(set));
        float *w = NULL;
        CASE_OK(cfx_gradset_data(set, i0, (void **)&w));
        for (int step = 0; step < 3 && w; step++) {
            for (int j = 0; j < 5; j++)
                w[j] = (float)(rank * 4 + j + step);
            CASE_OK(cfx_gradset_ready(set, i0));
            CASE_OK(cfx_gradset_wait(set, 60.0));
            double want = 0;
            for (int i = 0; i < n; i++)
                want += ranks[i] * 4 + 2 + step;
            want /= n;
            CASE_CHECK(w[2] == (float)want, "step %d: %g, expected %g", step, w[2], want);
        }
        cfx_gradset_free(set);
        /* A subset of the subset: its first two ranks. */
        int inner[2] = {0, 1};
        cfx_context *ss = NULL;
        CASE_OK(cfx_context_create_subset(s, inner, 2, &ss));
        int parent_ranks[2] = {ranks[0] < ranks[n - 1] ? ranks[0] : ranks[n - 1], 0};
        int sorted[8];
        memcpy(sorted, ranks, sizeof(int) * (size_t)n);
        for (int i = 0; i < n; i++) /* ascending, as the subset numbers them */
            for (int j = i + 1; j < n; j++)
                if (sorted[j] < sorted[i]) {
                    int x = sorted[i];
                    sorted[i] = sorted[j];
                    sorted[j] = x;
                }
        parent_ranks[0] = sorted[0];
        parent_ranks[1] = sorted[1];
        failures += check_subset(ctx, ss, parent_ranks, 2, "inner");
        cfx_shutdown(ss);
        cfx_context_free(ss);
        cfx_shutdown(s);
    }
    cfx_context_free(s);
    return failures;
}

int ss_case_errors(cfx_context *ctx)
{
    int failures = 0, rank = cfx_rank(ctx), size = cfx_size(ctx);
    cfx_context *s = NULL;
    int bad[2] = {0, rank == size - 1 ? size + 3 : 1};
    cfx_status st = cfx_context_create_subset(ctx, bad, 2, &s);
    char want[96];
    snprintf(want, sizeof want, "rank %d listed rank %d, outside the context's %d ranks", size - 1,
             size + 3, size);
    CASE_CHECK(st == CFX_ERR_INVALID_ARGUMENT && !s, "out of range: %s", cfx_status_string(st));
    CASE_CHECK(strstr(cfx_last_error(), want), "message: %s", cfx_last_error());
    int dup[2] = {1, 1};
    st = cfx_context_create_subset(ctx, dup, 2, &s);
    CASE_CHECK(st == CFX_ERR_INVALID_ARGUMENT && strstr(cfx_last_error(), "twice"),
             "duplicate: %s: %s", cfx_status_string(st), cfx_last_error());
    int mine[1] = {rank == 1 ? 1 : 0};
    st = cfx_context_create_subset(ctx, mine, 1, &s);
    CASE_CHECK(st == CFX_ERR_INVALID_ARGUMENT && strstr(cfx_last_error(), "disagree") &&
             strstr(cfx_last_error(), "rank 0 passed [0], rank 1 passed [1]"),
             "disagreeing: %s: %s", cfx_status_string(st), cfx_last_error());
    CASE_CHECK(cfx_context_create_subset(ctx, rank == 0 ? NULL : mine, 1, &s) ==
             CFX_ERR_INVALID_ARGUMENT && strstr(cfx_last_error(), "rank 0 passed no list"),
             "NULL list on rank 0: %s", cfx_last_error());
    int many[9] = {0};
    CASE_CHECK(cfx_context_create_subset(ctx, many, (size_t)size + 1, &s) == CFX_ERR_INVALID_ARGUMENT &&
             strstr(cfx_last_error(), "more ranks than the context has"), "too long: %s",
             cfx_last_error());
    CASE_CHECK(cfx_context_create_subset(NULL, mine, 1, &s) == CFX_ERR_NOT_INITIALIZED, "NULL context");
    double v = 2;
    CASE_OK(sum1(ctx, "after", &v));
    CASE_CHECK(v == 2.0 * size, "the context after the errors: %g", v);
    return failures;
}

int ss_case_parent_shutdown(cfx_context *ctx)
{
    int failures = 0, size = cfx_size(ctx);
    int all[8];
    for (int r = 0; r < size; r++)
        all[r] = r;
    cfx_context *s = NULL;
    CASE_OK(cfx_context_create_subset(ctx, all, (size_t)size, &s));
    double v = 1;
    CASE_OK(sum1(s, "before", &v));
    CASE_OK(cfx_shutdown(ctx));
    CASE_CHECK(!cfx_is_running(s), "the subset still runs after its parent's shutdown");
    v = 1;
    cfx_status st = sum1(s, "after", &v);
    CASE_CHECK(st == CFX_ERR_SHUT_DOWN, "subset call after the parent's shutdown: %s",
             cfx_status_string(st));
    cfx_context_free(s);
    return failures;
}
