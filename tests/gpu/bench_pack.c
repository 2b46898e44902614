/*
 * bench_pack - throughput of the batched pack/unpack kernels against cudaMemcpyAsync device to
 * device of the same bytes (one copy), and against the naive fusion (one cudaMemcpyAsync per
 * tensor), in the same process. Not a test: it prints ratios and asserts nothing.
 *
 *   bench_pack [workload.tsv] [iterations]
 *
 * The workload is a tensor list (name<TAB>AxBxC lines, '#' comments, as the tables in bench/workloads);
 * without one, 161 synthetic tensors shaped like ResNet-50's gradients (25.6 M parameters).
 * Bandwidth counts bytes read plus bytes written.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_kernels.h"
#include "base/error.h"

#define MAX_TENSORS 4096

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static size_t load(const char *path, uint64_t *counts)
{
    size_t n = 0;
    if (path) {
        FILE *f = fopen(path, "r");
        if (!f) {
            fprintf(stderr, "bench_pack: cannot open %s\n", path);
            exit(2);
        }
        char line[512];
        while (n < MAX_TENSORS && fgets(line, sizeof line, f)) {
            char *tab = strchr(line, '\t');
            if (line[0] == '#' || !tab)
                continue;
            uint64_t c = 1;
            for (char *p = tab + 1; *p && *p != '\n';) {
                c *= strtoull(p, &p, 10);
                if (*p == 'x')
                    p++;
                else
                    break;
            }
            counts[n++] = c;
        }
        fclose(f);
        return n;
    }
    /* ResNet-50-like: conv kernels from 4 K to 2.4 M elements, and many small norm vectors. */
    static const uint64_t convs[] = {9408, 4096, 36864, 16384, 16384, 147456, 65536, 131072,
                                     589824, 262144, 524288, 2359296, 1048576, 2097152};
    for (int rep = 0; n < 160; rep++)
        for (size_t i = 0; i < sizeof convs / sizeof convs[0] && n < 160; i += 1) {
            counts[n++] = convs[(i + (size_t)rep) % (sizeof convs / sizeof convs[0])];
            counts[n++] = 64u << (rep % 4);
        }
    counts[n++] = 2048 * 1000; /* fc */
    return n;
}

#define TRY(call)                                                                                 \
    do {                                                                                          \
        if ((call) != CFX_OK) {                                                                   \
            fprintf(stderr, "bench_pack: %s: %s\n", #call, cx_error_message());                   \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

typedef struct run {
    void *stream, *fusion;
    void **tensors;
    uint64_t *counts;
    size_t n, esize;
    uint64_t total;
    cx_cuda_batch *batch;
} run;

enum { COPY_ONE, COPY_EACH, PACK, PACK_SCALED, UNPACK_SCALED };

static double time_it(run *r, int what, int iters)
{
    for (int warm = 0; warm < 2; warm++) {
        double t0 = now_s();
        for (int it = 0; it < iters; it++) {
            switch (what) {
            case COPY_ONE:
                TRY(cx_cuda_memcpy_async(r->fusion, r->tensors[r->n], r->total * r->esize, r->stream));
                break;
            case COPY_EACH: {
                uint64_t off = 0;
                for (size_t i = 0; i < r->n; i++) {
                    TRY(cx_cuda_memcpy_async((char *)r->fusion + off * r->esize, r->tensors[i],
                                             r->counts[i] * r->esize, r->stream));
                    off += r->counts[i];
                }
                break;
            }
            case PACK: TRY(cx_cuda_batch_pack(r->batch, r->fusion, 1.0, r->stream)); break;
            case PACK_SCALED: TRY(cx_cuda_batch_pack(r->batch, r->fusion, 0.5, r->stream)); break;
            case UNPACK_SCALED: TRY(cx_cuda_batch_unpack(r->batch, r->fusion, 0.125, r->stream)); break;
            }
        }
        TRY(cx_cuda_stream_sync(r->stream));
        double dt = now_s() - t0;
        if (warm)
            return dt / iters;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 && strcmp(argv[1], "-") != 0 ? argv[1] : NULL;
    int iters = argc > 2 ? atoi(argv[2]) : 50;
    if (cx_cuda_probe() != CFX_OK) {
        printf("bench_pack: skipped: no CUDA device (%s)\n", cx_error_message());
        return 77;
    }
    TRY(cx_cuda_set_device(0));
    static uint64_t counts[MAX_TENSORS + 1];
    size_t n = load(path, counts);
    const cfx_dtype dtypes[] = {CFX_FLOAT32, CFX_FLOAT16};
    printf("bench_pack: %zu tensors (%s), %d iterations each\n", n, path ? path : "synthetic ResNet-50-like", iters);
    for (size_t d = 0; d < 2; d++) {
        run r;
        memset(&r, 0, sizeof r);
        r.n = n;
        r.counts = counts;
        r.esize = cfx_dtype_size(dtypes[d]);
        r.tensors = calloc(n + 1, sizeof *r.tensors);
        cx_cuda_tensor *t = calloc(n, sizeof *t);
        for (size_t i = 0; i < n; i++) {
            TRY(cx_cuda_malloc(counts[i] * r.esize, &r.tensors[i]));
            t[i] = (cx_cuda_tensor){r.tensors[i], r.tensors[i], r.total, counts[i]};
            r.total += counts[i];
        }
        TRY(cx_cuda_malloc(r.total * r.esize, &r.tensors[n])); /* the one-buffer copy source */
        TRY(cx_cuda_malloc(r.total * r.esize, &r.fusion));
        TRY(cx_cuda_stream_create(&r.stream));
        TRY(cx_cuda_batch_create(&r.batch));
        double t_set0 = now_s();
        TRY(cx_cuda_batch_set(r.batch, t, n, dtypes[d], r.stream));
        TRY(cx_cuda_stream_sync(r.stream));
        double t_set = now_s() - t_set0;
        double gb = 2.0 * (double)(r.total * r.esize) / 1e9;
        double one = time_it(&r, COPY_ONE, iters);
        static const char *const names[] = {"cudaMemcpyAsync d2d, one buffer", "cudaMemcpyAsync per tensor",
                                            "batch pack, factor 1 (copy)", "batch pack, prescale 0.5",
                                            "batch unpack, postscale 0.125"};
        printf("%s: %.1f MB in %zu tensors; descriptor upload %.1f us\n", cfx_dtype_name(dtypes[d]),
               (double)(r.total * r.esize) / 1e6, n, t_set * 1e6);
        for (int w = COPY_ONE; w <= UNPACK_SCALED; w++) {
            double s = w == COPY_ONE ? one : time_it(&r, w, iters);
            printf("  %-34s %9.1f us  %7.1f GB/s  %.2fx of one-buffer memcpy\n", names[w], s * 1e6,
                   gb / s, one / s);
        }
        for (size_t i = 0; i <= n; i++)
            cx_cuda_free(r.tensors[i]);
        cx_cuda_free(r.fusion);
        cx_cuda_batch_destroy(r.batch);
        cx_cuda_stream_destroy(r.stream);
        free(r.tensors);
        free(t);
    }
    return 0;
}
