/*
 * host_loss - steps that go on until a host is lost: every rank allreduces a tensor again and again,
 * checks every result against the sum of what each rank contributed, and reports the first failure.
 * tests/hosts/test_hosts.py kills one host's ranks while they run; every survivor must fail (not
 * hang) and say which rank and host it is and what the engine told it.
 *
 * With "gradset" the steps go through a gradient set instead (two owned gradients, marked ready in
 * reverse order, then cfx_gradset_wait): the loss comes while a gradient-set step is pending.
 *
 * Usage: host_loss SECONDS [gradset]   (under mpirun; exit status 0 after SECONDS without a loss)
 * Output lines (one write each, so ranks' lines do not interleave):
 *   host_loss: rank R of N on HOST ready          after the first correct step
 *   host_loss: rank R on HOST: step S failed after T s: STATUS: MESSAGE     then exit status 3
 *   host_loss: rank R on HOST: step S: element J is X, expected Y           then exit status 4
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conflux/conflux.h"

#define ELEMS 4096

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 0;
    if (seconds <= 0) {
        fprintf(stderr, "usage: host_loss SECONDS\n");
        return 2;
    }
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    setvbuf(stdout, NULL, _IOLBF, 0);

    cfx_context *ctx = NULL;
    cfx_status st = cfx_init(NULL, &ctx);
    if (st != CFX_OK) {
        printf("host_loss: on %s: cfx_init failed: %s: %s\n", host, cfx_status_string(st), cfx_last_error());
        return 2;
    }
    int rank = cfx_rank(ctx), size = cfx_size(ctx);
    static float in[ELEMS], out[ELEMS];
    int64_t shape[1] = {ELEMS};
    cfx_tensor t = {in, shape, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    /* gradset: the first half of the elements is gradient "g0", the rest "g1": `in` is copied
     * into their owned storage before each step, the results out of it after. */
    cfx_gradset *set = NULL;
    int32_t index[2] = {-1, -1};
    float *grad[2] = {NULL, NULL};
    if (argc > 2 && !strcmp(argv[2], "gradset")) {
        int64_t half[1] = {ELEMS / 2};
        cfx_tensor g = {NULL, half, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_gradset_options o;
        cfx_gradset_options_init(&o, CFX_GRADSET_OPTIONS_VERSION);
        o.op = CFX_OP_SUM;
        st = cfx_gradset_create(ctx, "loss.set", &o, &set);
        for (int k = 0; k < 2 && st == CFX_OK; k++)
            st = cfx_gradset_add(set, k ? "g1" : "g0", &g, &index[k]);
        if (st == CFX_OK)
            st = cfx_gradset_commit(set);
        for (int k = 0; k < 2 && st == CFX_OK; k++)
            st = cfx_gradset_data(set, index[k], (void **)&grad[k]);
        if (st != CFX_OK) {
            printf("host_loss: on %s: the gradient set failed: %s: %s\n", host, cfx_status_string(st),
                   cfx_last_error());
            return 2;
        }
    }
    double start = now();
    int status = 0;
    for (long step = 0; now() - start < seconds; step++) {
        /* Rank r contributes (r + 1) * (1 + step % 7 + j % 5): the sum over ranks is exact. */
        for (int j = 0; j < ELEMS; j++)
            in[j] = (float)((rank + 1) * (1 + step % 7 + j % 5));
        cfx_handle h = 0;
        if (set) {
            for (int k = 0; k < 2; k++)
                memcpy(grad[k], in + k * (ELEMS / 2), sizeof in / 2);
            st = cfx_gradset_ready(set, index[1]);
            if (st == CFX_OK)
                st = cfx_gradset_ready(set, index[0]);
            if (st == CFX_OK)
                st = cfx_gradset_wait(set, 120.0);
            for (int k = 0; k < 2 && st == CFX_OK; k++)
                memcpy(out + k * (ELEMS / 2), grad[k], sizeof out / 2);
        } else {
            char name[32];
            snprintf(name, sizeof name, "loss.%ld", step % 4);
            st = cfx_allreduce_async(ctx, name, &t, out, CFX_OP_SUM, 1.0, 1.0, &h);
            if (st == CFX_OK)
                st = cfx_wait(ctx, h, 120.0);
            if (st == CFX_OK)
                st = cfx_handle_status(ctx, h);
        }
        if (st != CFX_OK) {
            const char *msg = h ? cfx_handle_message(ctx, h) : cfx_last_error();
            printf("host_loss: rank %d on %s: step %ld failed after %.1f s: %s: %s\n", rank, host, step,
                   now() - start, cfx_status_string(st), msg && *msg ? msg : cfx_last_error());
            status = 3;
            break;
        }
        double ranks_sum = size * (size + 1) / 2.0;
        for (int j = 0; j < ELEMS && !status; j++) {
            double want = ranks_sum * (1 + step % 7 + j % 5);
            if (out[j] != (float)want) {
                printf("host_loss: rank %d on %s: step %ld: element %d is %g, expected %g\n", rank, host,
                       step, j, (double)out[j], want);
                status = 4;
            }
        }
        if (h)
            cfx_handle_release(ctx, h);
        if (status)
            break;
        if (step == 0)
            printf("host_loss: rank %d of %d on %s ready\n", rank, size, host);
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
    }
    cfx_gradset_free(set);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    return status;
}
