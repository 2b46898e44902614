/* device_cases - device tensors through the public ABI (see device_cases.h). */
#include "device_cases.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cuda/cuda_kernels.h"

/* A CUDA helper call of the test itself; on failure the case stops (later steps would cascade). */
#define DREQUIRE(env, call)                                                                       \
    do {                                                                                          \
        cfx_status st_ = (call);                                                                  \
        if (st_ != CFX_OK) {                                                                      \
            DCHECK(env, 0, "%s -> %s: %s", #call, cfx_status_string(st_), cx_error_message());    \
            return;                                                                               \
        }                                                                                         \
    } while (0)

static float value(int rank, size_t i) { return (float)(rank + 1) + (float)(i % 7); }

/* value(r, i) summed over the ranks, times `scale` before the sum. */
static float sum_values(const dev_env *env, size_t i, float scale)
{
    float s = 0;
    for (int r = 0; r < env->size; r++)
        s += scale * value(r, i);
    return s;
}

static float *device_copy(dev_env *env, const void *host, size_t bytes)
{
    void *d = NULL;
    if (cx_cuda_malloc(bytes, &d) || cx_cuda_memcpy_async(d, host, bytes, env->stream)) {
        DCHECK(env, 0, "device copy of %zu bytes: %s", bytes, cx_error_message());
        cx_cuda_free(d);
        return NULL;
    }
    return d;
}

static cfx_status fetch(dev_env *env, void *host, const void *dev, size_t bytes)
{
    cfx_status st = cx_cuda_memcpy_async(host, dev, bytes, env->stream);
    return st ? st : cx_cuda_stream_sync(env->stream);
}

static cfx_status wait_release(dev_env *env, cfx_handle h, const char *what)
{
    cfx_status st = cfx_wait(env->ctx, h, 120.0);
    const char *m = cfx_handle_message(env->ctx, h);
    DCHECK(env, st == CFX_OK, "%s: %s (%s)", what, cfx_status_string(st), m ? m : "");
    cfx_handle_release(env->ctx, h);
    return st;
}

/* A float32 tensor of n elements, value(rank, i + first), in host memory and on the device (the
 * copy queued on the caller's stream, no host wait). */
typedef struct dev_tensor {
    float *host, *dev;
    int64_t shape;
    cfx_tensor t;
} dev_tensor;

static bool make_tensor(dev_env *env, dev_tensor *x, size_t n, size_t first)
{
    memset(x, 0, sizeof *x);
    x->host = malloc(n * sizeof *x->host);
    for (size_t i = 0; x->host && i < n; i++)
        x->host[i] = value(env->rank, i + first);
    x->dev = x->host ? device_copy(env, x->host, n * sizeof *x->host) : NULL;
    x->shape = (int64_t)n;
    x->t = (cfx_tensor){x->dev, &x->shape, 1, CFX_FLOAT32, env->device, env->stream};
    return x->dev != NULL;
}

static void free_tensor(dev_tensor *x)
{
    cx_cuda_free(x->dev);
    free(x->host);
}

/* Allreduces x in place, waits, and fetches the result into x->host: true when all went well. */
static bool reduce_fetch(dev_env *env, dev_tensor *x, const char *name, cfx_reduce_op op,
                         double pre, double post)
{
    cfx_handle h = 0;
    cfx_status st = cfx_allreduce_async(env->ctx, name, &x->t, NULL, op, pre, post, &h);
    DCHECK(env, st == CFX_OK, "%s: submission: %s", name, cfx_last_error());
    return st == CFX_OK && wait_release(env, h, name) == CFX_OK &&
           fetch(env, x->host, x->dev, (size_t)x->shape * sizeof *x->host) == CFX_OK;
}

/* A grouped (fused) sum of three tensors; no host wait after the copies in: Conflux must order
 * itself after them on the caller's stream. */
static void case_grouped_sum(dev_env *env)
{
    enum { NT = 3 };
    const size_t counts[NT] = {5, 4099, 100000};
    dev_tensor x[NT];
    cfx_tensor t[NT];
    bool ok = true;
    for (int k = 0; k < NT; k++) {
        ok = make_tensor(env, &x[k], counts[k], (size_t)k) && ok;
        t[k] = x[k].t;
    }
    cfx_handle h = 0;
    if (ok && cfx_grouped_allreduce_async(env->ctx, "dev.sum", NT, t, NULL, CFX_OP_SUM, 1.0, 1.0,
                                          &h) == CFX_OK &&
        wait_release(env, h, "grouped sum") == CFX_OK) {
        for (int k = 0; k < NT; k++) {
            if (fetch(env, x[k].host, x[k].dev, counts[k] * sizeof(float)))
                break;
            size_t bad = 0;
            for (size_t i = 0; i < counts[k]; i++)
                bad += x[k].host[i] != sum_values(env, i + (size_t)k, 1.0f);
            DCHECK(env, bad == 0, "grouped sum, tensor %d: %zu wrong elements", k, bad);
        }
    }
    for (int k = 0; k < NT; k++)
        free_tensor(&x[k]);
}

/* Average with prescale 2 and postscale 0.5: the mean of the sums. */
static void case_average(dev_env *env)
{
    dev_tensor x;
    if (make_tensor(env, &x, 100000, 0) && reduce_fetch(env, &x, "dev.avg", CFX_OP_AVERAGE, 2, 0.5)) {
        size_t bad = 0;
        for (size_t i = 0; i < 100000; i++) {
            float want = sum_values(env, i, 1.0f) / (float)env->size;
            bad += fabsf(x.host[i] - want) > 1e-4f * want;
        }
        DCHECK(env, bad == 0, "average: %zu wrong elements", bad);
    }
    free_tensor(&x);
}

/* A broadcast from the last rank, 10 MB: several pieces of the host-staged path. */
static void case_broadcast(dev_env *env)
{
    const size_t n = 2500000;
    dev_tensor x;
    cfx_handle hb = 0;
    if (make_tensor(env, &x, n, 0) &&
        cfx_broadcast_async(env->ctx, "dev.bcast", &x.t, env->size - 1, &hb) == CFX_OK &&
        wait_release(env, hb, "broadcast") == CFX_OK &&
        fetch(env, x.host, x.dev, n * sizeof *x.host) == CFX_OK) {
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += x.host[i] != value(env->size - 1, i);
        DCHECK(env, bad == 0, "broadcast: %zu wrong elements", bad);
    }
    free_tensor(&x);
}

/* rank + 1 rows each: the output is host memory (docs/gpu.md). */
static void case_allgather(dev_env *env)
{
    float h[16];
    for (int i = 0; i < 16; i++)
        h[i] = value(env->rank, (size_t)i);
    float *d = device_copy(env, h, sizeof h);
    int64_t rows = env->rank + 1;
    cfx_tensor g = {d, &rows, 1, CFX_FLOAT32, env->device, env->stream};
    cfx_handle hg = 0;
    if (!d || cfx_allgather_async(env->ctx, "dev.gather", &g, &hg) != CFX_OK) {
        DCHECK(env, 0, "allgather submission: %s", cfx_last_error());
        cx_cuda_free(d);
        return;
    }
    cfx_status st = cfx_wait(env->ctx, hg, 120.0);
    DCHECK(env, st == CFX_OK, "allgather: %s", cfx_status_string(st));
    cfx_tensor out;
    memset(&out, 0, sizeof out);
    size_t total = (size_t)env->size * (size_t)(env->size + 1) / 2;
    if (st == CFX_OK && cfx_handle_output(env->ctx, hg, 0, &out) == CFX_OK) {
        DCHECK(env, out.device == CFX_DEVICE_CPU, "allgather of a device tensor: output on device "
               "%d (host memory expected)", out.device);
        DCHECK(env, out.ndim == 1 && out.shape && out.shape[0] == (int64_t)total, "allgather shape");
        if (out.ndim == 1 && out.shape && out.shape[0] == (int64_t)total && out.data) {
            const float *o = out.data;
            size_t pos = 0, bad = 0;
            for (int r = 0; r < env->size; r++)
                for (int i = 0; i <= r; i++)
                    bad += o[pos++] != value(r, (size_t)i);
            DCHECK(env, bad == 0, "allgather: %zu wrong elements", bad);
        }
    }
    cfx_handle_release(env->ctx, hg);
    cx_cuda_free(d);
}

/* Kernels write the gradient on the caller's stream right before the call, and the host never
 * waits: the engine must order its reads after them. 40 scale kernels by 2 and 0.5 over 16 Mi
 * floats leave the values unchanged but take long enough that an engine reading early sees
 * half-scaled values; a last kernel multiplies by 3. */
static void case_producer_stream(dev_env *env)
{
    const size_t n = (size_t)16 << 20;
    dev_tensor x;
    bool ok = make_tensor(env, &x, n, 0) && cx_cuda_stream_sync(env->stream) == CFX_OK;
    for (int k = 0; ok && k < 40; k++)
        ok = cx_cuda_scale(x.dev, x.dev, n, CFX_FLOAT32, k % 2 ? 0.5 : 2.0, env->stream) == CFX_OK;
    ok = ok && cx_cuda_scale(x.dev, x.dev, n, CFX_FLOAT32, 3.0, env->stream) == CFX_OK;
    DCHECK(env, ok, "the producer kernels could not be queued: %s", cx_error_message());
    if (ok && reduce_fetch(env, &x, "dev.ordered", CFX_OP_SUM, 1, 1)) {
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += x.host[i] != sum_values(env, i, 3.0f);
        DCHECK(env, bad == 0, "producer-stream ordering: %zu of %zu elements wrong (read before "
               "the producer's kernels finished?)", bad, n);
    }
    free_tensor(&x);
}

/* A lone tensor of 3 Mi + 5 floats (in place on the NCCL path; several pieces host-staged) with
 * prescale 0.5 and postscale 4, and an int16 batch (host-staged even with NCCL). */
static void case_lone_and_int16(dev_env *env)
{
    const size_t n = 3 * 1024 * 1024 + 5;
    dev_tensor x;
    if (make_tensor(env, &x, n, 0) && reduce_fetch(env, &x, "dev.lone", CFX_OP_SUM, 0.5, 4.0)) {
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += x.host[i] != 4.0f * sum_values(env, i, 0.5f);
        DCHECK(env, bad == 0, "lone tensor with prescale 0.5, postscale 4: %zu wrong elements", bad);
    }
    free_tensor(&x);

    cfx_handle hl = 0;
    enum { NI = 1000 };
    int16_t hi[NI];
    for (int i = 0; i < NI; i++)
        hi[i] = (int16_t)(env->rank * 100 + i % 50 - 25);
    int16_t *di = (int16_t *)device_copy(env, hi, sizeof hi);
    int64_t ishape = NI;
    cfx_tensor ti = {di, &ishape, 1, CFX_INT16, env->device, env->stream};
    if (di && cfx_allreduce_async(env->ctx, "dev.int16", &ti, NULL, CFX_OP_SUM, 1, 1, &hl) == CFX_OK &&
        wait_release(env, hl, "int16") == CFX_OK && fetch(env, hi, di, sizeof hi) == CFX_OK) {
        int bad = 0;
        for (int i = 0; i < NI; i++) {
            int want = 0;
            for (int r = 0; r < env->size; r++)
                want += r * 100 + i % 50 - 25;
            bad += hi[i] != (int16_t)want;
        }
        DCHECK(env, bad == 0, "int16 (host-staged) sum: %d wrong elements", bad);
    }
    cx_cuda_free(di);
}

/* Float min/max take the host-staged path (NCCL would drop NaN): a NaN on any rank gives NaN, as
 * for host tensors; elsewhere the min and max of the ranks' values. */
static void case_min_max_nan(dev_env *env)
{
    enum { N = 64 };
    for (int pass = 0; pass < 2; pass++) {
        cfx_reduce_op op = pass ? CFX_OP_MAX : CFX_OP_MIN;
        float h[N];
        for (int i = 0; i < N; i++)
            h[i] = i % 8 == env->rank ? NAN : value(env->rank, (size_t)i);
        float *d = device_copy(env, h, sizeof h);
        int64_t shape = N;
        cfx_tensor t = {d, &shape, 1, CFX_FLOAT32, env->device, env->stream};
        cfx_handle hm = 0;
        if (d && cfx_allreduce_async(env->ctx, pass ? "dev.max" : "dev.min", &t, NULL, op, 1, 1,
                                     &hm) == CFX_OK &&
            wait_release(env, hm, pass ? "max" : "min") == CFX_OK && fetch(env, h, d, sizeof h) == CFX_OK) {
            int bad = 0;
            for (int i = 0; i < N; i++) {
                bool nan = i % 8 < env->size;
                float want = value(pass ? env->size - 1 : 0, (size_t)i);
                bad += nan ? !isnan(h[i]) : h[i] != want;
            }
            DCHECK(env, bad == 0, "%s with NaNs: %d elements differ from the host semantics",
                   pass ? "max" : "min", bad);
        }
        cx_cuda_free(d);
    }
}

/* Rank 0 submits from host memory, the others from the GPU: CFX_ERR_MISMATCH on every rank. */
static void case_mixed_kinds(dev_env *env)
{
    if (env->size < 2)
        return;
    float h[16] = {0};
    float *d = device_copy(env, h, sizeof h);
    int64_t shape = 16;
    cfx_tensor t = env->rank == 0 ? (cfx_tensor){h, &shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL}
                                  : (cfx_tensor){d, &shape, 1, CFX_FLOAT32, env->device, env->stream};
    cfx_handle hd = 0;
    if (d && cfx_allreduce_async(env->ctx, "dev.mixed", &t, NULL, CFX_OP_SUM, 1, 1, &hd) == CFX_OK) {
        cfx_status st = cfx_wait(env->ctx, hd, 120.0);
        const char *m = cfx_handle_message(env->ctx, hd);
        DCHECK(env, st == CFX_ERR_MISMATCH && m && strstr(m, "mismatched device"),
               "mixed CPU/GPU submission: %s (%s)", cfx_status_string(st), m ? m : "");
        cfx_handle_release(env->ctx, hd);
    }
    cx_cuda_free(d);
}

/* CFX_TEST_FAIL=RANKS:fail.[:done]: the first listed rank's status and name on every rank, for
 * a lone tensor and a fused group; then the same tensors under "ok." names are right. */
static void case_injected(dev_env *env)
{
    const char *spec = getenv("CFX_TEST_FAIL");
    if (!spec || !strstr(spec, ":fail."))
        return;
    int failing = atoi(spec);
    bool done = strstr(spec, ":done") != NULL;
    enum { N = 5000 };
    float h[N];
    for (size_t i = 0; i < N; i++)
        h[i] = value(env->rank, i);
    float *d = device_copy(env, h, sizeof h);
    int64_t shape[2] = {N - 1000, 1000};
    cfx_tensor lone = {d, &shape[0], 1, CFX_FLOAT32, env->device, env->stream};
    cfx_tensor group[2] = {lone, {d ? d + (N - 1000) : NULL, &shape[1], 1, CFX_FLOAT32,
                                  env->device, env->stream}};
    const char *names[4] = {"fail.lone", "fail.group", "ok.lone", "ok.group"};
    char injected[64];
    snprintf(injected, sizeof injected, "injected failure on rank %d", failing);
    for (int k = 0; d && k < 4; k++) {
        /* each "ok." tensor from fresh inputs (a ":done" failure ran the collective) */
        if (k >= 2 && cx_cuda_memcpy_async(d, h, sizeof h, env->stream)) {
            DCHECK(env, 0, "copy in: %s", cx_error_message());
            break;
        }
        cfx_handle hf = 0;
        cfx_status st = k % 2 ? cfx_grouped_allreduce_async(env->ctx, names[k], 2, group, NULL,
                                                            CFX_OP_SUM, 1, 1, &hf)
                              : cfx_allreduce_async(env->ctx, names[k], &lone, NULL, CFX_OP_SUM, 1,
                                                    1, &hf);
        if (st) {
            DCHECK(env, 0, "%s: submission: %s", names[k], cfx_last_error());
            continue;
        }
        st = cfx_wait(env->ctx, hf, 120.0);
        const char *m = cfx_handle_message(env->ctx, hf);
        if (k < 2)
            DCHECK(env, st == CFX_ERR_OUT_OF_MEMORY && m && strstr(m, injected) &&
                   strstr(m, names[k]) && (!done || env->size == 1 ||
                                           strstr(m, "failed after the collective")),
                   "%s (CFX_TEST_FAIL=%s): %s (%s), want the injected failure naming rank %d on "
                   "every rank", names[k], spec, cfx_status_string(st), m ? m : "", failing);
        else
            DCHECK(env, st == CFX_OK, "%s after the failures: %s (%s)", names[k],
                   cfx_status_string(st), m ? m : "");
        cfx_handle_release(env->ctx, hf);
        float o[N];
        if (k < 2 || st != CFX_OK || fetch(env, o, d, sizeof o))
            continue;
        size_t end = k == 2 ? N - 1000 : N, bad = 0;
        for (size_t i = 0; i < end; i++)
            bad += o[i] != sum_values(env, i, 1.0f);
        DCHECK(env, bad == 0, "%s: %zu wrong sums after the injected failures", names[k], bad);
    }
    cx_cuda_free(d);
}

int dev_run_cases(cfx_context *ctx)
{
    dev_env env = {ctx, NULL, 0, cfx_rank(ctx), cfx_size(ctx), 0};
    int ndev = cx_cuda_device_count();
    env.device = cfx_local_rank(ctx) % (ndev > 0 ? ndev : 1);
    if (cx_cuda_set_device(env.device) || cx_cuda_stream_create(&env.stream)) {
        DCHECK(&env, 0, "CUDA device %d: %s", env.device, cx_error_message());
        return env.failures;
    }
    void (*cases[])(dev_env *) = {case_injected,  case_grouped_sum,     case_average,
                                  case_broadcast, case_allgather,       case_producer_stream,
                                  case_lone_and_int16, case_min_max_nan, case_mixed_kinds};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cases[i](&env);
    (void)cx_cuda_stream_sync(env.stream);
    cx_cuda_stream_destroy(env.stream);
    return env.failures;
}
