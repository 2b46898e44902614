/* support - thread-rank jobs on the in-process transport for the unit tests (see support.h). */
#include "support.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "engine/context.h"
#include "transport/transport_local.h"

typedef struct rank_job {
    cx_local_world *world;
    int rank, size;
    rank_fn fn;
    void *arg;
    void (*tweak)(cx_config *cfg);
    int result;
} rank_job;

static void *rank_main(void *p)
{
    rank_job *j = p;
    cx_config cfg;
    if (cx_config_load(&cfg, NULL) != CFX_OK) {
        fprintf(stderr, "rank %d: config: %s\n", j->rank, cfx_last_error());
        j->result = 1;
        return NULL;
    }
    if (j->tweak)
        j->tweak(&cfg);
    cx_transport *t;
    cfx_context *ctx;
    if (cx_transport_local_create(j->world, j->rank, &t) != CFX_OK ||
        cx_context_create(t, &cfg, &ctx) != CFX_OK) {
        fprintf(stderr, "rank %d: context: %s\n", j->rank, cfx_last_error());
        j->result = 1;
        return NULL;
    }
    j->result = j->fn(ctx, j->rank, j->size, j->arg);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    return NULL;
}

int run_ranks(int size, rank_fn fn, void *arg, void (*tweak)(cx_config *cfg))
{
    cx_local_world *w;
    if (cx_local_world_create(size, &w) != CFX_OK)
        return size;
    rank_job *jobs = calloc((size_t)size, sizeof *jobs);
    pthread_t *threads = calloc((size_t)size, sizeof *threads);
    for (int r = 0; r < size; r++) {
        jobs[r] = (rank_job){w, r, size, fn, arg, tweak, 0};
        pthread_create(&threads[r], NULL, rank_main, &jobs[r]);
    }
    int failed = 0;
    for (int r = 0; r < size; r++) {
        pthread_join(threads[r], NULL);
        failed += jobs[r].result != 0;
    }
    cx_local_world_release(w);
    free(jobs);
    free(threads);
    return failed;
}

cfx_tensor tensor1d(void *data, int64_t *shape, int64_t n, cfx_dtype dtype)
{
    shape[0] = n;
    cfx_tensor t = {data, shape, 1, (int32_t)dtype, CFX_DEVICE_CPU, NULL};
    return t;
}

cfx_status allreduce_wait(cfx_context *ctx, const char *name, cfx_tensor *t, cfx_reduce_op op)
{
    cfx_handle h;
    cfx_status st = cfx_allreduce_async(ctx, name, t, NULL, op, 1.0, 1.0, &h);
    if (st)
        return st;
    st = cfx_wait(ctx, h, 60);
    cfx_handle_release(ctx, h);
    return st;
}

void run_world_threads(int n, void *(*fn)(void *), void *jobs, size_t job_size)
{
    cx_local_world *w;
    if (cx_local_world_create(n, &w) != CFX_OK) {
        fprintf(stderr, "run_world_threads: %s\n", cfx_last_error());
        abort();
    }
    pthread_t *threads = calloc((size_t)n, sizeof *threads);
    if (!threads)
        abort();
    for (int r = 0; r < n; r++) {
        world_rank *at = (world_rank *)((char *)jobs + (size_t)r * job_size);
        at->world = w;
        at->rank = r;
        pthread_create(&threads[r], NULL, fn, at);
    }
    for (int r = 0; r < n; r++)
        pthread_join(threads[r], NULL);
    free(threads);
    cx_local_world_release(w);
}

cfx_status open_world_rank(const world_rank *at, const cx_config *cfg, cfx_status status,
                           cfx_context **out, char *msg, size_t len)
{
    cx_transport *t = NULL;
    *out = NULL;
    if (!status)
        status = cx_transport_local_create(at->world, at->rank, &t);
    if (!status)
        status = cx_context_create(t, cfg, out);
    snprintf(msg, len, "%s", status ? cx_error_message() : "");
    return status;
}
