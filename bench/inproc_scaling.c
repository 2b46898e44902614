/*
 * inproc_scaling - the cache path's cost per step per tensor on the in-process transport, at 2, 8,
 * 32 and 64 thread ranks (issue 7: it must grow with the number of tensors, not tensors x ranks).
 *
 * Every rank is a thread with its own context over one local world (engine internals:
 * transport_local.h, context.h; links conflux_internal). Each step every rank submits the same T
 * one-element float32 allreduces (named, so after the first step they all take the response cache
 * path) and waits for them. Measured per step, after warm-up: the wall time, and the CPU time of
 * the background thread of rank 0 (the coordinator) and of the last rank (a worker), read with
 * pthread_getcpuclockid on the context's thread. On 2 cores, 64 ranks are 128 busy threads, so
 * the wall time mostly shows oversubscription; the per-thread CPU time is the figure to read.
 * Results are checked once per run (the sum over ranks of rank + 1).
 *
 * usage: inproc_scaling [--quick|--smoke] [--tensors T] [--ranks 2,8,32,64] [--raw FILE]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conflux/conflux.h"
#include "engine/context.h"
#include "transport/transport_local.h"

typedef struct shared {
    int size, tensors, warmup, reps;
    pthread_barrier_t bar;
    cfx_context **ctx; /* per rank, for rank 0 to read the background threads' clocks */
    double *wall, *coord, *worker; /* per repeat */
    int failed;
} shared;

typedef struct job {
    shared *sh;
    cx_local_world *world;
    int rank;
} job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double thread_cpu_s(pthread_t t) {
    clockid_t cid;
    struct timespec ts;
    if (pthread_getcpuclockid(t, &cid) != 0 || clock_gettime(cid, &ts) != 0) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int step(cfx_context *ctx, int rank, int tensors, float *vals, cfx_handle *h, char (*names)[32]) {
    for (int i = tensors; i-- > 0;) {
        vals[i] = (float)(rank + 1);
        cfx_tensor t = {&vals[i], NULL, 0, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        if (cfx_allreduce_async(ctx, names[i], &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h[i]) != CFX_OK) {
            fprintf(stderr, "rank %d: allreduce_async: %s\n", rank, cfx_last_error());
            return 1;
        }
    }
    for (int i = tensors; i-- > 0;) {
        if (cfx_wait(ctx, h[i], 120.0) != CFX_OK) {
            fprintf(stderr, "rank %d: wait: %s\n", rank, cfx_handle_message(ctx, h[i]));
            return 1;
        }
        cfx_handle_release(ctx, h[i]);
    }
    return 0;
}

static void *rank_main(void *p) {
    job *j = p;
    shared *sh = j->sh;
    cx_config cfg;
    cx_transport *t = NULL;
    cfx_context *ctx = NULL;
    if (cx_config_load(&cfg, NULL) != CFX_OK || cx_transport_local_create(j->world, j->rank, &t) != CFX_OK ||
        cx_context_create(t, &cfg, &ctx) != CFX_OK) {
        fprintf(stderr, "rank %d: context: %s\n", j->rank, cfx_last_error());
        exit(2); /* the other ranks would wait forever */
    }
    sh->ctx[j->rank] = ctx;
    float *vals = calloc((size_t)sh->tensors, sizeof *vals);
    cfx_handle *h = calloc((size_t)sh->tensors, sizeof *h);
    char(*names)[32] = calloc((size_t)sh->tensors, sizeof *names);
    for (int i = 0; i < sh->tensors; i++) snprintf(names[i], sizeof names[i], "inproc.%d", i);
    int bad = step(ctx, j->rank, sh->tensors, vals, h, names);
    float want = (float)(sh->size * (sh->size + 1) / 2);
    for (int i = 0; i < sh->tensors && !bad; i++)
        if (vals[i] != want) {
            fprintf(stderr, "rank %d: tensor %d = %g, want %g\n", j->rank, i, (double)vals[i], (double)want);
            bad = 1;
        }
    if (bad) __atomic_store_n(&sh->failed, 1, __ATOMIC_SEQ_CST);
    pthread_barrier_wait(&sh->bar);
    for (int r = 0; r < sh->warmup + sh->reps; r++) {
        double w0 = 0, c0 = 0, k0 = 0;
        pthread_barrier_wait(&sh->bar);
        if (j->rank == 0) {
            c0 = thread_cpu_s(sh->ctx[0]->thread);
            k0 = thread_cpu_s(sh->ctx[sh->size - 1]->thread);
            w0 = now_s();
        }
        pthread_barrier_wait(&sh->bar);
        if (step(ctx, j->rank, sh->tensors, vals, h, names)) __atomic_store_n(&sh->failed, 1, __ATOMIC_SEQ_CST);
        pthread_barrier_wait(&sh->bar);
        if (j->rank == 0 && r >= sh->warmup) {
            sh->wall[r - sh->warmup] = now_s() - w0;
            sh->coord[r - sh->warmup] = thread_cpu_s(sh->ctx[0]->thread) - c0;
            sh->worker[r - sh->warmup] = thread_cpu_s(sh->ctx[sh->size - 1]->thread) - k0;
        }
    }
    pthread_barrier_wait(&sh->bar); /* nobody shuts down while rank 0 reads the clocks */
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    free(vals);
    free(h);
    free(names);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void stats(double *x, int n, double *med, double *mn, double *mx) {
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    *med = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
    *mn = x[0];
    *mx = x[n - 1];
}

int main(int argc, char **argv) {
    int tensors = 1000, warmup = 3, reps = 10, smoke = 0;
    const char *ranks_arg = "2,8,32,64", *raw = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) warmup = 1, reps = 5;
        else if (!strcmp(argv[i], "--smoke")) warmup = 0, reps = 1, smoke = 1;
        else if (!strcmp(argv[i], "--tensors") && i + 1 < argc) tensors = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks_arg = argv[++i];
        else if (!strcmp(argv[i], "--raw") && i + 1 < argc) raw = argv[++i];
        else {
            fprintf(stderr, "usage: inproc_scaling [--quick|--smoke] [--tensors T] [--ranks 2,8,32,64] [--raw FILE]\n");
            return 2;
        }
    }
    if (tensors < 1) tensors = 1;
    FILE *out = fopen(raw ? raw : "/dev/null", "w");
    if (!out) return 2;
    fprintf(out, "group,workload,tensors,bytes,method,reps,median_s,min_s,max_s,check\n");
    int failures = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", ranks_arg);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int size = atoi(tok);
        if (size < 1) continue;
        shared sh = {size, tensors, warmup, reps, {{0}}, NULL, NULL, NULL, NULL, 0};
        sh.ctx = calloc((size_t)size, sizeof *sh.ctx);
        sh.wall = calloc((size_t)reps, sizeof(double));
        sh.coord = calloc((size_t)reps, sizeof(double));
        sh.worker = calloc((size_t)reps, sizeof(double));
        pthread_barrier_init(&sh.bar, NULL, (unsigned)size);
        cx_local_world *w;
        if (cx_local_world_create(size, &w) != CFX_OK) return 2;
        job *jobs = calloc((size_t)size, sizeof *jobs);
        pthread_t *th = calloc((size_t)size, sizeof *th);
        for (int r = 0; r < size; r++) {
            jobs[r] = (job){&sh, w, r};
            pthread_create(&th[r], NULL, rank_main, &jobs[r]);
        }
        for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
        cx_local_world_release(w);
        failures += sh.failed;
        const char *check = sh.failed ? "FAIL" : "ok";
        char name[64];
        snprintf(name, sizeof name, "inproc_%dranks", size);
        double med, mn, mx;
        stats(sh.wall, reps, &med, &mn, &mx);
        fprintf(out, "inproc,%s,%d,%d,wall_per_step,%d,%.9g,%.9g,%.9g,%s\n", name, tensors, 4 * tensors, reps, med,
                mn, mx, check);
        printf("  inproc  %2d ranks x %d tensors: wall/step %10.3f us", size, tensors, med * 1e6);
        for (int k = 0; k < 2; k++) {
            double *x = k ? sh.worker : sh.coord;
            for (int i = 0; i < reps; i++) x[i] /= tensors;
            stats(x, reps, &med, &mn, &mx);
            fprintf(out, "inproc,%s,%d,%d,%s,%d,%.9g,%.9g,%.9g,%s\n", name, tensors, 4 * tensors,
                    k ? "worker_cpu_per_tensor" : "coordinator_cpu_per_tensor", reps, med, mn, mx, check);
            printf("  %s CPU/tensor/step %8.3f us", k ? "worker" : "coordinator", med * 1e6);
        }
        printf("  %s\n", check);
        fflush(stdout);
        pthread_barrier_destroy(&sh.bar);
        free(sh.ctx);
        free(sh.wall);
        free(sh.coord);
        free(sh.worker);
        free(jobs);
        free(th);
    }
    fclose(out);
    if (smoke) printf("inproc_scaling: smoke %s\n", failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
}
