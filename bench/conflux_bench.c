/*
 * conflux_bench - times Conflux allreduce through the public ABI against raw MPI baselines measured
 * in the same run, on the same bytes. Run under mpirun (bench/run does it); rank 0 writes raw rows.
 *
 * Workloads (all float32, SUM):
 *   latency  lone tensors of 4 B, 64 B, 1 KiB, 4 KiB: one allreduce enqueue -> completion per repeat;
 *            call_4B: 4 B allreduces back to back, time per call (the C side of Python's overhead)
 *   sweep    one tensor of 4 B ... 256 MiB (powers of 4)
 *   model    ResNet-50, VGG-16, BERT-base gradient sets (bench/workloads/NAME.tsv): every tensor submitted
 *            in reverse registration order, then wait for all
 *   many     1,000 and 10,000 tensors of 1 KiB
 * Methods: conflux (async allreduce of every tensor, wait all, release), conflux_shared (the same step
 * with every tensor in Conflux's shared tensor memory, cfx_alloc, which lets the engine reduce straight
 * from every local rank's tensors), mpi_flat (one MPI_Allreduce of the step's total bytes in one flat
 * buffer), mpi_per_tensor (one MPI_Allreduce per tensor, same order), mpi_chunk_{1,4,16}M (the flat
 * buffer as sequential chunks); for the model workloads also conflux_adasum (the conflux step with
 * CFX_OP_ADASUM: what the adaptive sum costs against the plain one, same tensors, same rounds).
 * Timing: MPI_Barrier, then MPI_Wtime around the step on every rank; the max over ranks of each repeat
 * (MPI_Reduce MAX) goes into the median/min/max. Warm-up repeats are not recorded.
 * Schedule (--schedule): blocks (default) runs, per workload, the baselines (each repeat times every
 * baseline back to back, rotating the order, so that noise hits them alike) with no Conflux context
 * alive, then a fresh context for the Conflux rows: an idle context's background thread (a bit-vector
 * allreduce every cycle) would otherwise tax the baselines. interleave keeps one context for the run
 * and puts Conflux into the same rounds as the baselines (the mixed-MPI-user case); phases runs all
 * baselines first, then one context. The Conflux rows are conflux and conflux_shared, timed in the same
 * rounds of the same context (each on its own copy of the tensors), so that their ratio comes from the
 * same rounds too. MPI runs at MPI_THREAD_MULTIPLE throughout, as Conflux needs.
 * Every Conflux method is checked once per workload before timing: rank r contributes
 * (r + 1) + ((7 i + j) mod 13) to element j of tensor i; the sum is known exactly.
 *
 * --compression: instead of the rows above, the conflux step with wire compression off and on
 * (conflux, conflux_fp16, conflux_bf16: cfx_allreduce_async_opts with CFX_COMPRESSION_NONE, FP16,
 * BF16), on the same private tensors in the same rounds, for a job that spans hosts (real ones, or
 * pretend ones with CFX_TEST_LOCAL_SIZE; a job on one host is refused, as nothing would be
 * compressed). The compressed methods are checked with values that are rarely 16-bit values
 * (the pattern above plus ((j mod 7) + 1) / 9): every result must be within the 16-bit rounding of
 * the exact sum (each host's partial sum rounded once when packed, each of the hosts - 1 combines
 * once), be a 16-bit value itself (proof that it travelled compressed) and be bitwise the same on
 * every rank. The baselines run too unless --no-mpi.
 * --wire-iface IFACE: also counts the bytes each host sends on IFACE (its tx_bytes in /sys, read by
 * local rank 0 of each host before the barrier that starts a step and after one that ends it),
 * summed over the hosts, per step: rows METHOD.wire_bytes (median/min/max in bytes, not seconds).
 * With --compression, a compressed step of a workload of 1 MiB or more that sends more than 0.7 x
 * the uncompressed step's bytes fails the check (the payload halves).
 *
 * --smoke: every workload once (no warm-up), results checked, nothing timed is asserted; exit 0/1.
 */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <mpi.h>

#ifndef CFX_BENCH_HAVE_CONFLUX
#define CFX_BENCH_HAVE_CONFLUX 1
#endif
#if CFX_BENCH_HAVE_CONFLUX
#include <conflux/conflux.h>
#endif

#define MAX_DIMS 8

typedef struct tensor_desc {
    char name[96];
    int ndim;
    int64_t shape[MAX_DIMS];
    size_t count; /* elements */
} tensor_desc;

typedef struct workload {
    char group[16];
    char name[48];
    int warmup, reps, inner; /* inner: back-to-back steps per timed repeat (time reported per step) */
    size_t n;
    tensor_desc *t;
    size_t total; /* elements */
} workload;

typedef struct result {
    double median, min, max;
    int reps;
} result;

static int g_rank, g_size;
static MPI_Comm g_comm; /* the bench's own communicator for baselines and timing */
static int g_local_rank;       /* rank among the ranks of this host (MPI_COMM_TYPE_SHARED) */
static char g_wire_path[256];  /* --wire-iface: this host's tx_bytes counter, else "" */
static int g_compression_mode; /* --compression */
static FILE *g_raw;     /* rank 0: raw rows */
static int g_failures;

static void die(const char *what) {
    fprintf(stderr, "[rank %d] conflux_bench: %s\n", g_rank, what);
    MPI_Abort(MPI_COMM_WORLD, 2);
    exit(2);
}

static void *xmalloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, (bytes + 63) / 64 * 64) != 0) die("out of memory");
    return p;
}

/* A buffer the kernel may back with 2 MiB transparent huge pages: 2 MiB-aligned, whole huge pages,
 * madvise(MADV_HUGEPAGE) (THP in `madvise` mode gives them only to regions that ask; NumPy asks for
 * its large arrays, so a Python user's MPI baseline has them). Free with free(). */
#define HUGE_PAGE ((size_t)2 << 20)
static void *xmalloc_huge(size_t bytes) {
    void *p = NULL;
    size_t len = (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    if (posix_memalign(&p, HUGE_PAGE, len ? len : HUGE_PAGE) != 0) die("out of memory");
#ifdef MADV_HUGEPAGE
    (void)madvise(p, len, MADV_HUGEPAGE); /* a hint: refused (no THP), the buffer still works */
#endif
    return p;
}

/* The share of [p, p + bytes) that the kernel backs with huge pages (AnonHugePages of the mapping
 * that holds p, from /proc/self/smaps), 0..1, or -1 when it cannot be read: the _hp rows say it in
 * their check column, so that a table never calls 4 KiB pages huge. */
static double huge_share(const void *p, size_t bytes) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f || bytes == 0) {
        if (f) fclose(f);
        return -1;
    }
    char line[512];
    int inside = 0;
    double kib = -1;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = a >= lo && a < hi;
        } else if (inside && !strncmp(line, "AnonHugePages:", 14)) {
            kib = strtod(line + 14, NULL);
            break;
        }
    }
    fclose(f);
    if (kib < 0) return -1;
    double share = kib * 1024.0 / (double)bytes;
    return share > 1 ? 1 : share;
}

/* ---- workload list ----------------------------------------------------------------------------- */

typedef enum mode { MODE_FULL, MODE_QUICK, MODE_SMOKE } mode;

static workload *g_wl;
static size_t g_nwl, g_capwl;

static workload *add_workload(const char *group, const char *name, int warmup, int reps, int inner,
                              size_t n) {
    if (g_nwl == g_capwl) {
        g_capwl = g_capwl ? 2 * g_capwl : 32;
        g_wl = realloc(g_wl, g_capwl * sizeof *g_wl);
        if (!g_wl) die("out of memory");
    }
    workload *w = &g_wl[g_nwl++];
    memset(w, 0, sizeof *w);
    snprintf(w->group, sizeof w->group, "%s", group);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->warmup = warmup;
    w->reps = reps;
    w->inner = inner;
    w->n = n;
    w->t = calloc(n ? n : 1, sizeof *w->t);
    if (!w->t) die("out of memory");
    return w;
}

static void set_1d(workload *w, size_t i, size_t count) {
    tensor_desc *t = &w->t[i];
    snprintf(t->name, sizeof t->name, "%s.%zu", w->name, i);
    t->ndim = 1;
    t->shape[0] = (int64_t)count;
    t->count = count;
    w->total += count;
}

static int pick(mode m, int full, int quick) { return m == MODE_FULL ? full : m == MODE_QUICK ? quick : 1; }

static void load_tsv(workload *w, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        char msg[1200];
        snprintf(msg, sizeof msg, "cannot open %.1000s: %s", path, strerror(errno));
        die(msg);
    }
    char line[512];
    size_t cap = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char *tab = strchr(line, '\t');
        if (!tab) continue;
        *tab = '\0';
        if (w->n == cap) {
            cap = cap ? 2 * cap : 64;
            w->t = realloc(w->t, cap * sizeof *w->t);
            if (!w->t) die("out of memory");
        }
        tensor_desc *t = &w->t[w->n];
        memset(t, 0, sizeof *t);
        snprintf(t->name, sizeof t->name, "%.40s.%.50s", w->name, line);
        t->count = 1;
        char *s = tab + 1;
        while (*s && *s != '\n' && t->ndim < MAX_DIMS) {
            char *end;
            long long d = strtoll(s, &end, 10);
            if (end == s || d < 0) die("bad dims in workload file");
            t->shape[t->ndim++] = d;
            t->count *= (size_t)d;
            s = (*end == 'x') ? end + 1 : end;
            if (*s == '\r') break;
        }
        w->total += t->count;
        w->n++;
    }
    fclose(f);
    if (w->n == 0) die("empty workload file");
}

static void build_workloads(mode m, const char *dir, const char *only) {
    static const size_t lone[] = {4, 64, 1024, 4096};
    static const char *lone_names[] = {"lat_4B", "lat_64B", "lat_1KiB", "lat_4KiB"};
    for (size_t k = 0; k < 4; k++) {
        workload *w = add_workload("latency", lone_names[k], pick(m, 100, 50) * (m != MODE_SMOKE),
                                   pick(m, 2000, 500), 1, 1);
        set_1d(w, 0, lone[k] / 4);
    }
    {
        workload *w = add_workload("latency", "call_4B", pick(m, 5, 2) * (m != MODE_SMOKE), pick(m, 50, 20),
                                   m == MODE_SMOKE ? 2 : 200, 1);
        set_1d(w, 0, 1);
    }
    for (size_t bytes = 4; bytes <= ((size_t)256 << 20); bytes *= 4) {
        char name[48];
        if (bytes < 1024) snprintf(name, sizeof name, "size_%zuB", bytes);
        else if (bytes < (1u << 20)) snprintf(name, sizeof name, "size_%zuKiB", bytes >> 10);
        else snprintf(name, sizeof name, "size_%zuMiB", bytes >> 20);
        int reps = bytes <= (64u << 10) ? pick(m, 200, 50)
                   : bytes <= (4u << 20) ? pick(m, 50, 15)
                   : bytes <= (64u << 20) ? pick(m, 10, 5)
                                          : pick(m, 5, 3);
        int warm = m == MODE_SMOKE ? 0 : bytes >= (64u << 20) ? 1 : pick(m, 3, 1);
        workload *w = add_workload("sweep", name, warm, reps, 1, 1);
        set_1d(w, 0, bytes / 4);
    }
    static const char *models[] = {"resnet50", "vgg16", "bert_base"};
    for (size_t k = 0; k < 3; k++) {
        workload *w = add_workload("model", models[k], m == MODE_SMOKE ? 0 : pick(m, 2, 1), pick(m, 10, 4), 1, 0);
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.tsv", dir, models[k]);
        load_tsv(w, path);
    }
    static const size_t many[] = {1000, 10000};
    for (size_t k = 0; k < 2; k++) {
        char name[48];
        snprintf(name, sizeof name, "many_%zuk_1KiB", many[k] / 1000);
        workload *w = add_workload("many", name, m == MODE_SMOKE ? 0 : pick(m, 3, 1), pick(m, 20, 5), 1, many[k]);
        for (size_t i = 0; i < many[k]; i++) set_1d(w, i, 256);
    }
    if (only && *only) { /* keep workloads whose name or group appears in the comma list */
        size_t kept = 0;
        for (size_t i = 0; i < g_nwl; i++) {
            char list[1024];
            snprintf(list, sizeof list, "%s", only);
            int keep = 0;
            for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ","))
                if (!strcmp(tok, g_wl[i].name) || !strcmp(tok, g_wl[i].group)) keep = 1;
            if (keep) g_wl[kept++] = g_wl[i];
            else free(g_wl[i].t);
        }
        g_nwl = kept;
    }
}

/* The spec file lets bench/torch_gloo.py time exactly the same tensors. */
static void write_spec(const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) die("cannot write the spec file");
    fprintf(f, "# conflux_bench workload spec: W group name warmup reps inner ntensors, then T name dims\n");
    for (size_t i = 0; i < g_nwl; i++) {
        workload *w = &g_wl[i];
        fprintf(f, "W %s %s %d %d %d %zu\n", w->group, w->name, w->warmup, w->reps, w->inner, w->n);
        for (size_t k = 0; k < w->n; k++) {
            fprintf(f, "T %s ", w->t[k].name);
            for (int d = 0; d < w->t[k].ndim; d++) fprintf(f, d ? "x%" PRId64 : "%" PRId64, w->t[k].shape[d]);
            if (w->t[k].ndim == 0) fprintf(f, "1");
            fprintf(f, "\n");
        }
    }
    fclose(f);
}

/* ---- buffers and the known-value pattern ------------------------------------------------------ */

/* Where a copy of a workload's tensors lives: private memory, or Conflux's shared tensor memory. */
typedef enum placement { PLACE_PRIVATE, PLACE_SHARED } placement;

#if CFX_BENCH_HAVE_CONFLUX
static void cfx_check(cfx_status s, const char *what) {
    if (s != CFX_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s: %s (%s)", what, cfx_status_string(s), cfx_last_error());
        die(msg);
    }
}

/* cfx_check for cfx_alloc / cfx_free of tensor i of w: the message names the workload and the bytes. */
static void cfx_check_tensor(cfx_status s, const char *call, const workload *w, size_t i) {
    if (s != CFX_OK) {
        char what[256];
        snprintf(what, sizeof what, "%s(%zu bytes) for %s of workload %s", call, w->t[i].count * sizeof(float),
                 w->t[i].name, w->name);
        cfx_check(s, what);
    }
}
#endif

/* One buffer per tensor of w (data[i] holds tensor i), touched once so that no first-touch page fault
 * falls into the timing. */
static float **alloc_tensors(workload *w, placement p) {
    float **data = xmalloc(w->n * sizeof *data);
    for (size_t i = 0; i < w->n; i++) {
        size_t bytes = w->t[i].count * sizeof(float);
        if (p == PLACE_PRIVATE) {
            data[i] = xmalloc(bytes);
        } else {
#if CFX_BENCH_HAVE_CONFLUX
            void *q = NULL;
            cfx_check_tensor(cfx_alloc(bytes, &q), "cfx_alloc", w, i);
            data[i] = q;
#else
            die("shared tensor memory needs Conflux");
#endif
        }
        memset(data[i], 0, bytes);
    }
    return data;
}

static void free_tensors(workload *w, float **data, placement p) {
    if (!data) return;
    for (size_t i = 0; i < w->n; i++) {
        if (p == PLACE_PRIVATE) {
            free(data[i]);
        } else {
#if CFX_BENCH_HAVE_CONFLUX
            cfx_check_tensor(cfx_free(data[i]), "cfx_free", w, i);
#endif
        }
    }
    free(data);
}

#if CFX_BENCH_HAVE_CONFLUX
static void zero_tensors(workload *w, float **data) {
    for (size_t i = 0; i < w->n; i++) memset(data[i], 0, w->t[i].count * sizeof(float));
}

static float pattern(int rank, size_t i, size_t j) { return (float)(rank + 1) + (float)((7 * i + j) % 13); }

static void fill_pattern(workload *w, float **data) {
    for (size_t i = 0; i < w->n; i++)
        for (size_t j = 0; j < w->t[i].count; j++) data[i][j] = pattern(g_rank, i, j);
}

/* 1 when every element equals the sum over ranks of pattern(). */
static int check_pattern(workload *w, float **data, char *why, size_t whylen) {
    const float base = (float)(g_size * (g_size + 1) / 2);
    for (size_t i = 0; i < w->n; i++)
        for (size_t j = 0; j < w->t[i].count; j++) {
            float want = base + (float)g_size * (float)((7 * i + j) % 13);
            if (data[i][j] != want) {
                snprintf(why, whylen, "%s element %zu = %g, want %g", w->t[i].name, j, (double)data[i][j],
                         (double)want);
                return 0;
            }
        }
    return 1;
}

#endif

/* ---- timing ------------------------------------------------------------------------------------ */

typedef void (*step_fn)(workload *w, void *arg);

typedef struct method {
    const char *name;
    step_fn fn;
    void *arg;
    const char *check; /* "ok"/"FAIL" for Conflux, "-" for the baselines */
    double *samples;
    double *wire;      /* --wire-iface: bytes on the wire per step, per repeat (rank 0) */
} method;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void emit(const workload *w, const char *name, result r, const char *check) {
    if (g_rank != 0) return;
    fprintf(g_raw, "%s,%s,%zu,%zu,%s,%d,%.9g,%.9g,%.9g,%s\n", w->group, w->name, w->n, w->total * sizeof(float),
            name, r.reps, r.median, r.min, r.max, check);
    fflush(g_raw);
    if (strstr(name, ".wire_bytes")) /* a count of bytes, not a time */
        printf("  %-9s %-16s %-24s median %12.3f MB  (min %.3f, max %.3f)  %s\n", w->group, w->name, name,
               r.median * 1e-6, r.min * 1e-6, r.max * 1e-6, check);
    else
        printf("  %-9s %-16s %-24s median %12.3f us  (min %.3f, max %.3f)  %s\n", w->group, w->name, name,
               r.median * 1e6, r.min * 1e6, r.max * 1e6, check);
    fflush(stdout);
}

/* The bytes this host has sent on the --wire-iface interface (local rank 0 reads; others: 0). */
static double wire_tx(void) {
    if (!g_wire_path[0] || g_local_rank != 0) return 0;
    FILE *f = fopen(g_wire_path, "r");
    unsigned long long v = 0;
    if (!f || fscanf(f, "%llu", &v) != 1) {
        char msg[400];
        snprintf(msg, sizeof msg, "cannot read %s: %s", g_wire_path, f ? "not a number" : strerror(errno));
        die(msg);
    }
    fclose(f);
    return (double)v;
}

/* Median, min, max of the n samples in x (sorted in place). */
static result summarize(double *x, int n) {
    result res = {0, 0, 0, n};
    qsort(x, (size_t)n, sizeof(double), cmp_double);
    res.median = n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
    res.min = x[0];
    res.max = x[n - 1];
    return res;
}

/* Emits the METHOD.wire_bytes rows (rank 0). With --compression, a compressed method's row of a
 * workload of 1 MiB or more checks that its step sent at most 0.7 x the bytes of conflux's. */
static void emit_wire(workload *w, method *ms, int nm) {
    result res[16];
    double plain = 0;
    for (int k = 0; k < nm && k < 16; k++) {
        res[k] = summarize(ms[k].wire, w->reps);
        free(ms[k].wire);
        ms[k].wire = NULL;
        if (!strcmp(ms[k].name, "conflux")) plain = res[k].median;
    }
    for (int k = 0; k < nm && k < 16; k++) {
        char name[64];
        const char *check = "-";
        snprintf(name, sizeof name, "%s.wire_bytes", ms[k].name);
        if (g_compression_mode && strcmp(ms[k].name, "conflux") && !strncmp(ms[k].name, "conflux", 7) &&
            w->total * sizeof(float) >= (1u << 20) && g_rank == 0) {
            check = plain > 0 && res[k].median <= 0.7 * plain ? "ok" : "FAIL";
            if (*check == 'F') {
                fprintf(stderr, "[rank 0] CHECK FAILED %s %s: %.0f bytes on the wire per step, uncompressed "
                        "%.0f (want at most 0.7 x)\n", w->name, ms[k].name, res[k].median, plain);
                g_failures++;
            }
        }
        emit(w, name, res[k], check);
    }
}

/* Times the methods of one workload. Repeat r runs every method once, back to back, starting at a
 * rotating position, so that drift and noise from the rest of the machine hit all methods alike and
 * every ratio comes from the same rounds. Each step: barrier, MPI_Wtime around `inner` steps on every
 * rank, the max over ranks. With --wire-iface, each host's sent bytes are read before that barrier
 * (no rank starts before every host has read) and after a second barrier at the end of the step
 * (outside the time), and summed over the hosts. */
static void time_methods(workload *w, method *ms, int nm) {
    for (int k = 0; k < nm; k++) {
        ms[k].samples = xmalloc((size_t)w->reps * sizeof(double));
        ms[k].wire = g_wire_path[0] ? xmalloc((size_t)w->reps * sizeof(double)) : NULL;
    }
    for (int r = 0; r < w->warmup + w->reps; r++) {
        for (int k = 0; k < nm; k++) {
            method *m = &ms[(k + r) % nm];
            double tx0 = wire_tx();
            MPI_Barrier(g_comm);
            double t0 = MPI_Wtime();
            for (int i = 0; i < w->inner; i++) m->fn(w, m->arg);
            double dt = (MPI_Wtime() - t0) / w->inner, mx = 0;
            if (m->wire) MPI_Barrier(g_comm);
            double sent = (wire_tx() - tx0) / w->inner, total = 0;
            MPI_Reduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, g_comm);
            if (m->wire) MPI_Reduce(&sent, &total, 1, MPI_DOUBLE, MPI_SUM, 0, g_comm);
            if (r >= w->warmup) {
                m->samples[r - w->warmup] = mx;
                if (m->wire) m->wire[r - w->warmup] = total;
            }
        }
    }
    for (int k = 0; k < nm; k++) {
        emit(w, ms[k].name, summarize(ms[k].samples, w->reps), ms[k].check);
        free(ms[k].samples);
        ms[k].samples = NULL;
    }
    if (g_wire_path[0]) emit_wire(w, ms, nm);
}

/* ---- MPI baselines ----------------------------------------------------------------------------- */

typedef struct flat_arg {
    float *buf;
    size_t chunk; /* elements per MPI_Allreduce; 0 = all at once */
} flat_arg;

static void step_mpi_flat(workload *w, void *arg) {
    flat_arg *a = arg;
    size_t chunk = a->chunk ? a->chunk : w->total;
    for (size_t off = 0; off < w->total; off += chunk) {
        size_t n = w->total - off < chunk ? w->total - off : chunk;
        MPI_Allreduce(MPI_IN_PLACE, a->buf + off, (int)n, MPI_FLOAT, MPI_SUM, g_comm);
    }
}

static void step_mpi_per_tensor(workload *w, void *arg) {
    float **data = arg;
    for (size_t i = w->n; i-- > 0;)
        MPI_Allreduce(MPI_IN_PLACE, data[i], (int)w->t[i].count, MPI_FLOAT, MPI_SUM, g_comm);
}

/* ---- Conflux ----------------------------------------------------------------------------------- */

#if CFX_BENCH_HAVE_CONFLUX
typedef struct cfx_arg {
    cfx_context *ctx;
    cfx_handle *h;
    float **data; /* the tensors (one copy per Conflux method) */
    cfx_reduce_op op; /* CFX_OP_SUM (0) unless set */
    cfx_compression compression; /* not NONE: through cfx_allreduce_async_opts */
    char **names; /* NULL: the workload's tensor names; else this method's own (tagged_names) */
} cfx_arg;

/* The workload's tensor names with ".TAG" appended: a method whose parameters differ from conflux's
 * (op, compression) gets its own names, so that its tensors and conflux's each stay in the response
 * cache instead of invalidating each other's entry every round. */
static char **tagged_names(const workload *w, const char *tag) {
    char **names = xmalloc(w->n * sizeof *names);
    for (size_t i = 0; i < w->n; i++) {
        size_t len = strlen(w->t[i].name) + strlen(tag) + 2;
        names[i] = xmalloc(len);
        snprintf(names[i], len, "%s.%s", w->t[i].name, tag);
    }
    return names;
}

static void free_names(const workload *w, char **names) {
    for (size_t i = 0; names && i < w->n; i++) free(names[i]);
    free(names);
}

static void step_conflux(workload *w, void *arg) {
    cfx_arg *a = arg;
    cfx_allreduce_options o;
    cfx_check(cfx_allreduce_options_init(&o, CFX_ALLREDUCE_OPTIONS_VERSION), "cfx_allreduce_options_init");
    o.op = a->op;
    o.compression = (int32_t)a->compression;
    for (size_t i = w->n; i-- > 0;) { /* gradients arrive in roughly reverse registration order */
        cfx_tensor t = {a->data[i], w->t[i].shape, w->t[i].ndim, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        const char *name = a->names ? a->names[i] : w->t[i].name;
        if (a->compression == CFX_COMPRESSION_NONE)
            cfx_check(cfx_allreduce_async(a->ctx, name, &t, NULL, a->op, 1.0, 1.0, &a->h[i]),
                      "cfx_allreduce_async");
        else
            cfx_check(cfx_allreduce_async_opts(a->ctx, name, &t, NULL, &o, &a->h[i]), "cfx_allreduce_async_opts");
    }
    for (size_t i = w->n; i-- > 0;) {
        cfx_status s = cfx_wait(a->ctx, a->h[i], -1.0);
        if (s != CFX_OK) {
            const char *hm = cfx_handle_message(a->ctx, a->h[i]);
            char msg[1024];
            snprintf(msg, sizeof msg, "cfx_wait(%s): %s (%s)", w->t[i].name, cfx_status_string(s), hm ? hm : "");
            die(msg);
        }
        cfx_check(cfx_handle_release(a->ctx, a->h[i]), "cfx_handle_release");
    }
}

/* Checks step_conflux on a's tensors once (this also warms the cache), zeroes them again and adds the
 * method to ms. Every rank learns whether all ranks got the exact sums. */
static void add_conflux_method(workload *w, const char *name, cfx_arg *a, method *ms, int *nm) {
    fill_pattern(w, a->data);
    step_conflux(w, a);
    char why[256] = "";
    int ok = check_pattern(w, a->data, why, sizeof why), all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, g_comm);
    if (!ok) fprintf(stderr, "[rank %d] CHECK FAILED %s %s: %s\n", g_rank, w->name, name, why);
    if (!all_ok) g_failures++;
    zero_tensors(w, a->data);
    ms[(*nm)++] = (method){name, step_conflux, a, all_ok ? "ok" : "FAIL", NULL, NULL};
}

/* conflux_adasum: the conflux step with CFX_OP_ADASUM. Checked once with the same tensors on every
 * rank, whose adaptive sum is exactly those tensors. */
static void add_adasum_method(workload *w, cfx_arg *a, method *ms, int *nm) {
    for (size_t i = 0; i < w->n; i++)
        for (size_t j = 0; j < w->t[i].count; j++) a->data[i][j] = pattern(0, i, j);
    step_conflux(w, a);
    int ok = 1, all_ok = 0;
    for (size_t i = 0; i < w->n && ok; i++)
        for (size_t j = 0; j < w->t[i].count && ok; j++)
            if (a->data[i][j] != pattern(0, i, j)) {
                fprintf(stderr, "[rank %d] CHECK FAILED %s conflux_adasum: %s element %zu = %g, want %g\n",
                        g_rank, w->name, w->t[i].name, j, (double)a->data[i][j], (double)pattern(0, i, j));
                ok = 0;
            }
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, g_comm);
    if (!all_ok) g_failures++;
    zero_tensors(w, a->data);
    ms[(*nm)++] = (method){"conflux_adasum", step_conflux, a, all_ok ? "ok" : "FAIL", NULL, NULL};
}

/* The checks of a compressed step (--compression). Rank r's value of element j of tensor i:
 * pattern() plus ((j mod 7) + 1) / 9, whose sums are rarely 16-bit values. */
static float cpattern(int rank, size_t i, size_t j) { return pattern(rank, i, j) + (float)(j % 7 + 1) / 9.0f; }

static int is_16bit(float v, int bf16) {
    if (bf16) {
        uint32_t bits;
        memcpy(&bits, &v, sizeof bits);
        return (bits & 0xFFFFu) == 0;
    }
    int e;
    double m = frexp(fabs((double)v), &e); /* |v| = m 2^e, m in [0.5, 1) */
    if (fabs((double)v) > 65504.0) return 0;
    double scaled = e - 1 >= -14 ? ldexp(m, 11) : ldexp(fabs((double)v), 24);
    return scaled == floor(scaled);
}

/* A 64-bit hash of the tensors' bytes, to see that every rank holds the same result. */
static uint64_t hash_tensors(const workload *w, float **data) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < w->n; i++)
        for (size_t j = 0; j < w->t[i].count; j++) {
            uint32_t bits;
            memcpy(&bits, &data[i][j], sizeof bits);
            h = (h ^ bits) * 0x100000001b3ull;
        }
    return h;
}

/* 1 when every element is within the rounding of the exact sum over ranks of cpattern() that a
 * compressed step allows (each host's partial sum rounded once when packed, each of the hosts - 1
 * cross-host combines once; unit roundoff u of the 16-bit form; plus float32's within a host) and is
 * a 16-bit value. */
static int check_compressed(workload *w, float **data, cfx_compression c, int hosts, char *why, size_t whylen) {
    const int bf16 = c == CFX_COMPRESSION_BF16;
    const double u = bf16 ? 0x1p-8 : 0x1p-11;
    for (size_t i = 0; i < w->n; i++)
        for (size_t j = 0; j < w->t[i].count; j++) {
            double exact = 0; /* every value is positive: the magnitude is the sum */
            for (int r = 0; r < g_size; r++) exact += (double)cpattern(r, i, j);
            double tol = u * hosts * exact * (1 + u) + 0x1p-22 * g_size * exact, got = (double)data[i][j];
            if (!(fabs(got - exact) <= tol)) {
                snprintf(why, whylen, "%s element %zu = %.9g, exact sum %.9g, allowed error %.3g", w->t[i].name, j,
                         got, exact, tol);
                return 0;
            }
            if (!is_16bit(data[i][j], bf16)) {
                snprintf(why, whylen, "%s element %zu = %.9g is no %s value: the data did not travel compressed",
                         w->t[i].name, j, got, bf16 ? "bfloat16" : "float16");
                return 0;
            }
        }
    return 1;
}

/* Checks the compressed step on a's tensors once (check_compressed, and the same bytes on every
 * rank), zeroes them again and adds the method. */
static void add_compressed_method(workload *w, const char *name, cfx_arg *a, method *ms, int *nm) {
    for (size_t i = 0; i < w->n; i++)
        for (size_t j = 0; j < w->t[i].count; j++) a->data[i][j] = cpattern(g_rank, i, j);
    step_conflux(w, a);
    char why[256] = "";
    int ok = check_compressed(w, a->data, a->compression, cfx_cross_size(a->ctx), why, sizeof why), all_ok = 0;
    if (!ok) fprintf(stderr, "[rank %d] CHECK FAILED %s %s: %s\n", g_rank, w->name, name, why);
    uint64_t h = hash_tensors(w, a->data), lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, g_comm);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, g_comm);
    if (lo != hi && g_rank == 0)
        fprintf(stderr, "[rank 0] CHECK FAILED %s %s: the ranks' results are not bitwise the same\n", w->name, name);
    ok = ok && lo == hi;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, g_comm);
    if (!all_ok) g_failures++;
    zero_tensors(w, a->data);
    ms[(*nm)++] = (method){name, step_conflux, a, all_ok ? "ok" : "FAIL", NULL, NULL};
}

/* conflux_gradset: the workload's tensors registered once in a gradient set with owned storage
 * (cfx_gradset_*), each step marking them ready in reverse registration order and waiting. The time
 * of the ready calls alone is kept per repeat for the gradset_ready_call row. */
typedef struct gradset_arg {
    cfx_gradset *set;
    int32_t *index;
    float **data;
    double ready_s;    /* the ready calls of the repeats since the last reset */
    long ready_calls;
} gradset_arg;

static void step_gradset(workload *w, void *arg) {
    gradset_arg *g = arg;
    double t0 = MPI_Wtime();
    for (size_t i = w->n; i-- > 0;) cfx_check(cfx_gradset_ready(g->set, g->index[i]), "cfx_gradset_ready");
    g->ready_s += MPI_Wtime() - t0;
    g->ready_calls += (long)w->n;
    cfx_check(cfx_gradset_wait(g->set, -1.0), "cfx_gradset_wait");
}

static void make_gradset(workload *w, cfx_context *ctx, gradset_arg *g) {
    cfx_gradset_options o;
    cfx_check(cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION), "cfx_gradset_options_init");
    o.op = CFX_OP_SUM;
    char name[128];
    snprintf(name, sizeof name, "bench.%s", w->name);
    cfx_check(cfx_gradset_create(ctx, name, &o, &g->set), "cfx_gradset_create");
    g->index = xmalloc(w->n * sizeof *g->index);
    g->data = xmalloc(w->n * sizeof *g->data);
    for (size_t i = 0; i < w->n; i++) {
        cfx_tensor t = {NULL, w->t[i].shape, w->t[i].ndim, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_check_tensor(cfx_gradset_add(g->set, w->t[i].name, &t, &g->index[i]), "cfx_gradset_add", w, i);
    }
    cfx_check(cfx_gradset_commit(g->set), "cfx_gradset_commit");
    for (size_t i = 0; i < w->n; i++) {
        void *p = NULL;
        cfx_check(cfx_gradset_data(g->set, g->index[i], &p), "cfx_gradset_data");
        g->data[i] = p;
    }
}

/* Checks step_gradset once, like add_conflux_method, and adds it. */
static void add_gradset_method(workload *w, gradset_arg *g, method *ms, int *nm) {
    fill_pattern(w, g->data);
    step_gradset(w, g);
    char why[256] = "";
    int ok = check_pattern(w, g->data, why, sizeof why), all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, g_comm);
    if (!ok) fprintf(stderr, "[rank %d] CHECK FAILED %s conflux_gradset: %s\n", g_rank, w->name, why);
    if (!all_ok) g_failures++;
    zero_tensors(w, g->data);
    g->ready_s = 0;
    g->ready_calls = 0;
    ms[(*nm)++] = (method){"conflux_gradset", step_gradset, g, all_ok ? "ok" : "FAIL", NULL, NULL};
}
#else
typedef struct cfx_context cfx_context;
#endif

/* ---- one workload ------------------------------------------------------------------------------ */

/* Runs the workload's methods: Conflux (conflux, conflux_shared, ...; with --compression conflux,
 * conflux_fp16 and conflux_bf16) when ctx is set, the MPI baselines when `baselines`. conflux (and the
 * compressed methods) and the baselines share the private tensors; conflux_shared has its own. */
static void run_workload(workload *w, mode m, cfx_context *ctx, int baselines) {
    method ms[16];
    int nm = 0;
    flat_arg fa[8] = {{NULL, 0}};
    static const size_t chunks_mib[] = {1, 4, 16};
    static const char *chunk_names[] = {"mpi_chunk_1M", "mpi_chunk_4M", "mpi_chunk_16M"};
    static const char *chunk_names_hp[] = {"mpi_chunk_1M_hp", "mpi_chunk_4M_hp", "mpi_chunk_16M_hp"};
    char hp_check[48] = "-";
    float **priv = alloc_tensors(w, PLACE_PRIVATE), **shared = NULL;
#if CFX_BENCH_HAVE_CONFLUX
    cfx_arg ca = {ctx, NULL, priv, CFX_OP_SUM, CFX_COMPRESSION_NONE, NULL};
    cfx_arg cs = {ctx, NULL, NULL, CFX_OP_SUM, CFX_COMPRESSION_NONE, NULL};
    /* the private tensors, as conflux: Adasum; with --compression fp16 and bf16 */
    cfx_arg cad = {ctx, NULL, priv, CFX_OP_ADASUM, CFX_COMPRESSION_NONE, NULL};
    cfx_arg cf16 = {ctx, NULL, priv, CFX_OP_SUM, CFX_COMPRESSION_FP16, NULL};
    cfx_arg cb16 = {ctx, NULL, priv, CFX_OP_SUM, CFX_COMPRESSION_BF16, NULL};
    gradset_arg gs = {0};
    if (ctx && g_compression_mode) {
        ca.h = xmalloc(w->n * sizeof(cfx_handle));
        cf16.h = ca.h; /* the methods run one at a time */
        cb16.h = ca.h;
        cf16.names = tagged_names(w, "fp16");
        cb16.names = tagged_names(w, "bf16");
        add_conflux_method(w, "conflux", &ca, ms, &nm);
        add_compressed_method(w, "conflux_fp16", &cf16, ms, &nm);
        add_compressed_method(w, "conflux_bf16", &cb16, ms, &nm);
    } else if (ctx) {
        ca.h = xmalloc(w->n * sizeof(cfx_handle));
        cs.h = xmalloc(w->n * sizeof(cfx_handle));
        cs.data = shared = alloc_tensors(w, PLACE_SHARED);
        add_conflux_method(w, "conflux", &ca, ms, &nm);
        add_conflux_method(w, "conflux_shared", &cs, ms, &nm);
        make_gradset(w, ctx, &gs);
        add_gradset_method(w, &gs, ms, &nm);
        if (!strcmp(w->group, "model")) {
            cad.h = xmalloc(w->n * sizeof(cfx_handle));
            cad.names = tagged_names(w, "adasum");
            add_adasum_method(w, &cad, ms, &nm);
        }
    }
#else
    (void)ctx;
#endif
    if (baselines) {
        float *flat = xmalloc(w->total * sizeof(float));
        memset(flat, 0, w->total * sizeof(float));
        if (m == MODE_SMOKE) { /* the baselines must be right too, or the ratios mean nothing */
            for (size_t j = 0; j < w->total; j++) flat[j] = (float)(g_rank + 1);
            flat_arg one = {flat, 0};
            step_mpi_flat(w, &one);
            for (size_t j = 0; j < w->total; j++)
                if (flat[j] != (float)(g_size * (g_size + 1) / 2)) die("MPI_Allreduce gave a wrong sum");
            memset(flat, 0, w->total * sizeof(float));
        }
        fa[0] = (flat_arg){flat, 0};
        ms[nm++] = (method){"mpi_flat", step_mpi_flat, &fa[0], "-", NULL, NULL};
        if (w->n > 1) ms[nm++] = (method){"mpi_per_tensor", step_mpi_per_tensor, priv, "-", NULL, NULL};
        for (size_t k = 0; k < 3; k++) {
            fa[k + 1] = (flat_arg){flat, (chunks_mib[k] << 20) / sizeof(float)};
            if (w->total > fa[k + 1].chunk) /* else identical to mpi_flat */
                ms[nm++] = (method){chunk_names[k], step_mpi_flat, &fa[k + 1], "-", NULL, NULL};
        }
        /* The same flat schedules on a huge-page buffer (from 2 MiB: below, no huge page fits): MPI at
         * its best here is ~1.8x faster on them, and a user's NumPy buffers have them. --smoke checks
         * nothing on them, so it runs them up to 128 MiB only (ResNet-50 included), to stay short. */
        size_t bytes = w->total * sizeof(float);
        if (bytes >= HUGE_PAGE && (m != MODE_SMOKE || bytes <= ((size_t)128 << 20))) {
            float *hp = xmalloc_huge(bytes);
            memset(hp, 0, bytes);
            double share = huge_share(hp, bytes);
            if (share < 0)
                snprintf(hp_check, sizeof hp_check, "huge pages unknown");
            else
                snprintf(hp_check, sizeof hp_check, "huge pages %.0f%%", 100 * share);
            fa[4] = (flat_arg){hp, 0};
            ms[nm++] = (method){"mpi_flat_hp", step_mpi_flat, &fa[4], hp_check, NULL, NULL};
            for (size_t k = 0; k < 3; k++) {
                fa[k + 5] = (flat_arg){hp, (chunks_mib[k] << 20) / sizeof(float)};
                if (w->total > fa[k + 5].chunk)
                    ms[nm++] = (method){chunk_names_hp[k], step_mpi_flat, &fa[k + 5], hp_check, NULL, NULL};
            }
        }
    }
    time_methods(w, ms, nm);
#if CFX_BENCH_HAVE_CONFLUX
    if (gs.set && gs.ready_calls) { /* the mean cost of one ready call, on rank 0 */
        double per_call = gs.ready_s / (double)gs.ready_calls;
        result rr = {0};
        rr.median = rr.min = rr.max = per_call;
        rr.reps = (int)(gs.ready_calls / (long)w->n);
        emit(w, "gradset_ready_call", rr, "-");
    }
    cfx_gradset_free(gs.set);
    free(gs.index);
    free(gs.data);
#endif
    free(fa[0].buf);
    free(fa[4].buf);
    free_tensors(w, priv, PLACE_PRIVATE);
    free_tensors(w, shared, PLACE_SHARED);
#if CFX_BENCH_HAVE_CONFLUX
    free(ca.h);
    free(cs.h);
    free(cad.h);
    free_names(w, cad.names);
    free_names(w, cf16.names);
    free_names(w, cb16.names);
#endif
}

#if CFX_BENCH_HAVE_CONFLUX
/* The CPU an idle context uses: after one allreduce and past the background thread's spin window,
 * every rank sleeps 2 s with its context alive; each rank's process CPU over wall time, the max over
 * ranks (row idle/idle_context, method conflux_idle_cpu, value in cores, not seconds). */
static void measure_idle_cpu(void) {
    cfx_context *ctx = NULL;
    cfx_check(cfx_init(NULL, &ctx), "cfx_init");
    float v = 1;
    int64_t one = 1;
    cfx_tensor t = {&v, &one, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h;
    cfx_check(cfx_allreduce_async(ctx, "idle.warm", &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h), "cfx_allreduce_async");
    cfx_check(cfx_wait(ctx, h, -1.0), "cfx_wait");
    cfx_handle_release(ctx, h);
    struct timespec pause = {0, 50 * 1000 * 1000}, idle = {2, 0}, c0, c1, w0, w1;
    nanosleep(&pause, NULL);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
    clock_gettime(CLOCK_MONOTONIC, &w0);
    nanosleep(&idle, NULL);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    double cpu = (double)(c1.tv_sec - c0.tv_sec) + (double)(c1.tv_nsec - c0.tv_nsec) * 1e-9;
    double wall = (double)(w1.tv_sec - w0.tv_sec) + (double)(w1.tv_nsec - w0.tv_nsec) * 1e-9;
    double share = cpu / wall, worst = 0;
    MPI_Reduce(&share, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, g_comm);
    workload w = {0};
    snprintf(w.group, sizeof w.group, "idle");
    snprintf(w.name, sizeof w.name, "idle_context");
    result r = {worst, worst, worst, 1};
    emit(&w, "conflux_idle_cpu", r, "-");
    cfx_check(cfx_shutdown(ctx), "cfx_shutdown");
    cfx_context_free(ctx);
}

/* The context spans the job; with --compression it must span hosts, or nothing is compressed. */
static void check_context(cfx_context *ctx) {
    if (cfx_size(ctx) != g_size) die("cfx_size differs from the MPI world size");
    if (g_compression_mode && cfx_cross_size(ctx) < 2)
        die("--compression needs a job that spans hosts (cfx_cross_size is 1, so nothing would be "
            "compressed): run it on hosts, or pretend some with CFX_TEST_LOCAL_SIZE");
}
#endif

/* ---- main -------------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage: conflux_bench [--quick|--smoke] [--workloads DIR] [--raw FILE] [--spec FILE]\n"
            "                     [--only NAME,GROUP,...] [--no-conflux] [--no-mpi]\n"
            "                     [--schedule blocks|interleave|phases] [--compression]\n"
            "                     [--wire-iface IFACE]\n"
            "  blocks (default): per workload, the baselines with no Conflux context alive, then a fresh\n"
            "    context for the Conflux rows. interleave: one context for the run, each repeat runs\n"
            "    Conflux and every baseline back to back (the baselines then share the machine with the\n"
            "    idle background thread). phases: all baselines first, then one context for Conflux.\n"
            "  --compression: the conflux step with wire compression none, fp16, bf16 instead of the\n"
            "    other Conflux rows (the job must span hosts, pretend ones with CFX_TEST_LOCAL_SIZE).\n"
            "  --wire-iface IFACE: also the bytes each step sends on IFACE, summed over the hosts.\n");
}

int main(int argc, char **argv) {
    mode m = MODE_FULL;
    const char *dir = NULL, *raw = NULL, *spec = NULL, *only = NULL, *iface = NULL;
    int want_conflux = CFX_BENCH_HAVE_CONFLUX, want_mpi = 1;
    enum { SCHED_BLOCKS, SCHED_INTERLEAVE, SCHED_PHASES } sched = SCHED_BLOCKS;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) m = MODE_QUICK;
        else if (!strcmp(argv[i], "--smoke")) m = MODE_SMOKE;
        else if (!strcmp(argv[i], "--no-conflux")) want_conflux = 0;
        else if (!strcmp(argv[i], "--no-mpi")) want_mpi = 0;
        else if (!strcmp(argv[i], "--compression")) g_compression_mode = 1;
        else if (!strcmp(argv[i], "--wire-iface") && i + 1 < argc) iface = argv[++i];
        else if (!strcmp(argv[i], "--workloads") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--raw") && i + 1 < argc) raw = argv[++i];
        else if (!strcmp(argv[i], "--spec") && i + 1 < argc) spec = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--schedule") && i + 1 < argc) {
            i++;
            if (!strcmp(argv[i], "phases")) sched = SCHED_PHASES;
            else if (!strcmp(argv[i], "interleave")) sched = SCHED_INTERLEAVE;
            else if (strcmp(argv[i], "blocks")) {
                usage();
                return 2;
            }
        } else {
            usage();
            return 2;
        }
    }
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    MPI_Comm_dup(MPI_COMM_WORLD, &g_comm);
    MPI_Comm local;
    MPI_Comm_split_type(g_comm, MPI_COMM_TYPE_SHARED, g_rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &g_local_rank);
    MPI_Comm_free(&local);
    if (iface) {
        if (!*iface || strchr(iface, '/') || strlen(iface) > 64) die("--wire-iface needs an interface name");
        snprintf(g_wire_path, sizeof g_wire_path, "/sys/class/net/%s/statistics/tx_bytes", iface);
        (void)wire_tx(); /* fails now, naming the file, rather than in the first step */
    }
    if (g_compression_mode && !want_conflux) die("--compression times Conflux: it cannot go with --no-conflux");
#ifdef CFX_BENCH_WORKLOAD_DIR
    if (!dir) dir = CFX_BENCH_WORKLOAD_DIR;
#endif
    if (!dir) dir = "bench/workloads";
    build_workloads(m, dir, only);
    if (g_rank == 0) {
        g_raw = fopen(raw ? raw : "/dev/null", "w");
        if (!g_raw) die("cannot open the raw output file");
        fprintf(g_raw, "group,workload,tensors,bytes,method,reps,median_s,min_s,max_s,check\n");
        if (spec) write_spec(spec);
        printf("conflux_bench: %d ranks, MPI thread level %d, %zu workloads, mode %s, conflux %s, schedule %s\n",
               g_size, provided, g_nwl, m == MODE_FULL ? "full" : m == MODE_QUICK ? "quick" : "smoke",
               want_conflux ? "on" : "off",
               sched == SCHED_PHASES ? "phases" : sched == SCHED_INTERLEAVE ? "interleave" : "blocks");
        fflush(stdout);
    }
    cfx_context *ctx = NULL;
    if (sched == SCHED_PHASES || !want_conflux)
        for (size_t i = 0; i < g_nwl && want_mpi; i++) run_workload(&g_wl[i], m, NULL, 1);
#if CFX_BENCH_HAVE_CONFLUX
    if (want_conflux && sched == SCHED_BLOCKS) {
        for (size_t i = 0; i < g_nwl; i++) {
            if (want_mpi) run_workload(&g_wl[i], m, NULL, 1);
            cfx_check(cfx_init(NULL, &ctx), "cfx_init");
            check_context(ctx);
            run_workload(&g_wl[i], m, ctx, 0);
            cfx_check(cfx_shutdown(ctx), "cfx_shutdown");
            cfx_context_free(ctx);
        }
    } else if (want_conflux) {
        cfx_check(cfx_init(NULL, &ctx), "cfx_init");
        check_context(ctx);
        for (size_t i = 0; i < g_nwl; i++) run_workload(&g_wl[i], m, ctx, want_mpi && sched == SCHED_INTERLEAVE);
        cfx_check(cfx_shutdown(ctx), "cfx_shutdown");
        cfx_context_free(ctx);
    }
    if (want_conflux && m != MODE_SMOKE && !g_compression_mode) measure_idle_cpu();
#endif
    (void)ctx;
    if (g_rank == 0) {
        if (g_failures) printf("conflux_bench: %d workload(s) FAILED the result check\n", g_failures);
        else if (m == MODE_SMOKE) printf("conflux_bench: smoke OK (%zu workloads checked)\n", g_nwl);
        fclose(g_raw);
    }
    for (size_t i = 0; i < g_nwl; i++) free(g_wl[i].t);
    free(g_wl);
    MPI_Comm_free(&g_comm);
    MPI_Finalize();
    return g_failures ? 1 : 0;
}
