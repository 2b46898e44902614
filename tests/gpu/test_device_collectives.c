/*
 * test_device_collectives - device tensors through the public ABI and the engine's device path
 * (device_exec.c): the cases of device_cases.c on one context. One process (local transport):
 * the one-rank NCCL path; under mpirun, ranks sharing one GPU: the host-staged path through MPI.
 * CFX_TEST_DEVICE_PATH (nccl|staged) makes the engine fail every device batch unless set-up chose
 * that path, so a run asserts the path it took. Skips (exit 77, with a reason) when no device is
 * usable or CUDA is not built.
 */
#include <stdio.h>

#include "base/error.h"
#include "conflux/conflux.h"
#include "cuda/cuda_kernels.h"
#include "device_cases.h"
#include "gpu_test.h"

static const char *const TEST = "test_device_collectives";

int main(void)
{
    if (!(cfx_features() & CFX_FEATURE_CUDA))
        return printf("%s: skipped: no CUDA device (this libconflux was built without CUDA)\n", TEST),
               GPU_TEST_SKIP;
    if (cx_cuda_probe() != CFX_OK)
        return gpu_test_skip(TEST, cx_error_message());
    cfx_context *ctx = NULL;
    if (cfx_init(NULL, &ctx) != CFX_OK) {
        fprintf(stderr, "%s: cfx_init: %s\n", TEST, cfx_last_error());
        return 1;
    }
    int rank = cfx_rank(ctx);
    CHECK(cfx_features() & CFX_FEATURE_CUDA_DEVICE, "features lack CFX_FEATURE_CUDA_DEVICE");
    gpu_test_failures += dev_run_cases(ctx);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    if (rank != 0 && !gpu_test_failures)
        return 0;
    return gpu_test_finish(TEST);
}
