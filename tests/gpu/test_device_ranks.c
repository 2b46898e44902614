/*
 * test_device_ranks - the cases of device_cases.c on thread ranks of one process (the in-process
 * transport), all on this machine's GPU: ranks that share a GPU take the host-staged path, so
 * this runs it at several ranks without MPI.   test_device_ranks [ranks]   (default 2)
 * Skips (exit 77, with a reason) when no device is usable.
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "cuda/cuda_kernels.h"
#include "device_cases.h"
#include "gpu_test.h"
#include "support.h"

static const char *const TEST = "test_device_ranks";

static int rank_main(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)rank, (void)size, (void)arg;
    return dev_run_cases(ctx) != 0;
}

int main(int argc, char **argv)
{
    if (cx_cuda_probe() != CFX_OK)
        return gpu_test_skip(TEST, cx_error_message());
    int size = argc > 1 ? atoi(argv[1]) : 2;
    if (size < 1 || size > 8) {
        fprintf(stderr, "%s: ranks must be 1..8, not %s\n", TEST, argv[1]);
        return 2;
    }
    int failed = run_ranks(size, rank_main, NULL, NULL);
    CHECK(failed == 0, "%d of %d thread ranks failed", failed, size);
    return gpu_test_finish(TEST);
}
