/*
 * cuda_check - the CUDA error checks that the kernels (cuda_kernels.cu) and the runtime wrappers
 * (cuda_wrappers.c) share: a CUDA error as CFX_ERR_CUDA naming it, and the checks around a kernel
 * launch. Header-only (static inline) because both halves of cuda_kernels.h use it and neither owns
 * it; it needs the CUDA include path (cudaError_t), so only files of cuda/ include it.
 */
#ifndef CFX_CUDA_CHECK_H
#define CFX_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "conflux/conflux.h"
#ifdef __cplusplus
extern "C" {
#endif
#include "base/error.h"
#ifdef __cplusplus
}
#endif

/* CFX_ERR_CUDA with the message "<what>: <error name> (<code>): <error string>". */
static inline cfx_status cx_cuda_fail(cudaError_t e, const char *what)
{
    return cx_fail(CFX_ERR_CUDA, "%s: %s (%d): %s", what, cudaGetErrorName(e), (int)e,
                   cudaGetErrorString(e));
}

/* Returns cx_cuda_fail(...) from the calling function when `call` does not succeed. */
#define CX_CUDA_TRY(call)                                                                         \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess)                                                                    \
            return cx_cuda_fail(e_, #call);                                                       \
    } while (0)

/* Right before a launch: cudaGetLastError() then holds only what an earlier call left behind. A
 * cudaErrorNotReady from a query is not a failure (and is cleared, so that the launch's own status
 * is its own); anything else is reported as pending, before the launch adds to it. */
static inline cfx_status cx_cuda_before_launch(const char *what)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess || e == cudaErrorNotReady)
        return CFX_OK;
    return cx_fail(CFX_ERR_CUDA, "a CUDA error was pending before the %s: %s (%d): %s", what,
                   cudaGetErrorName(e), (int)e, cudaGetErrorString(e));
}

/* A launch reports a bad configuration at once; errors of the kernel itself surface later on the
 * stream (event query / stream sync). */
static inline cfx_status cx_cuda_launch_status(const char *what)
{
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? CFX_OK : cx_cuda_fail(e, what);
}

#endif /* CFX_CUDA_CHECK_H */
