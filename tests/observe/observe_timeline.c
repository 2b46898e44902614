/*
 * A training-like job for the timeline tests under mpirun: every step allreduces the ResNet-50
 * gradient set (argv[2], bench/workloads/resnet50.tsv) in reverse registration order and checks the
 * sums. The timeline comes from CFX_TIMELINE (set by run_timeline.py).
 *
 *   observe_timeline run STEPS TSV     STEPS steps, then cfx_shutdown (files get their bracket)
 *   observe_timeline kill STEPS TSV    STEPS steps, then rank 0 waits for a flush and SIGKILLs itself
 *   observe_timeline bench STEPS TSV   prints the median step time (ms) on rank 0 (the overhead
 *                                      figure of docs/timeline.md; not a test)
 *   observe_timeline abtest STEPS TSV DIR  alternates blocks of 5 steps with the timeline off and
 *                                      on (cfx_timeline_start/stop, files in DIR), so machine noise
 *                                      hits both alike; prints both medians on rank 0
 *
 * Only the public ABI; Conflux initialises MPI itself. Exit status 0 when every sum was right.
 */
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conflux/conflux.h"

#define MAX_T 256

static int64_t counts[MAX_T];
static char names[MAX_T][96];
static int nt;

static int read_set(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[512];
    while (fgets(line, sizeof line, f) && nt < MAX_T) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char *tab = strchr(line, '\t');
        if (!tab)
            continue;
        *tab = '\0';
        int64_t n = 1;
        for (char *p = tab + 1; *p && *p != '\n';) {
            n *= strtoll(p, &p, 10);
            if (*p == 'x')
                p++;
        }
        snprintf(names[nt], sizeof names[nt], "%.95s", line);
        counts[nt++] = n;
    }
    fclose(f);
    return nt;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of every thread of this process (main, background, timeline writer). */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 4 || read_set(argv[3]) <= 0) {
        fprintf(stderr, "usage: %s run|kill|bench STEPS TENSORS.tsv\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    int steps = atoi(argv[2]);
    cfx_context *ctx;
    if (cfx_init(NULL, &ctx) != CFX_OK) {
        fprintf(stderr, "cfx_init: %s\n", cfx_last_error());
        return 2;
    }
    int rank = cfx_rank(ctx), size = cfx_size(ctx), bad = 0;
    float *bufs[MAX_T];
    for (int t = 0; t < nt; t++)
        bufs[t] = calloc((size_t)counts[t], sizeof(float));
    double *times = calloc((size_t)steps + 1, sizeof *times);
    int ab = !strcmp(mode, "abtest") && argc > 4;
    double *on = calloc((size_t)steps + 1, sizeof *on), *off = calloc((size_t)steps + 1, sizeof *off);
    int non = 0, noff = 0;
    double cpu0 = 0;
    for (int s = 0; s < steps; s++) {
        if (s == steps / 10)
            cpu0 = cpu_s();
        int timeline_on = ab && (s / 5) % 2 == 1;
        if (ab && s % 5 == 0) { /* block boundary: switch, outside the timed steps */
            char path[1024];
            snprintf(path, sizeof path, "%s/ab.json", argv[4]);
            cfx_status st = timeline_on ? cfx_timeline_start(ctx, path, 0) : cfx_timeline_stop(ctx);
            if (st != CFX_OK)
                fprintf(stderr, "rank %d: timeline %s: %s\n", rank, timeline_on ? "start" : "stop",
                        cfx_last_error());
        }
        double t0 = now_s();
        cfx_handle h[MAX_T];
        for (int k = 0; k < nt; k++) {
            int t = nt - 1 - k; /* gradients arrive in reverse order */
            bufs[t][0] = (float)(rank + s);
            int64_t shape[1] = {counts[t]};
            cfx_tensor x = {bufs[t], shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
            if (cfx_allreduce_async(ctx, names[t], &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h[t]) != CFX_OK) {
                fprintf(stderr, "rank %d: submit %s: %s\n", rank, names[t], cfx_last_error());
                return 1;
            }
        }
        for (int t = 0; t < nt; t++) {
            cfx_status st = cfx_wait(ctx, h[t], 60);
            float want = (float)(size * s + size * (size - 1) / 2);
            if (st != CFX_OK || bufs[t][0] != want) {
                fprintf(stderr, "rank %d step %d %s: status %d, %g (expected %g)\n", rank, s,
                        names[t], st, bufs[t][0], want);
                bad++;
            }
            cfx_handle_release(ctx, h[t]);
            bufs[t][0] = 0; /* the rest stays 0 */
        }
        times[s] = now_s() - t0;
        if (ab && s >= 10)
            (timeline_on ? on : off)[timeline_on ? non++ : noff++] = times[s];
    }
    if (ab && rank == 0) {
        qsort(on, (size_t)non, sizeof *on, cmp);
        qsort(off, (size_t)noff, sizeof *off, cmp);
        printf("median_off_ms %.4f median_on_ms %.4f steps %d %d\n", 1e3 * off[noff / 2],
               1e3 * on[non / 2], noff, non);
    }
    free(on);
    free(off);
    if (!strcmp(mode, "bench") && rank == 0) {
        int skip = steps / 10; /* warm-up */
        qsort(times + skip, (size_t)(steps - skip), sizeof *times, cmp);
        double cpu = (cpu_s() - cpu0) / (steps - skip); /* includes the writer's flushes */
        printf("median_step_ms %.4f cpu_ms_per_step %.4f\n", 1e3 * times[skip + (steps - skip) / 2],
               1e3 * cpu);
    }
    if (!strcmp(mode, "kill") && rank == 0) {
        usleep(400000); /* past the writer's 100 ms flush */
        raise(SIGKILL);
    }
    if (!strcmp(mode, "kill"))
        sleep(30); /* mpirun ends the job when rank 0 dies */
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    for (int t = 0; t < nt; t++)
        free(bufs[t]);
    free(times);
    return bad ? 1 : 0;
}
