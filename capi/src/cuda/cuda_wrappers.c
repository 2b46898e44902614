/* cuda_wrappers - the calls of cuda_kernels.h that launch no kernel: devices, memory, streams and
 * events. Plain C against the CUDA runtime API, so no nvcc is needed for it; the kernels are in
 * cuda_kernels.cu. */
#include "cuda/cuda_kernels.h"

#include <cuda_runtime_api.h>

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "cuda/cuda_check.h"

static bool no_device_error(cudaError_t e)
{
    return e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice;
}

/* ---- devices ---------------------------------------------------------------------------------- */

int cx_cuda_device_count(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear it so the next call's status is its own */
        return 0;
    }
    return n > 0 ? n : 0;
}

cfx_status cx_cuda_probe(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        /* 35/100 are the expected answers of a machine without a GPU; any other error also means
         * no usable device, but is worth naming as such. */
        return cx_fail(CFX_ERR_CUDA, "%s: cudaGetDeviceCount: %s (%d): %s",
                       no_device_error(e) ? "no driver or no device" : "CUDA unusable",
                       cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
    }
    if (n <= 0)
        return cx_fail(CFX_ERR_CUDA, "cudaGetDeviceCount: 0 devices");
    return CFX_OK;
}

cfx_status cx_cuda_set_device(int device)
{
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == device)
        return CFX_OK;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cx_fail(CFX_ERR_CUDA, "cudaSetDevice(%d): %s (%d): %s", device, cudaGetErrorName(e),
                       (int)e, cudaGetErrorString(e));
    }
    return CFX_OK;
}

cfx_status cx_cuda_device_id(int device, char *out, size_t len)
{
    if (!out || len < 2 || len > (size_t)INT32_MAX)
        return cx_fail(CFX_ERR_INVALID_ARGUMENT, "cx_cuda_device_id: bad output buffer");
    cudaError_t e = cudaDeviceGetPCIBusId(out, (int)len, device);
    if (e != cudaSuccess) {
        out[0] = '\0';
        return cx_cuda_fail(e, "cudaDeviceGetPCIBusId");
    }
    return CFX_OK;
}

cfx_status cx_cuda_pointer_device(const void *ptr, int *out)
{
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    cudaError_t e = cudaPointerGetAttributes(&a, ptr);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cx_cuda_fail(e, "cudaPointerGetAttributes");
    }
    if (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) {
        *out = a.device;
        return CFX_OK;
    }
    return cx_fail(CFX_ERR_INVALID_ARGUMENT, "pointer %p is %s memory, not CUDA device memory", ptr,
                   a.type == cudaMemoryTypeHost ? "page-locked host" : "pageable host");
}

/* ---- memory ----------------------------------------------------------------------------------- */

cfx_status cx_cuda_malloc(size_t bytes, void **out)
{
    *out = NULL;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cudaMalloc of %zu bytes: out of device memory", bytes);
    }
    return e == cudaSuccess ? CFX_OK : cx_cuda_fail(e, "cudaMalloc");
}

void cx_cuda_free(void *ptr)
{
    if (ptr)
        (void)cudaFree(ptr);
}

/* Whether the current device has stream-ordered allocation (cudaMallocAsync, CUDA 11.2+). */
static bool has_memory_pools(void)
{
    int dev = 0, pools = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return pools != 0;
}

cfx_status cx_cuda_malloc_async(size_t bytes, void *stream, void **out)
{
    *out = NULL;
    if (!has_memory_pools())
        return cx_cuda_malloc(bytes, out);
    cudaError_t e = cudaMallocAsync(out, bytes ? bytes : 1, (cudaStream_t)stream);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cudaMallocAsync of %zu bytes: out of device memory",
                       bytes);
    }
    return e == cudaSuccess ? CFX_OK : cx_cuda_fail(e, "cudaMallocAsync");
}

void cx_cuda_free_async(void *ptr, void *stream)
{
    if (!ptr)
        return;
    if (!has_memory_pools() || cudaFreeAsync(ptr, (cudaStream_t)stream) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaFree(ptr);
    }
}

cfx_status cx_cuda_host_alloc(size_t bytes, void **out)
{
    *out = NULL;
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cudaHostAlloc of %zu bytes: out of memory", bytes);
    }
    return e == cudaSuccess ? CFX_OK : cx_cuda_fail(e, "cudaHostAlloc");
}

void cx_cuda_host_free(void *ptr)
{
    if (ptr)
        (void)cudaFreeHost(ptr);
}

cfx_status cx_cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream)
{
    if (bytes == 0)
        return CFX_OK;
    CX_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, (cudaStream_t)stream));
    return CFX_OK;
}

/* ---- streams and events ----------------------------------------------------------------------- */

cfx_status cx_cuda_stream_create(void **out)
{
    cudaStream_t s = NULL;
    CX_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = s;
    return CFX_OK;
}

void cx_cuda_stream_destroy(void *stream)
{
    if (stream)
        (void)cudaStreamDestroy((cudaStream_t)stream);
}

static void backoff(unsigned *spins)
{
    if (++*spins < 64)
        return;
    struct timespec ts = {0, *spins < 1024 ? 2000 : 50000}; /* 2 us, later 50 us */
    nanosleep(&ts, NULL);
}

cfx_status cx_cuda_stream_sync(void *stream)
{
    unsigned spins = 0;
    for (;;) {
        cudaError_t e = cudaStreamQuery((cudaStream_t)stream);
        if (e == cudaSuccess)
            return CFX_OK;
        if (e != cudaErrorNotReady)
            return cx_cuda_fail(e, "cudaStreamQuery");
        (void)cudaGetLastError(); /* not an error: the next launch must not report it as its own */
        backoff(&spins);
    }
}

bool cx_cuda_stream_is_per_thread(const void *stream)
{
    return stream == (const void *)cudaStreamPerThread;
}

cfx_status cx_cuda_record_ready(int device, void *stream, void **out)
{
    *out = NULL;
    int prev = -1;
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess && prev != device)
        e = cudaSetDevice(device);
    cudaEvent_t ev = NULL;
    if (e == cudaSuccess)
        e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess)
        e = cudaEventRecord(ev, (cudaStream_t)stream);
    if (prev >= 0 && prev != device)
        (void)cudaSetDevice(prev);
    if (e != cudaSuccess) {
        if (ev)
            (void)cudaEventDestroy(ev);
        return cx_cuda_fail(e, "recording a device tensor's ready event on its stream");
    }
    *out = ev;
    return CFX_OK;
}

cfx_status cx_cuda_stream_wait(void *stream, void *event)
{
    CX_CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0));
    return CFX_OK;
}

cfx_status cx_cuda_event_create(void **out)
{
    cudaEvent_t ev = NULL;
    CX_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = ev;
    return CFX_OK;
}

void cx_cuda_event_destroy(void *event)
{
    if (event)
        (void)cudaEventDestroy((cudaEvent_t)event);
}

cfx_status cx_cuda_stream_after(void *consumer, void *producer, void *event)
{
    if (consumer == producer)
        return CFX_OK; /* one stream is already ordered */
    CX_CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)producer));
    CX_CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)consumer, (cudaEvent_t)event, 0));
    return CFX_OK;
}

cfx_status cx_cuda_event_record(void *event, void *stream)
{
    CX_CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream));
    return CFX_OK;
}

cfx_status cx_cuda_event_query(void *event, int *done)
{
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    *done = e == cudaSuccess;
    if (e == cudaSuccess || e == cudaErrorNotReady) {
        if (e == cudaErrorNotReady)
            (void)cudaGetLastError();
        return CFX_OK;
    }
    return cx_cuda_fail(e, "cudaEventQuery");
}
