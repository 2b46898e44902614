/*
 * A rank that exits without cfx_shutdown while the others wait (under mpirun, >= 2 ranks):
 * rank 1 returns from main with its context live; the exit handler (context.c) shuts it down,
 * so the other ranks' pending "exit.t" fails with CFX_ERR_SHUT_DOWN naming rank 1 as exited,
 * within seconds instead of hanging. Conflux initialises (and at exit finalises) MPI itself.
 * Exit status 0 when every waiting rank saw that.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conflux/conflux.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void)
{
    cfx_context *ctx;
    if (cfx_init(NULL, &ctx) != CFX_OK) {
        fprintf(stderr, "cfx_init: %s\n", cfx_last_error());
        return 2;
    }
    int rank = cfx_rank(ctx);
    float v = 1;
    int64_t shape[1] = {1};
    cfx_tensor x = {&v, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h;
    if (cfx_allreduce_async(ctx, "warm", &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h) != CFX_OK ||
        cfx_wait(ctx, h, 30) != CFX_OK)
        return 1;
    cfx_handle_release(ctx, h);
    if (rank == 1) {
        usleep(300000);
        return 0; /* no cfx_shutdown: the exit handler must tell the others */
    }
    double t0 = now_s();
    if (cfx_allreduce_async(ctx, "exit.t", &x, NULL, CFX_OP_SUM, 1.0, 1.0, &h) != CFX_OK)
        return 1;
    cfx_status st = cfx_wait(ctx, h, 30);
    const char *msg = cfx_handle_message(ctx, h);
    int ok = st == CFX_ERR_SHUT_DOWN && msg && strstr(msg, "'exit.t'") &&
             strstr(msg, "[1 (exited without cfx_shutdown)]") && now_s() - t0 < 15;
    printf("rank %d: status %s after %.2f s: %s -> %s\n", rank, cfx_status_string(st), now_s() - t0,
           msg ? msg : "(no message)", ok ? "ok" : "FAIL");
    fflush(stdout);
    cfx_handle_release(ctx, h);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    return ok ? 0 : 1;
}
