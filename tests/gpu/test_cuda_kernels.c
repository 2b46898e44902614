/*
 * test_cuda_kernels - the device kernels against the host reference (reduce.c, which defines the
 * element semantics): batched pack/unpack with fused scaling for every dtype, many-tensor batches,
 * scaling, identity fills, float16/bfloat16 conversions, and the stream/event/pointer helpers.
 * Results must be bitwise equal to the host's, except that a NaN only has to stay a NaN (a GPU
 * multiply returns the canonical NaN, the CPU keeps the payload).
 * Without a usable device it prints "skipped: no CUDA device (...)" and exits 77.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_kernels.h"
#include "base/error.h"
#include "gpu_test.h"
#include "kernels/reduce.h"

static const char *const TEST = "test_cuda_kernels";

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    REQUIRE_OK(cx_cuda_malloc(bytes, &p));
    return p;
}

static void to_dev(void *d, const void *h, size_t bytes)
{
    REQUIRE_OK(cx_cuda_memcpy_async(d, h, bytes, NULL));
    REQUIRE_OK(cx_cuda_stream_sync(NULL));
}

static void to_host(void *h, const void *d, size_t bytes)
{
    REQUIRE_OK(cx_cuda_memcpy_async(h, d, bytes, NULL));
    REQUIRE_OK(cx_cuda_stream_sync(NULL));
}

static bool is_nan(const void *p, cfx_dtype dt)
{
    uint16_t h;
    switch (dt) {
    case CFX_FLOAT16: memcpy(&h, p, 2); return (h & 0x7fffu) > 0x7c00u;
    case CFX_BFLOAT16: memcpy(&h, p, 2); return (h & 0x7fffu) > 0x7f80u;
    case CFX_FLOAT32: { float f; memcpy(&f, p, 4); return isnan(f); }
    case CFX_FLOAT64: { double d; memcpy(&d, p, 8); return isnan(d); }
    default: return false;
    }
}

/* Compares n elements; returns the number of mismatches (reports the first). */
static size_t compare(const char *what, const void *got, const void *want, size_t n, cfx_dtype dt)
{
    size_t es = cfx_dtype_size(dt), bad = 0;
    const unsigned char *g = got, *w = want;
    for (size_t i = 0; i < n; i++) {
        const unsigned char *gi = g + i * es, *wi = w + i * es;
        if (memcmp(gi, wi, es) == 0 || (is_nan(wi, dt) && is_nan(gi, dt)))
            continue;
        if (!bad) {
            uint64_t gv = 0, wv = 0;
            memcpy(&gv, gi, es);
            memcpy(&wv, wi, es);
            fprintf(stderr, "  %s (%s): element %zu is 0x%llx, want 0x%llx\n", what,
                    cfx_dtype_name(dt), i, (unsigned long long)gv, (unsigned long long)wv);
        }
        bad++;
    }
    return bad;
}

/* Random element bits; floats get ordinary values mostly and specials (NaN, inf, subnormals, huge)
 * sometimes, integers the full range including the extremes. */
static void fill_random(void *buf, size_t n, cfx_dtype dt, uint64_t *rng)
{
    size_t es = cfx_dtype_size(dt);
    unsigned char *b = buf;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = gpu_test_rand(rng);
        unsigned pick = (unsigned)(r >> 58); /* 0..63 */
        switch (dt) {
        case CFX_FLOAT32: {
            float f = pick < 56 ? (float)((double)(int64_t)(r & 0xffffffffu) / 65536.0 - 32768.0)
                                : (float)0;
            uint32_t u;
            memcpy(&u, &f, 4);
            if (pick >= 56)
                u = (uint32_t)r; /* any bits: NaN, inf, subnormal */
            memcpy(b + i * 4, &u, 4);
            break;
        }
        case CFX_FLOAT64: {
            double d = pick < 56 ? (double)(int64_t)r / 1e12 : 0.0;
            uint64_t u;
            memcpy(&u, &d, 8);
            if (pick >= 56)
                u = r;
            memcpy(b + i * 8, &u, 8);
            break;
        }
        case CFX_FLOAT16:
        case CFX_BFLOAT16: {
            uint16_t u = (uint16_t)r;
            if (pick < 56) /* ordinary magnitudes: keep the exponent moderate */
                u = dt == CFX_FLOAT16 ? (uint16_t)((u & 0x83ffu) | ((8u + (r >> 40) % 14u) << 10))
                                      : (uint16_t)((u & 0x807fu) | ((120u + (r >> 40) % 16u) << 7));
            memcpy(b + i * 2, &u, 2);
            break;
        }
        case CFX_BOOL: b[i] = (unsigned char)(pick < 40 ? (r & 1) : (r >> 8) & 0xff); break;
        default:
            if (pick >= 60) /* the extremes, to exercise saturation */
                r = (r & 1) ? ~0ULL >> 1 : 1ULL << 63;
            memcpy(b + i * es, &r, es);
            break;
        }
    }
}

/* reduce.c's scaling, except that the device always normalises bool to 0/1 (a host factor of 1
 * is a plain copy; the host reductions normalise later, the device ones cannot). */
static void ref_scale_copy(void *dst, const void *src, size_t n, cfx_dtype dt, double f)
{
    if (dt == CFX_BOOL && f == 1.0) {
        for (size_t i = 0; i < n; i++)
            ((unsigned char *)dst)[i] = ((const unsigned char *)src)[i] != 0;
        return;
    }
    cx_scale_copy(dst, src, n, dt, f);
}

static uint32_t bits32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* One batch of `n` tensors of `dt` with the given counts: pack with `pre`, unpack with `post`,
 * both against reduce.c; tensor 1 (when present) is unpacked in place. */
static void check_batch(cfx_dtype dt, const uint64_t *counts, size_t n, double pre, double post,
                        cx_cuda_batch *batch, uint64_t *rng)
{
    size_t es = cfx_dtype_size(dt);
    cx_cuda_tensor *t = calloc(n, sizeof *t);
    void **hin = calloc(n, sizeof *hin), **din = calloc(n, sizeof *din), **dout = calloc(n, sizeof *dout);
    uint64_t span = 0;
    for (size_t i = 0; i < n; i++) {
        span += i % 3 == 2 ? 1 : 0; /* a gap now and then: misaligned regions and untouched bytes */
        t[i].offset = span;
        t[i].count = counts[i];
        span += counts[i];
        hin[i] = malloc(counts[i] * es + 1);
        fill_random(hin[i], counts[i], dt, rng);
        din[i] = dev_alloc(counts[i] * es);
        to_dev(din[i], hin[i], counts[i] * es);
        dout[i] = i == 1 ? din[i] : dev_alloc(counts[i] * es);
        t[i].input = din[i];
        t[i].output = dout[i];
    }
    size_t fbytes = span * es + 1;
    unsigned char *want = malloc(fbytes), *got = malloc(fbytes);
    memset(want, 0xab, fbytes);
    for (size_t i = 0; i < n; i++)
        ref_scale_copy(want + t[i].offset * es, hin[i], counts[i], dt, pre);
    void *fusion = dev_alloc(fbytes);
    memset(got, 0xab, fbytes); /* sentinels in the gaps must survive the pack */
    to_dev(fusion, got, fbytes);
    void *stream = NULL;
    REQUIRE_OK(cx_cuda_stream_create(&stream));
    REQUIRE_OK(cx_cuda_batch_set(batch, t, n, dt, stream));
    REQUIRE_OK(cx_cuda_batch_pack(batch, fusion, pre, stream));
    REQUIRE_OK(cx_cuda_stream_sync(stream));
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += counts[i];
    CHECK(cx_cuda_batch_elements(batch) == total, "elements %llu, want %llu",
          (unsigned long long)cx_cuda_batch_elements(batch), (unsigned long long)total);
    to_host(got, fusion, fbytes);
    char what[96];
    snprintf(what, sizeof what, "pack of %zu tensors, prescale %g", n, pre);
    size_t bad = compare(what, got, want, span, dt);
    CHECK(bad == 0, "%s: %zu mismatches", what, bad);

    REQUIRE_OK(cx_cuda_batch_unpack(batch, fusion, post, stream));
    REQUIRE_OK(cx_cuda_stream_sync(stream));
    for (size_t i = 0; i < n; i++) {
        unsigned char *ref = malloc(counts[i] * es + 1), *out = malloc(counts[i] * es + 1);
        ref_scale_copy(ref, want + t[i].offset * es, counts[i], dt, post);
        to_host(out, dout[i], counts[i] * es);
        snprintf(what, sizeof what, "unpack of tensor %zu (%llu elements), postscale %g", i,
                 (unsigned long long)counts[i], post);
        bad = compare(what, out, ref, counts[i], dt);
        CHECK(bad == 0, "%s: %zu mismatches", what, bad);
        free(ref);
        free(out);
    }
    cx_cuda_stream_destroy(stream);
    cx_cuda_free(fusion);
    for (size_t i = 0; i < n; i++) {
        if (dout[i] != din[i])
            cx_cuda_free(dout[i]);
        cx_cuda_free(din[i]);
        free(hin[i]);
    }
    free(want);
    free(got);
    free(t);
    free(hin);
    free(din);
    free(dout);
}

static void test_batches(uint64_t *rng)
{
    static const uint64_t mixed[] = {1, 4095, 0, 4096, 4097, 10000, 3, 257 * 1024 + 5, 64, 7};
    static const double scales[][2] = {{1.0, 1.0}, {0.25, 0.5}, {1.0 / 3.0, -2.5}, {3.0e10, 1.0}};
    cx_cuda_batch *batch = NULL;
    REQUIRE_OK(cx_cuda_batch_create(&batch));
    for (int dt = 0; dt < CFX_DTYPE_COUNT; dt++)
        for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++)
            check_batch((cfx_dtype)dt, mixed, sizeof mixed / sizeof mixed[0], scales[s][0],
                        scales[s][1], batch, rng);
    /* Many small tensors in one launch: the descriptor search, and a batch larger than the last. */
    enum { MANY = 3000 };
    uint64_t *many = malloc(MANY * sizeof *many);
    for (size_t i = 0; i < MANY; i++)
        many[i] = 1 + gpu_test_rand(rng) % 700;
    check_batch(CFX_FLOAT32, many, MANY, 0.125, 8.0, batch, rng);
    check_batch(CFX_FLOAT16, many, MANY, 1.0, 1.0 / 6.0, batch, rng);
    free(many);
    cx_cuda_batch_destroy(batch);
}

static void test_scale_and_fill(uint64_t *rng)
{
    const size_t n = 100003;
    for (int dt = 0; dt < CFX_DTYPE_COUNT; dt++) {
        size_t es = cfx_dtype_size((cfx_dtype)dt);
        unsigned char *h = malloc(n * es), *ref = malloc(n * es), *out = malloc(n * es);
        fill_random(h, n, (cfx_dtype)dt, rng);
        void *d = dev_alloc(n * es), *d2 = dev_alloc(n * es);
        to_dev(d, h, n * es);
        /* copy form, then in place */
        CHECK_OK(cx_cuda_scale(d2, d, n, (cfx_dtype)dt, 0.75, NULL));
        CHECK_OK(cx_cuda_scale(d, d, n, (cfx_dtype)dt, -3.0, NULL));
        REQUIRE_OK(cx_cuda_stream_sync(NULL));
        cx_scale_copy(ref, h, n, (cfx_dtype)dt, 0.75);
        to_host(out, d2, n * es);
        CHECK(compare("scale copy", out, ref, n, (cfx_dtype)dt) == 0, "scale copy %s",
              cfx_dtype_name((cfx_dtype)dt));
        memcpy(ref, h, n * es);
        cx_scale(ref, n, (cfx_dtype)dt, -3.0);
        to_host(out, d, n * es);
        CHECK(compare("scale in place", out, ref, n, (cfx_dtype)dt) == 0, "scale in place %s",
              cfx_dtype_name((cfx_dtype)dt));
        for (int op = 0; op < CFX_OP_COUNT; op++) {
            CHECK_OK(cx_cuda_fill_identity(d, n, (cfx_dtype)dt, (cfx_reduce_op)op, NULL));
            REQUIRE_OK(cx_cuda_stream_sync(NULL));
            cx_fill_identity(ref, n, (cfx_dtype)dt, (cfx_reduce_op)op);
            to_host(out, d, n * es);
            CHECK(memcmp(out, ref, n * es) == 0, "identity of %s for %s", cfx_op_name((cfx_reduce_op)op),
                  cfx_dtype_name((cfx_dtype)dt));
        }
        cx_cuda_free(d);
        cx_cuda_free(d2);
        free(h);
        free(ref);
        free(out);
    }
}

static void test_conversions(uint64_t *rng)
{
    /* Every float16/bfloat16 bit pattern widens exactly; narrowing is checked on random float32
     * bits (NaN, inf, subnormals, overflow, ties) and on the widened values (round trip). */
    const size_t n = 1 << 20;
    float *f = malloc(n * sizeof *f), *fo = malloc(n * sizeof *fo);
    uint16_t *h = malloc(n * sizeof *h), *ho = malloc(n * sizeof *ho);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)gpu_test_rand(rng);
        if (i < 65536)
            u = (uint32_t)i << 13 | (i & 1u) << 12; /* float16 ties and near-ties */
        memcpy(&f[i], &u, 4);
    }
    float *df = dev_alloc(n * sizeof *df), *dfo = dev_alloc(n * sizeof *dfo);
    uint16_t *dh = dev_alloc(n * sizeof *dh);
    to_dev(df, f, n * sizeof *f);
    for (int bf = 0; bf < 2; bf++) {
        const char *name = bf ? "bfloat16" : "float16";
        CHECK_OK(bf ? cx_cuda_f32_to_bf16(dh, df, n, NULL) : cx_cuda_f32_to_f16(dh, df, n, NULL));
        to_host(ho, dh, n * sizeof *ho);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            uint16_t want = bf ? cx_f32_to_bf16(f[i]) : cx_f32_to_f16(f[i]);
            if (ho[i] != want && !bad++)
                fprintf(stderr, "  f32 0x%08x -> %s 0x%04x, want 0x%04x\n", bits32(f[i]), name,
                        ho[i], want);
        }
        CHECK(bad == 0, "float32 -> %s: %zu mismatches", name, bad);
        for (size_t i = 0; i < 65536; i++)
            h[i] = (uint16_t)i;
        to_dev(dh, h, 65536 * sizeof *h);
        CHECK_OK(bf ? cx_cuda_bf16_to_f32(dfo, dh, 65536, NULL) : cx_cuda_f16_to_f32(dfo, dh, 65536, NULL));
        to_host(fo, dfo, 65536 * sizeof *fo);
        bad = 0;
        for (size_t i = 0; i < 65536; i++) {
            float want = bf ? cx_bf16_to_f32((uint16_t)i) : cx_f16_to_f32((uint16_t)i);
            if (memcmp(&fo[i], &want, 4) != 0 && !bad++)
                fprintf(stderr, "  %s 0x%04zx -> 0x%08x, want 0x%08x\n", name, i, bits32(fo[i]),
                        bits32(want));
        }
        CHECK(bad == 0, "%s -> float32: %zu mismatches over all 65536 patterns", name, bad);
        to_dev(df, f, n * sizeof *f); /* restore the input */
    }
    cx_cuda_free(df);
    cx_cuda_free(dfo);
    cx_cuda_free(dh);
    free(f);
    free(fo);
    free(h);
    free(ho);
}

static void test_streams_and_errors(void)
{
    /* producer fills, consumer packs after it without a host wait in between */
    const size_t n = 1 << 22;
    float *h = malloc(n * sizeof *h), *o = malloc(n * sizeof *o);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)i;
    void *pinned = NULL;
    REQUIRE_OK(cx_cuda_host_alloc(n * sizeof *h, &pinned));
    memcpy(pinned, h, n * sizeof *h);
    void *prod = NULL, *cons = NULL, *ev = NULL;
    REQUIRE_OK(cx_cuda_stream_create(&prod));
    REQUIRE_OK(cx_cuda_stream_create(&cons));
    REQUIRE_OK(cx_cuda_event_create(&ev));
    float *src = dev_alloc(n * sizeof *src), *fusion = dev_alloc(n * sizeof *fusion);
    CHECK_OK(cx_cuda_memcpy_async(src, pinned, n * sizeof *h, prod));
    CHECK_OK(cx_cuda_stream_after(cons, prod, ev));
    cx_cuda_tensor t = {src, src, 0, n};
    cx_cuda_batch *b = NULL;
    REQUIRE_OK(cx_cuda_batch_create(&b));
    CHECK_OK(cx_cuda_batch_set(b, &t, 1, CFX_FLOAT32, cons));
    CHECK_OK(cx_cuda_batch_pack(b, fusion, 2.0, cons));
    void *done_ev = NULL;
    REQUIRE_OK(cx_cuda_event_create(&done_ev));
    CHECK_OK(cx_cuda_event_record(done_ev, cons));
    int done = 0;
    while (!done)
        REQUIRE_OK(cx_cuda_event_query(done_ev, &done));
    to_host(o, fusion, n * sizeof *o);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += o[i] != 2.0f * (float)i;
    CHECK(bad == 0, "pack after the producer's stream: %zu wrong elements", bad);

    int dev = -1;
    CHECK_OK(cx_cuda_pointer_device(src, &dev));
    CHECK(dev == 0, "device pointer reported on device %d", dev);
    CHECK(cx_cuda_pointer_device(h, &dev) == CFX_ERR_INVALID_ARGUMENT, "host pointer accepted");
    CHECK(cx_cuda_set_device(1 << 20) == CFX_ERR_CUDA, "a nonexistent device was accepted");
    char bus[64];
    CHECK_OK(cx_cuda_device_id(0, bus, sizeof bus));
    CHECK(strlen(bus) >= 7 && strchr(bus, ':'), "PCI bus id '%s'", bus);
    printf("%s: device 0 is %s\n", TEST, bus);
    CHECK_OK(cx_cuda_set_device(0));
    cx_cuda_tensor badt = {NULL, src, 0, 5};
    CHECK(cx_cuda_batch_set(b, &badt, 1, CFX_FLOAT32, cons) == CFX_ERR_INVALID_ARGUMENT,
          "a NULL input was accepted");
    CHECK(cx_cuda_batch_set(b, &t, 1, (cfx_dtype)99, cons) == CFX_ERR_INVALID_ARGUMENT,
          "dtype 99 was accepted");

    cx_cuda_batch_destroy(b);
    cx_cuda_event_destroy(ev);
    cx_cuda_event_destroy(done_ev);
    cx_cuda_stream_destroy(prod);
    cx_cuda_stream_destroy(cons);
    cx_cuda_free(src);
    cx_cuda_free(fusion);
    cx_cuda_host_free(pinned);
    free(h);
    free(o);
}

int main(void)
{
    /* Host-only parts first: they hold everywhere. */
    CHECK(cx_cuda_chunks(0) == 0 && cx_cuda_chunks(1) == 1 &&
          cx_cuda_chunks(CX_CUDA_CHUNK_ELEMS) == 1 && cx_cuda_chunks(CX_CUDA_CHUNK_ELEMS + 1) == 2,
          "chunk arithmetic");
    cx_cuda_free(NULL);
    cx_cuda_host_free(NULL);
    cx_cuda_batch_destroy(NULL);
    cx_cuda_stream_destroy(NULL);
    cx_cuda_event_destroy(NULL);

    if (cx_cuda_probe() != CFX_OK) {
        /* No device must mean a clean answer, never a crash or a hang. */
        CHECK(cx_cuda_device_count() == 0, "a device count without a usable device");
        cx_cuda_batch *b = NULL;
        CHECK(cx_cuda_batch_create(&b) == CFX_ERR_CUDA && b == NULL, "batch without a device");
        void *p = NULL;
        CHECK(cx_cuda_malloc(16, &p) != CFX_OK && p == NULL, "cudaMalloc without a device");
        char bus[64];
        CHECK(cx_cuda_device_id(0, bus, sizeof bus) == CFX_ERR_CUDA && bus[0] == '\0',
              "a PCI bus id without a device");
        if (gpu_test_failures)
            return gpu_test_finish(TEST);
        char reason[CX_ERROR_MAX];
        cx_cuda_probe();
        snprintf(reason, sizeof reason, "%s", cx_error_message());
        return gpu_test_skip(TEST, reason);
    }
    REQUIRE_OK(cx_cuda_set_device(0));
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
    test_batches(&rng);
    test_scale_and_fill(&rng);
    test_conversions(&rng);
    test_streams_and_errors();
    return gpu_test_finish(TEST);
}
