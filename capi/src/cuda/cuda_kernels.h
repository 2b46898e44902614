/*
 * cuda_kernels - the CUDA side of device tensors: batched pack/unpack of many tensors into one
 * device fusion buffer in a single launch (prescale / postscale fused in), scaling and identity
 * fills, float32 <-> float16/bfloat16 conversion, device queries, stream/event ordering, and the
 * small set of memory helpers the engine and the tests need.
 *
 * The interface is plain C with no CUDA types: streams and events are `void *` (a cudaStream_t /
 * cudaEvent_t), so engine code including this header needs no CUDA include path. Every function is
 * asynchronous on the stream it is given unless it says otherwise; only cx_cuda_free and
 * cx_cuda_host_free may synchronise the whole device (CUDA's cudaFree/cudaFreeHost do), so the
 * engine allocates its device buffers stream-ordered and its page-locked staging once. Each kernel
 * launch first checks cudaGetLastError() (a cudaErrorNotReady left by a query is cleared, any other
 * pending error is reported as such) and then the launch's own status. Failures return CFX_ERR_CUDA
 * (or CFX_ERR_INVALID_ARGUMENT / CFX_ERR_OUT_OF_MEMORY) and set the message with cx_fail(), naming
 * the CUDA error.
 *
 * Element semantics are those of reduce.h, so a device result is bitwise the host one:
 * float16/bfloat16 scale in float32 and round to nearest even; float32 scales by (float)factor;
 * integers scale in double, truncate toward zero and saturate (NaN gives 0); bool gives
 * (x != 0 && factor != 0). A factor of exactly 1.0 is a plain copy, except for bool, which is
 * always normalised to 0/1 (so NCCL's max/min on bytes give the host's or/and).
 *
 * Called by the context's background thread (execute.c, nccl_transport.c) and by tests/gpu.
 * Stateless apart from cx_cuda_batch, which one thread owns.
 *
 * Implemented in two files: the kernels and the batch that feeds them in cuda_kernels.cu (nvcc),
 * the calls that launch nothing (devices, memory, streams, events) in cuda_wrappers.c (plain C).
 */
#ifndef CFX_CUDA_KERNELS_H
#define CFX_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- devices ---------------------------------------------------------------------------------- */

/* Usable CUDA devices: 0 when there is no driver (cudaErrorInsufficientDriver), no device
 * (cudaErrorNoDevice) or any other failure. Never crashes, never sets the error message. */
int cx_cuda_device_count(void);

/* CFX_OK when at least one device is usable; otherwise CFX_ERR_CUDA and a message naming the CUDA
 * error (e.g. "cudaGetDeviceCount: cudaErrorInsufficientDriver (35): ..."), which the GPU tests
 * print in their "skipped: no CUDA device (...)" line. */
cfx_status cx_cuda_probe(void);

/* Makes `device` current for the calling thread (a no-op when it already is). CFX_ERR_CUDA for an
 * ordinal that does not exist or cannot be used. */
cfx_status cx_cuda_set_device(int device);

/* The PCI bus id of `device` ("0000:19:00.0"), which names one physical GPU across processes: two
 * ranks on one host with the same id share a GPU (NCCL refuses that; use the host-staged path). */
cfx_status cx_cuda_device_id(int device, char *out, size_t len);

/* The device ordinal that owns the memory at `ptr`: CFX_ERR_INVALID_ARGUMENT when `ptr` is host
 * memory the device cannot address. Managed memory reports the current device. Synchronous. */
cfx_status cx_cuda_pointer_device(const void *ptr, int *out);

/* ---- memory (on the current device) ----------------------------------------------------------- */

cfx_status cx_cuda_malloc(size_t bytes, void **out);
void cx_cuda_free(void *ptr);                       /* accepts NULL; returns with the memory freed */
/* Stream-ordered (cudaMallocAsync / cudaFreeAsync where the device has memory pools, else
 * cudaMalloc / cudaFree): no device-wide synchronisation, and a free waits for the work queued on
 * `stream` before it. CFX_ERR_OUT_OF_MEMORY when the device is full. */
cfx_status cx_cuda_malloc_async(size_t bytes, void *stream, void **out);
void cx_cuda_free_async(void *ptr, void *stream);   /* accepts NULL */
cfx_status cx_cuda_host_alloc(size_t bytes, void **out); /* page-locked host memory */
void cx_cuda_host_free(void *ptr);                  /* accepts NULL */

/* Asynchronous copy of `bytes` on `stream`, any direction (cudaMemcpyDefault: unified addressing).
 * A host side must be page-locked for the copy to overlap; pageable memory works but stalls. */
cfx_status cx_cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream);

/* ---- streams and events ----------------------------------------------------------------------- */

/* A non-blocking stream (no implicit ordering with the legacy default stream) on the current
 * device; the engine keeps one per context for its kernels and NCCL calls. */
cfx_status cx_cuda_stream_create(void **out);
void cx_cuda_stream_destroy(void *stream);          /* accepts NULL; pending work still completes */

/* Waits on the host until `stream`'s work so far is done: a stream, never a device, sync. Spins
 * briefly and then sleeps, so the background thread does not burn a core. Unbounded: the engine
 * polls events against a deadline instead (device_exec.c). */
cfx_status cx_cuda_stream_sync(void *stream);

/* Whether `stream` is the handle cudaStreamPerThread (2), which means "the calling thread's
 * default stream" and so names another stream on every thread. */
bool cx_cuda_stream_is_per_thread(const void *stream);

/* The ready point of a device tensor, taken at submission on the calling thread: a new event
 * recorded on `stream` with `device` current for the call (the caller's current device is put
 * back). On the caller's thread a per-thread default stream (cudaStreamPerThread) means the
 * caller's own. *out gets the event (cx_cuda_event_destroy frees it). */
cfx_status cx_cuda_record_ready(int device, void *stream, void **out);
/* Makes `stream` wait on `event` (no host wait). */
cfx_status cx_cuda_stream_wait(void *stream, void *event);

/* An event without timing (cheap to record and wait on). */
cfx_status cx_cuda_event_create(void **out);
void cx_cuda_event_destroy(void *event);            /* accepts NULL */

/* Records `event` on `producer` and makes `consumer` wait on it: work submitted to `consumer`
 * afterwards runs after everything submitted to `producer` before this call. No host blocking.
 * Used twice per collective: the engine stream waits on the tensor's producer stream before
 * reading, and the caller's stream waits on the engine stream before using the result. A NULL
 * stream is the legacy default stream. */
cfx_status cx_cuda_stream_after(void *consumer, void *producer, void *event);

cfx_status cx_cuda_event_record(void *event, void *stream);
/* `*done` = 1 when the event's work has completed, 0 while pending. A failed kernel before it
 * returns CFX_ERR_CUDA. Never blocks. */
cfx_status cx_cuda_event_query(void *event, int *done);

/* ---- kernels ---------------------------------------------------------------------------------- */

/* One tensor of a fused batch: `input` (read by pack), `output` (written by unpack; may equal
 * input), and where its `count` elements live in the fusion buffer, `offset` elements from its
 * start. Regions of different tensors in the fusion buffer must not overlap. */
typedef struct cx_cuda_tensor {
    const void *input;
    void *output;
    uint64_t offset;
    uint64_t count;
} cx_cuda_tensor;

/* A fused batch's descriptors on the device: uploaded once (one small copy), then used by one
 * pack launch and one unpack launch whatever the number of tensors. Reusable for later batches;
 * owned by one thread. */
typedef struct cx_cuda_batch cx_cuda_batch;

cfx_status cx_cuda_batch_create(cx_cuda_batch **out);
/* Accepts NULL. Waits for the last upload from the staging memory, then frees it. */
void cx_cuda_batch_destroy(cx_cuda_batch *b);

/* Plans and uploads `n` descriptors of `dtype` on `stream`. Use one stream for a batch's set,
 * pack and unpack and the next set (the engine's stream): the upload overwrites the descriptors
 * the previous kernels read, and only stream order keeps them apart. Checks each entry (non-NULL
 * pointers for a non-empty tensor, no 64-bit overflow). The page-locked staging memory is reused:
 * a set waits on the host (on an event, not the device) until the previous upload has left it,
 * which in steady state is long done. Growing the arrays frees the old device copy (cudaFree
 * synchronises, but only when a batch is larger than every batch before it). */
cfx_status cx_cuda_batch_set(cx_cuda_batch *b, const cx_cuda_tensor *tensors, size_t n,
                             cfx_dtype dtype, void *stream);

/* fusion[offset_i + k] = scale * input_i[k] for every tensor i of the batch, in one launch. */
cfx_status cx_cuda_batch_pack(cx_cuda_batch *b, void *fusion, double scale, void *stream);
/* output_i[k] = scale * fusion[offset_i + k], in one launch. */
cfx_status cx_cuda_batch_unpack(cx_cuda_batch *b, const void *fusion, double scale, void *stream);
/* Elements of the current batch (sum of counts) and the fusion buffer elements it spans
 * (max of offset + count). */
uint64_t cx_cuda_batch_elements(const cx_cuda_batch *b);
uint64_t cx_cuda_batch_span(const cx_cuda_batch *b);

/* dst[i] = scale * src[i] for count elements; dst may equal src (in place). */
cfx_status cx_cuda_scale(void *dst, const void *src, size_t count, cfx_dtype dtype, double scale,
                         void *stream);

/* buf[i] = the identity of op for dtype (cx_fill_identity's values), for a joined rank's share. */
cfx_status cx_cuda_fill_identity(void *buf, size_t count, cfx_dtype dtype, cfx_reduce_op op,
                                 void *stream);

/* Compression: float32 <-> float16 / bfloat16 (binary16 / bfloat16 bits in uint16_t), rounding to
 * nearest even; NaN stays NaN, overflow gives infinity. */
cfx_status cx_cuda_f32_to_f16(uint16_t *dst, const float *src, size_t count, void *stream);
cfx_status cx_cuda_f16_to_f32(float *dst, const uint16_t *src, size_t count, void *stream);
cfx_status cx_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t count, void *stream);
cfx_status cx_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t count, void *stream);

/* ---- planning (host only; exposed for tests) -------------------------------------------------- */

/* Work is split into chunks of this many elements; one thread block handles a chunk at a time. */
#define CX_CUDA_CHUNK_ELEMS 4096u

/* Chunks a tensor of `count` elements occupies. */
uint64_t cx_cuda_chunks(uint64_t count);

#ifdef __cplusplus
}
#endif

#endif /* CFX_CUDA_KERNELS_H */
