/* cuda_kernels - the kernels behind cuda_kernels.h: batched pack/unpack with its device
 * descriptors, scaling, identity fills and float16/bfloat16 conversions. The runtime calls that
 * launch nothing (devices, memory, streams, events) are plain C in cuda_wrappers.c. */
#include "cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include <stdint.h>
#include <stdlib.h>

extern "C" {
#include "base/error.h"
}
#include "cuda/cuda_check.h"

/* ---- element semantics (reduce.h), bitwise equal to reduce.c ---------------------------------- */

__device__ __forceinline__ float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23);
    uint32_t infnan = (em << 13) | 0x7f800000u | (em > 0x7c00u ? 0x00400000u : 0u);
    uint32_t mag = em >= 0x7c00u ? infnan : normal;
    if (em < 0x0400u)
        mag = __float_as_uint(__fmul_rn((float)(int32_t)em, 0x1p-24f));
    return __uint_as_float(mag | sign);
}

__device__ __forceinline__ uint16_t float_to_half(float f)
{
    uint32_t x = __float_as_uint(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t odd = (ax >> 13) & 1u;
    uint32_t r = (ax + 0xc8000fffu + odd) >> 13;
    r = ax >= 0x47800000u ? 0x7c00u : r;
    r = ax > 0x7f800000u ? (0x7e00u | ((ax >> 13) & 0x03ffu)) : r;
    if (ax < 0x38800000u) /* the float16 subnormal ulp lands on the float's lsb: the FPU rounds */
        r = __float_as_uint(__fadd_rn(__uint_as_float(ax), 0.5f)) - 0x3f000000u;
    return (uint16_t)(r | sign);
}

__device__ __forceinline__ float bhalf_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    return __uint_as_float(x | ((b & 0x7fffu) > 0x7f80u ? 0x00400000u : 0u));
}

__device__ __forceinline__ uint16_t float_to_bhalf(float f)
{
    uint32_t x = __float_as_uint(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t nan = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

/* Scalers, one per dtype: apply(x, fs, fd) with fs = (float)factor and fd = factor. */
template <typename T> __device__ __forceinline__ T int_scale(T x, double f, double lo, double hi)
{
    double v = __dmul_rn((double)x, f);
    v = v == v ? v : 0.0;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return (T)v;
}

struct scale_u8 {
    typedef uint8_t T;
    __device__ static T apply(T x, float, double f) { return int_scale<uint8_t>(x, f, 0.0, 255.0); }
};
struct scale_i8 {
    typedef int8_t T;
    __device__ static T apply(T x, float, double f) { return int_scale<int8_t>(x, f, -128.0, 127.0); }
};
struct scale_u16 {
    typedef uint16_t T;
    __device__ static T apply(T x, float, double f) { return int_scale<uint16_t>(x, f, 0.0, 65535.0); }
};
struct scale_i16 {
    typedef int16_t T;
    __device__ static T apply(T x, float, double f)
    {
        return int_scale<int16_t>(x, f, -32768.0, 32767.0);
    }
};
struct scale_i32 {
    typedef int32_t T;
    __device__ static T apply(T x, float, double f)
    {
        return int_scale<int32_t>(x, f, -2147483648.0, 2147483647.0);
    }
};
struct scale_i64 {
    typedef int64_t T;
    __device__ static T apply(T x, float, double f)
    {
        double v = __dmul_rn((double)x, f);
        v = v == v ? v : 0.0;
        v = v < -0x1p63 ? -0x1p63 : v;
        return v >= 0x1p63 ? INT64_MAX : (int64_t)v;
    }
};
struct scale_f16 {
    typedef uint16_t T;
    __device__ static T apply(T x, float fs, double) { return float_to_half(__fmul_rn(half_to_float(x), fs)); }
};
struct scale_bf16 {
    typedef uint16_t T;
    __device__ static T apply(T x, float fs, double)
    {
        return float_to_bhalf(__fmul_rn(bhalf_to_float(x), fs));
    }
};
struct scale_f32 {
    typedef float T;
    __device__ static T apply(T x, float, double f) { return __double2float_rn(__dmul_rn(x, f)); }
};
struct scale_f64 {
    typedef double T;
    __device__ static T apply(T x, float, double f) { return __dmul_rn(x, f); }
};
struct scale_bool {
    typedef uint8_t T;
    __device__ static T apply(T x, float, double f) { return (uint8_t)(x != 0 && f != 0.0); }
};

/* ---- batched pack / unpack -------------------------------------------------------------------- */

/* A planned descriptor: the caller's tensor plus the first chunk of the batch it covers. */
struct batch_desc {
    const void *input;
    void *output;
    uint64_t offset, count, first_chunk;
};

/* The descriptor owning global chunk `c`: the last one whose first chunk is <= c (empty tensors
 * are dropped when planning, so first chunks strictly increase). */
__device__ __forceinline__ int find_desc(const batch_desc *d, int n, uint64_t c)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (d[mid].first_chunk <= c)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* One block per chunk at a time (grid-stride over every chunk of every tensor). A factor of 1 is
 * a copy, done 16 bytes at a time when both sides are aligned. */
template <class S>
__global__ void batch_kernel(const batch_desc *__restrict__ descs, int n, uint64_t chunks,
                             char *__restrict__ fusion, int unpack, float fs, double fd, int copy)
{
    typedef typename S::T T;
    for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
        const batch_desc d = descs[find_desc(descs, n, c)];
        uint64_t start = (c - d.first_chunk) * CX_CUDA_CHUNK_ELEMS;
        uint64_t rem = d.count - start;
        unsigned len = rem < CX_CUDA_CHUNK_ELEMS ? (unsigned)rem : CX_CUDA_CHUNK_ELEMS;
        T *fb = (T *)fusion + d.offset + start;
        const T *src = unpack ? fb : (const T *)d.input + start;
        T *dst = unpack ? (T *)d.output + start : fb;
        if (copy && (((uintptr_t)src | (uintptr_t)dst) & 15u) == 0) {
            size_t bytes = (size_t)len * sizeof(T);
            size_t vecs = bytes / 16;
            const uint4 *s4 = (const uint4 *)src;
            uint4 *d4 = (uint4 *)dst;
            for (size_t k = threadIdx.x; k < vecs; k += blockDim.x)
                d4[k] = s4[k];
            for (size_t k = vecs * 16 + threadIdx.x; k < bytes; k += blockDim.x)
                ((char *)dst)[k] = ((const char *)src)[k];
        } else if (copy) {
            for (unsigned k = threadIdx.x; k < len; k += blockDim.x)
                dst[k] = src[k];
        } else {
            for (unsigned k = threadIdx.x; k < len; k += blockDim.x)
                dst[k] = S::apply(src[k], fs, fd);
        }
    }
}

/* Flat elementwise kernels over one buffer. */
template <class S>
__global__ void scale_kernel(typename S::T *dst, const typename S::T *src, size_t n, float fs, double fd)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = S::apply(src[i], fs, fd);
}

template <typename T> __global__ void fill_kernel(T *dst, size_t n, T v)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = v;
}

__global__ void f32_to_f16_kernel(uint16_t *dst, const float *src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = float_to_half(src[i]);
}

__global__ void f16_to_f32_kernel(float *dst, const uint16_t *src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = half_to_float(src[i]);
}

__global__ void f32_to_bf16_kernel(uint16_t *dst, const float *src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = float_to_bhalf(src[i]);
}

__global__ void bf16_to_f32_kernel(float *dst, const uint16_t *src, size_t n)
{
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = bhalf_to_float(src[i]);
}

enum { THREADS = 256 };

/* Enough blocks to fill the current device several times over; the loops stride past that. */
static unsigned grid_for(uint64_t work_blocks)
{
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)
        sms = 80;
    uint64_t cap = (uint64_t)sms * 8;
    uint64_t g = work_blocks < cap ? work_blocks : cap;
    return g ? (unsigned)g : 1u;
}

/* Calls F<scaler>::run(args...) for the scaler of `dtype`. */
#define CX_DISPATCH(dtype, RUN)                                                                   \
    switch (dtype) {                                                                              \
    case CFX_UINT8: RUN(scale_u8); break;                                                         \
    case CFX_INT8: RUN(scale_i8); break;                                                          \
    case CFX_UINT16: RUN(scale_u16); break;                                                       \
    case CFX_INT16: RUN(scale_i16); break;                                                        \
    case CFX_INT32: RUN(scale_i32); break;                                                        \
    case CFX_INT64: RUN(scale_i64); break;                                                        \
    case CFX_FLOAT16: RUN(scale_f16); break;                                                      \
    case CFX_BFLOAT16: RUN(scale_bf16); break;                                                    \
    case CFX_FLOAT32: RUN(scale_f32); break;                                                      \
    case CFX_FLOAT64: RUN(scale_f64); break;                                                      \
    case CFX_BOOL: RUN(scale_bool); break;                                                        \
    }

static bool dtype_ok(int32_t dtype) { return dtype >= 0 && dtype < CFX_DTYPE_COUNT; }

struct cx_cuda_batch {
    batch_desc *host;   /* page-locked staging for the upload */
    batch_desc *dev;    /* the descriptors on the device */
    size_t cap;         /* entries of both */
    int n;              /* descriptors of the current batch (empty tensors dropped) */
    uint64_t chunks, elements, span;
    cfx_dtype dtype;
    int device;
    cudaEvent_t uploaded; /* recorded after each upload: the staging memory is free once it fires */
    bool pending;
};

extern "C" uint64_t cx_cuda_chunks(uint64_t count)
{
    return (count + CX_CUDA_CHUNK_ELEMS - 1) / CX_CUDA_CHUNK_ELEMS;
}

extern "C" cfx_status cx_cuda_batch_create(cx_cuda_batch **out)
{
    *out = NULL;
    cx_cuda_batch *b = (cx_cuda_batch *)calloc(1, sizeof *b);
    if (!b)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a CUDA batch");
    cudaError_t e = cudaGetDevice(&b->device);
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&b->uploaded, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(b);
        return cx_cuda_fail(e, "cx_cuda_batch_create");
    }
    *out = b;
    return CFX_OK;
}

extern "C" void cx_cuda_batch_destroy(cx_cuda_batch *b)
{
    if (!b)
        return;
    if (b->pending)
        (void)cudaEventSynchronize(b->uploaded);
    (void)cudaEventDestroy(b->uploaded);
    (void)cudaFreeHost(b->host);
    (void)cudaFree(b->dev);
    free(b);
}

static cfx_status batch_reserve(cx_cuda_batch *b, size_t n, cudaStream_t s)
{
    if (n <= b->cap)
        return CFX_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < n)
        cap *= 2;
    if (b->pending) {
        CX_CUDA_TRY(cudaEventSynchronize(b->uploaded));
        b->pending = false;
    }
    /* The old device array may still be read by a kernel queued on s: freed in stream order (no
     * device-wide synchronisation where the device has memory pools). The old staging is idle
     * (its last upload fired); freeing page-locked memory may synchronise, but this happens only
     * when a batch has more tensors than every batch before it. */
    (void)cudaFreeHost(b->host);
    cx_cuda_free_async(b->dev, s);
    b->host = NULL;
    b->dev = NULL;
    b->cap = 0;
    CX_CUDA_TRY(cudaHostAlloc((void **)&b->host, cap * sizeof *b->host, cudaHostAllocPortable));
    cfx_status st = cx_cuda_malloc_async(cap * sizeof *b->dev, s, (void **)&b->dev);
    if (st)
        return st;
    b->cap = cap;
    return CFX_OK;
}

extern "C" cfx_status cx_cuda_batch_set(cx_cuda_batch *b, const cx_cuda_tensor *tensors, size_t n,
                                        cfx_dtype dtype, void *stream)
{
    if (!b || (n && !tensors) || !dtype_ok(dtype) || n > (size_t)INT32_MAX)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_cuda_batch_set: bad batch, tensors, count "
                       "(%zu) or dtype (%d)", n, (int)dtype);
    cfx_status st = batch_reserve(b, n, (cudaStream_t)stream);
    if (st)
        return st;
    if (b->pending) { /* normally long done: the last upload preceded a whole collective */
        CX_CUDA_TRY(cudaEventSynchronize(b->uploaded));
        b->pending = false;
    }
    uint64_t chunks = 0, elements = 0, span = 0;
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        const cx_cuda_tensor *t = &tensors[i];
        if (t->count == 0)
            continue;
        if (!t->input || !t->output || t->offset > UINT64_MAX - t->count)
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_cuda_batch_set: tensor %zu has a NULL "
                           "pointer or an offset that overflows", i);
        batch_desc *d = &b->host[m++];
        d->input = t->input;
        d->output = t->output;
        d->offset = t->offset;
        d->count = t->count;
        d->first_chunk = chunks;
        chunks += cx_cuda_chunks(t->count);
        elements += t->count;
        span = t->offset + t->count > span ? t->offset + t->count : span;
    }
    b->n = m;
    b->chunks = chunks;
    b->elements = elements;
    b->span = span;
    b->dtype = dtype;
    if (m == 0)
        return CFX_OK;
    cudaStream_t s = (cudaStream_t)stream;
    CX_CUDA_TRY(cudaMemcpyAsync(b->dev, b->host, (size_t)m * sizeof *b->host, cudaMemcpyHostToDevice, s));
    CX_CUDA_TRY(cudaEventRecord(b->uploaded, s));
    b->pending = true;
    return CFX_OK;
}

extern "C" uint64_t cx_cuda_batch_elements(const cx_cuda_batch *b) { return b ? b->elements : 0; }
extern "C" uint64_t cx_cuda_batch_span(const cx_cuda_batch *b) { return b ? b->span : 0; }

static cfx_status batch_run(cx_cuda_batch *b, char *fusion, double scale, void *stream, int unpack)
{
    if (!b || (b->n && !fusion))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_cuda_batch_%s: NULL batch or fusion buffer",
                       unpack ? "unpack" : "pack");
    if (b->n == 0)
        return CFX_OK;
    cudaStream_t s = (cudaStream_t)stream;
    unsigned grid = grid_for(b->chunks);
    float fs = (float)scale;
    int copy = scale == 1.0 && b->dtype != CFX_BOOL; /* bool always normalises to 0/1 */
    cfx_status st = cx_cuda_before_launch(unpack ? "batch unpack launch" : "batch pack launch");
    if (st)
        return st;
#define RUN(S) batch_kernel<S><<<grid, THREADS, 0, s>>>(b->dev, b->n, b->chunks, fusion, unpack, fs, scale, copy)
    CX_DISPATCH(b->dtype, RUN)
#undef RUN
    return cx_cuda_launch_status(unpack ? "batch unpack launch" : "batch pack launch");
}

extern "C" cfx_status cx_cuda_batch_pack(cx_cuda_batch *b, void *fusion, double scale, void *stream)
{
    return batch_run(b, (char *)fusion, scale, stream, 0);
}

extern "C" cfx_status cx_cuda_batch_unpack(cx_cuda_batch *b, const void *fusion, double scale,
                                           void *stream)
{
    /* The kernel only reads the fusion buffer when unpacking. */
    return batch_run(b, (char *)(uintptr_t)fusion, scale, stream, 1);
}

/* ---- single-buffer kernels -------------------------------------------------------------------- */

static size_t dtype_bytes(cfx_dtype dtype)
{
    static const unsigned char sizes[CFX_DTYPE_COUNT] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
    return sizes[dtype];
}

extern "C" cfx_status cx_cuda_scale(void *dst, const void *src, size_t count, cfx_dtype dtype,
                                    double scale, void *stream)
{
    if (!dtype_ok(dtype) || (count && (!dst || !src)))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_cuda_scale: bad dtype (%d) or NULL buffer",
                       (int)dtype);
    bool copy = scale == 1.0 && dtype != CFX_BOOL; /* bool always normalises to 0/1 */
    if (count == 0 || (copy && dst == src))
        return CFX_OK;
    cudaStream_t s = (cudaStream_t)stream;
    if (copy)
        return cx_cuda_memcpy_async(dst, src, count * dtype_bytes(dtype), stream);
    unsigned grid = grid_for((count + THREADS - 1) / THREADS);
    float fs = (float)scale;
    cfx_status st = cx_cuda_before_launch("scale launch");
    if (st)
        return st;
#define RUN(S)                                                                                    \
    scale_kernel<S><<<grid, THREADS, 0, s>>>((S::T *)dst, (const S::T *)src, count, fs, scale)
    CX_DISPATCH(dtype, RUN)
#undef RUN
    return cx_cuda_launch_status("scale launch");
}

template <typename T> static void fill(void *buf, size_t count, T v, unsigned grid, cudaStream_t s)
{
    fill_kernel<T><<<grid, THREADS, 0, s>>>((T *)buf, count, v);
}

extern "C" cfx_status cx_cuda_fill_identity(void *buf, size_t count, cfx_dtype dtype,
                                            cfx_reduce_op op, void *stream)
{
    if (!dtype_ok(dtype) || (int)op < 0 || (int)op >= CFX_OP_COUNT || (count && !buf))
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_cuda_fill_identity: bad dtype (%d), op (%d) "
                       "or NULL buffer", (int)dtype, (int)op);
    if (count == 0)
        return CFX_OK;
    /* slot: 0 sum/average, 1 min, 2 max, 3 product */
    int k = op == CFX_OP_MIN ? 1 : op == CFX_OP_MAX ? 2 : op == CFX_OP_PRODUCT ? 3 : 0;
    unsigned grid = grid_for((count + THREADS - 1) / THREADS);
    cudaStream_t s = (cudaStream_t)stream;
    cfx_status st = cx_cuda_before_launch("identity fill launch");
    if (st)
        return st;
#define PICK(zero, top, bottom, one) (k == 0 ? (zero) : k == 1 ? (top) : k == 2 ? (bottom) : (one))
    switch (dtype) {
    case CFX_UINT8: fill<uint8_t>(buf, count, (uint8_t)PICK(0, UINT8_MAX, 0, 1), grid, s); break;
    case CFX_INT8: fill<int8_t>(buf, count, (int8_t)PICK(0, INT8_MAX, INT8_MIN, 1), grid, s); break;
    case CFX_UINT16: fill<uint16_t>(buf, count, (uint16_t)PICK(0, UINT16_MAX, 0, 1), grid, s); break;
    case CFX_INT16: fill<int16_t>(buf, count, (int16_t)PICK(0, INT16_MAX, INT16_MIN, 1), grid, s); break;
    case CFX_INT32: fill<int32_t>(buf, count, (int32_t)PICK(0, INT32_MAX, INT32_MIN, 1), grid, s); break;
    case CFX_INT64: fill<int64_t>(buf, count, (int64_t)PICK(0, INT64_MAX, INT64_MIN, 1), grid, s); break;
    case CFX_FLOAT16:
        fill<uint16_t>(buf, count, (uint16_t)PICK(0x0000u, 0x7c00u, 0xfc00u, 0x3c00u), grid, s);
        break;
    case CFX_BFLOAT16:
        fill<uint16_t>(buf, count, (uint16_t)PICK(0x0000u, 0x7f80u, 0xff80u, 0x3f80u), grid, s);
        break;
    case CFX_FLOAT32:
        fill<float>(buf, count, PICK(0.0f, __builtin_huge_valf(), -__builtin_huge_valf(), 1.0f), grid, s);
        break;
    case CFX_FLOAT64:
        fill<double>(buf, count, PICK(0.0, __builtin_huge_val(), -__builtin_huge_val(), 1.0), grid, s);
        break;
    case CFX_BOOL: fill<uint8_t>(buf, count, (uint8_t)PICK(0, 1, 0, 1), grid, s); break;
    }
#undef PICK
    return cx_cuda_launch_status("identity fill launch");
}

/* ---- conversions ------------------------------------------------------------------------------ */

#define CX_CONVERT(fn, kernel, DT, ST)                                                            \
    extern "C" cfx_status fn(DT *dst, const ST *src, size_t count, void *stream)                  \
    {                                                                                             \
        if (count && (!dst || !src))                                                              \
            return cx_fail(CFX_ERR_INVALID_ARGUMENT, #fn ": NULL buffer");                        \
        if (count == 0)                                                                           \
            return CFX_OK;                                                                        \
        unsigned grid = grid_for((count + THREADS - 1) / THREADS);                                \
        cfx_status st = cx_cuda_before_launch(#fn " launch");                                            \
        if (st)                                                                                   \
            return st;                                                                            \
        kernel<<<grid, THREADS, 0, (cudaStream_t)stream>>>(dst, src, count);                      \
        return cx_cuda_launch_status(#fn " launch");                                                      \
    }

CX_CONVERT(cx_cuda_f32_to_f16, f32_to_f16_kernel, uint16_t, float)
CX_CONVERT(cx_cuda_f16_to_f32, f16_to_f32_kernel, float, uint16_t)
CX_CONVERT(cx_cuda_f32_to_bf16, f32_to_bf16_kernel, uint16_t, float)
CX_CONVERT(cx_cuda_bf16_to_f32, bf16_to_f32_kernel, float, uint16_t)
