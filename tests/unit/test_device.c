/*
 * test_device - what of the device-tensor dispatch runs without a GPU: the path plan every rank
 * derives from the ranks' device info (NCCL only when every rank has a GPU of its own), and the
 * submission checks of device tensors on this machine (a CUDA build without a usable device gives
 * a clear "no CUDA device" error naming the tensor and rank; a build without CUDA refuses device
 * tensors as unsupported; a negative ordinal is a bad argument in every build). The device data
 * path itself runs in tests/gpu (run.sh, on a GPU machine).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "exec/device_exec.h"
#include "support.h"

static cx_device_info info(int usable, int nccl, const char *host, const char *bus)
{
    cx_device_info d;
    memset(&d, 0, sizeof d);
    d.usable = (uint8_t)usable;
    d.nccl = (uint8_t)nccl;
    snprintf(d.host, sizeof d.host, "%s", host);
    snprintf(d.bus, sizeof d.bus, "%s", bus);
    return d;
}

static void plan(void **state)
{
    (void)state;
    char why[512];
    /* One rank, one GPU: NCCL. */
    cx_device_info one[1] = {info(1, 1, "h1", "0000:19:00.0")};
    assert_int_equal(cx_device_plan(one, 1, false, why, sizeof why), CX_DEVICE_PATH_NCCL);
    assert_string_equal(why, "");
    /* Two hosts, the same bus id on each: different GPUs, NCCL. */
    cx_device_info two_hosts[2] = {info(1, 1, "h1", "0000:19:00.0"), info(1, 1, "h2", "0000:19:00.0")};
    assert_int_equal(cx_device_plan(two_hosts, 2, false, why, sizeof why), CX_DEVICE_PATH_NCCL);
    /* Two ranks on one host and one GPU: NCCL would refuse them, host-staged, naming both. */
    cx_device_info shared[3] = {info(1, 1, "h1", "0000:19:00.0"), info(1, 1, "h1", "0000:3b:00.0"),
                                info(1, 1, "h1", "0000:19:00.0")};
    assert_int_equal(cx_device_plan(shared, 3, false, why, sizeof why), CX_DEVICE_PATH_STAGED);
    assert_non_null(strstr(why, "ranks 0 and 2 share the GPU 0000:19:00.0"));
    /* Distinct GPUs on one host: NCCL. */
    cx_device_info distinct[2] = {info(1, 1, "h1", "0000:19:00.0"), info(1, 1, "h1", "0000:3b:00.0")};
    assert_int_equal(cx_device_plan(distinct, 2, false, why, sizeof why), CX_DEVICE_PATH_NCCL);
    /* Deterministic mode, a rank without NCCL, a rank without a device: host-staged. */
    assert_int_equal(cx_device_plan(distinct, 2, true, why, sizeof why), CX_DEVICE_PATH_STAGED);
    assert_non_null(strstr(why, "deterministic"));
    cx_device_info no_nccl[2] = {info(1, 1, "h1", "a"), info(1, 0, "h2", "a")};
    assert_int_equal(cx_device_plan(no_nccl, 2, false, why, sizeof why), CX_DEVICE_PATH_STAGED);
    assert_non_null(strstr(why, "rank 1's build has no NCCL"));
    cx_device_info no_dev[2] = {info(0, 1, "h1", ""), info(1, 1, "h2", "a")};
    assert_int_equal(cx_device_plan(no_dev, 2, false, why, sizeof why), CX_DEVICE_PATH_STAGED);
    assert_non_null(strstr(why, "rank 0 has no usable CUDA device"));
}

/* On this machine: how a device tensor is refused at submission, in every build. */
static int submit_device(cfx_context *ctx, int rank, int size, void *arg)
{
    (void)size, (void)arg;
    float v[4] = {1, 2, 3, 4};
    int64_t shape[1];
    cfx_tensor t = tensor1d(v, shape, 4, CFX_FLOAT32);
    cfx_handle h = 0;
    t.device = -7;
    RANK_CHECK(cfx_allreduce_async(ctx, "dev.bad", &t, NULL, CFX_OP_SUM, 1, 1, &h) ==
               CFX_ERR_INVALID_ARGUMENT, "device -7: %s", cfx_last_error());
    t.device = 0;
    uint32_t f = cfx_features();
    if (f & CFX_FEATURE_CUDA_DEVICE) {
        printf("a CUDA device is usable here: the no-device checks do not apply (tests/gpu)\n");
        return 0;
    }
    cfx_status want = (f & CFX_FEATURE_CUDA) ? CFX_ERR_CUDA : CFX_ERR_UNSUPPORTED;
    const char *say = (f & CFX_FEATURE_CUDA) ? "no CUDA device is usable" : "need a build with CUDA";
    cfx_status st = cfx_allreduce_async(ctx, "dev.grad", &t, NULL, CFX_OP_SUM, 1, 1, &h);
    const char *m = cfx_last_error();
    RANK_CHECK(st == want, "allreduce of a device tensor: %s (%s), want %s", cfx_status_string(st),
               m, cfx_status_string(want));
    RANK_CHECK(strstr(m, "tensor 'dev.grad'") && strstr(m, "CUDA device 0") && strstr(m, say),
               "message: %s", m);
    if (f & CFX_FEATURE_CUDA)
        RANK_CHECK(strstr(m, "rank 0"), "message names no rank: %s", m);
    /* Every entry point refuses it the same way; a grouped call names the tensor's index. */
    RANK_CHECK(cfx_broadcast_async(ctx, "dev.b", &t, 0, &h) == want, "broadcast: %s", cfx_last_error());
    RANK_CHECK(cfx_allgather_async(ctx, "dev.g", &t, &h) == want, "allgather: %s", cfx_last_error());
    cfx_tensor two[2] = {tensor1d(v, shape, 4, CFX_FLOAT32), t};
    RANK_CHECK(cfx_grouped_allreduce_async(ctx, "dev.group", 2, two, NULL, CFX_OP_SUM, 1, 1, &h) ==
               want && strstr(cfx_last_error(), "tensor 1 of group 'dev.group'"), "grouped: %s",
               cfx_last_error());
    /* Nothing was queued: the CPU path still works afterwards. */
    cfx_tensor c = tensor1d(v, shape, 4, CFX_FLOAT32);
    RANK_CHECK(allreduce_wait(ctx, "cpu.after", &c, CFX_OP_SUM) == CFX_OK, "cpu: %s", cfx_last_error());
    RANK_CHECK(v[0] == 1 && v[3] == 4, "one rank's sum changed the values: %g %g", v[0], v[3]);
    return 0;
}

static void device_tensor_refused_without_device(void **state)
{
    (void)state;
    assert_int_equal(run_ranks(1, submit_device, NULL, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plan),
        cmocka_unit_test(device_tensor_refused_without_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
