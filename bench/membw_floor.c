/*
 * membw_floor - the memory-bandwidth floor of an allreduce on this machine.
 *
 *   cfx_membw_floor [--ranks N] [--reps R] BYTES...
 *
 * For each BYTES: N processes (fork) map one shared region holding every rank's float32 buffer;
 * process i sums block i of all N buffers, in rank order, and writes the sum back into block i of
 * every buffer, in place. It goes strip by strip (16 KiB): the sum of a strip is formed in a small
 * private buffer that stays in cache, then copied into each rank's buffer, whose lines were just
 * read and are still cached, so the writes cost no extra reads. Every process reads its block of
 * every buffer once and writes it once, and there is no separate result to write-allocate. That is
 * the least an in-place allreduce of these bytes can move: what it must do even when every rank's
 * tensors live in shared memory (cfx_alloc) and nothing is copied in or out. Tensors in private
 * memory need more. Also reported: one process's memcpy bandwidth and N processes copying at once.
 *
 * The same floor on huge pages: shared anonymous memory (shmem) gets transparent huge pages only where
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled allows (`never` on many hosts), so floor_hp runs
 * the same blocks in N threads of one process over private memory that asked for huge pages
 * (2 MiB-aligned, madvise(MADV_HUGEPAGE)): the floor for buffers that have them, as an MPI baseline
 * on NumPy's buffers does. Its line says the share of the region the kernel backed with huge pages.
 *
 * Output: CSV lines "floor,<bytes>,<ranks>,<median_s>,<min_s>",
 * "floor_hp,<bytes>,<ranks>,<median_s>,<min_s>,<huge page share>" and
 * "memcpy,<bytes>,<procs>,<median_s>,<min_s>" (GB/s is bytes / time), for bench/run.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REPS 64

typedef struct shared {
    _Alignas(64) atomic_uint arrived;
    _Alignas(64) atomic_uint generation;
    double times[MAX_REPS]; /* written by process 0 */
} shared;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void barrier(shared *s, unsigned n)
{
    unsigned gen = atomic_load(&s->generation);
    if (atomic_fetch_add(&s->arrived, 1) == n - 1) {
        atomic_store(&s->arrived, 0);
        atomic_fetch_add(&s->generation, 1);
    } else {
        while (atomic_load(&s->generation) == gen)
            sched_yield();
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Runs `work` in n processes `reps` times between barriers; prints the median and minimum. */
typedef void (*work_fn)(int rank, int n, float *region, size_t count);
static int run(const char *label, int n, int reps, size_t bytes, size_t region_bytes, work_fn work)
{
    shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    float *region = mmap(NULL, region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED || region == MAP_FAILED) {
        perror("membw_floor: mmap");
        return 1;
    }
    memset(region, 0, region_bytes); /* fault every page in before timing */
    for (size_t i = 0; i < region_bytes / sizeof(float); i++)
        region[i] = (float)(i % 1000);
    size_t count = bytes / sizeof(float);
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("membw_floor: fork");
            return 1;
        }
        if (pid == 0) {
            work(r, n, region, count); /* warm-up */
            for (int k = 0; k < reps; k++) {
                barrier(s, (unsigned)n);
                double t0 = now();
                work(r, n, region, count);
                barrier(s, (unsigned)n);
                if (r == 0)
                    s->times[k] = now() - t0;
            }
            _exit(0);
        }
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int status = 0;
        wait(&status);
        failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    qsort(s->times, (size_t)reps, sizeof(double), cmp_double);
    if (!failed)
        printf("%s,%zu,%d,%.9g,%.9g\n", label, bytes, n, s->times[reps / 2], s->times[0]);
    munmap(region, region_bytes);
    munmap(s, sizeof *s);
    return failed;
}

/* ---- floor_hp: the same work in threads over private huge-page memory ---- */

typedef struct thread_arg {
    int rank, n, reps;
    size_t count;
    float *region;
    shared *s;
    work_fn work;
} thread_arg;

static void *thread_main(void *p)
{
    thread_arg *a = p;
    a->work(a->rank, a->n, a->region, a->count); /* warm-up */
    for (int k = 0; k < a->reps; k++) {
        barrier(a->s, (unsigned)a->n);
        double t0 = now();
        a->work(a->rank, a->n, a->region, a->count);
        barrier(a->s, (unsigned)a->n);
        if (a->rank == 0)
            a->s->times[k] = now() - t0;
    }
    return NULL;
}

/* AnonHugePages of the mapping holding p (/proc/self/smaps) over len: 0..1, or -1 if unreadable. */
static double huge_share(const void *p, size_t len)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512];
    int inside = 0;
    double kib = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char c;
        if (sscanf(line, "%lx-%lx %c", &lo, &hi, &c) == 3)
            inside = (uintptr_t)p >= lo && (uintptr_t)p < hi;
        else if (inside && !strncmp(line, "AnonHugePages:", 14)) {
            kib = strtod(line + 14, NULL);
            break;
        }
    }
    fclose(f);
    return kib < 0 ? -1 : (kib * 1024.0 / (double)len > 1 ? 1 : kib * 1024.0 / (double)len);
}

#define HUGE_PAGE ((size_t)2 << 20)

static int run_threads(const char *label, int n, int reps, size_t bytes, size_t region_bytes, work_fn work)
{
    shared *s = mmap(NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t len = (region_bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    char *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (s == MAP_FAILED || raw == MAP_FAILED) {
        perror("membw_floor: mmap");
        return 1;
    }
    float *region = (float *)(void *)(raw + (HUGE_PAGE - (uintptr_t)raw % HUGE_PAGE) % HUGE_PAGE);
    (void)madvise(region, len, MADV_HUGEPAGE); /* a hint: without THP the floor runs on 4 KiB pages */
    for (size_t i = 0; i < region_bytes / sizeof(float); i++)
        region[i] = (float)(i % 1000);
    double share = huge_share(region, len);
    pthread_t tid[64];
    thread_arg args[64];
    int started = 0, failed = 0;
    for (int r = 0; r < n && r < 64; r++) {
        args[r] = (thread_arg){r, n, reps, bytes / sizeof(float), region, s, work};
        if (pthread_create(&tid[r], NULL, thread_main, &args[r]) != 0) {
            failed = 1;
            break;
        }
        started++;
    }
    for (int r = 0; r < started; r++)
        pthread_join(tid[r], NULL);
    failed |= started != n;
    qsort(s->times, (size_t)reps, sizeof(double), cmp_double);
    if (!failed)
        printf("%s,%zu,%d,%.9g,%.9g,%.3f\n", label, bytes, n, s->times[reps / 2], s->times[0], share);
    else
        fprintf(stderr, "membw_floor: %s: could not start %d threads\n", label, n);
    munmap(raw, len + HUGE_PAGE);
    munmap(s, sizeof *s);
    return failed;
}

/* Floats per strip: 16 KiB, so that the strip's sum and the strip of every buffer it was read from
 * are still in L1/L2 when the sum is copied back. */
#define STRIP 4096

/* sum = a + b and sum += c over whole 64-byte lines: restrict parameters and a trip count that is a
 * multiple of the vector width let gcc -O2 vectorize them, so that the adds are not the limit. */
static void add2(float *restrict sum, const float *restrict a, const float *restrict b, size_t lines)
{
    for (size_t i = 0; i < lines * 16; i++)
        sum[i] = a[i] + b[i];
}

static void add1(float *restrict sum, const float *restrict c, size_t lines)
{
    for (size_t i = 0; i < lines * 16; i++)
        sum[i] += c[i];
}

/* region: n buffers of count floats (count is a multiple of 16: whole lines). Block `rank` of every
 * buffer becomes the sum of block `rank` over all buffers. The blocks start on 64-byte lines so
 * that no two processes write the same line. */
static void reduce_block(int rank, int n, float *region, size_t count)
{
    /* The sums grow with every repeat (to inf at many ranks and repeats): adds cost the same on inf,
     * only subnormals would be slow, and the values never shrink towards them. */
    static _Thread_local _Alignas(64) float strip[STRIP]; /* private to each process or thread */
    size_t lines = count / 16;
    size_t lo = lines * (size_t)rank / (size_t)n * 16, hi = lines * (size_t)(rank + 1) / (size_t)n * 16;
    for (size_t s = lo; s < hi; s += STRIP) {
        size_t len = hi - s < STRIP ? hi - s : STRIP;
        add2(strip, region + s, region + count + s, len / 16);
        for (int q = 2; q < n; q++)
            add1(strip, region + (size_t)q * count + s, len / 16);
        for (int q = 0; q < n; q++)
            memcpy(region + (size_t)q * count + s, strip, len * sizeof(float));
    }
}

/* region: per process a source and a destination of count floats. */
static void copy_own(int rank, int n, float *region, size_t count)
{
    (void)n;
    float *src = region + (size_t)rank * 2 * count;
    memcpy(src + count, src, count * sizeof(float));
}

int main(int argc, char **argv)
{
    int n = 2, reps = 11, status = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc) {
            n = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            size_t bytes = (size_t)strtoull(argv[i], NULL, 10) / 64 * 64;
            if (n < 2 || n > 64 || reps < 1 || reps > MAX_REPS || bytes == 0) {
                fprintf(stderr, "usage: cfx_membw_floor [--ranks 2..64] [--reps 1..%d] BYTES...\n",
                        MAX_REPS);
                return 2;
            }
            status |= run("floor", n, reps, bytes, bytes * (size_t)n, reduce_block);
            status |= run_threads("floor_hp", n, reps, bytes, bytes * (size_t)n, reduce_block);
            status |= run("memcpy", 1, reps, bytes, bytes * 2, copy_own);
            status |= run("memcpy", n, reps, bytes, bytes * 2 * (size_t)n, copy_own);
        }
    }
    return status;
}
