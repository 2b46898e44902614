/*
 * device_cases - device tensors through the public ABI, as cases that run on any context: one
 * process (the one-rank NCCL path), ranks under mpirun, or thread ranks of one process sharing
 * the GPU (the host-staged path). Every result is checked against what each rank contributed,
 * computed here. Thread-safe: each rank has its own dev_env and counts its own failures.
 *
 * The injected-failure case runs when CFX_TEST_FAIL is set (the engine's failure injection,
 * docs/env-vars.md): its "fail." tensors must fail on every rank with the failing rank's status
 * and a message naming that rank, and the "ok." ones after them must be right.
 */
#ifndef CFX_GPU_DEVICE_CASES_H
#define CFX_GPU_DEVICE_CASES_H

#include <stdio.h>

#include "conflux/conflux.h"

typedef struct dev_env {
    cfx_context *ctx;
    void *stream; /* the caller's stream for every tensor (a cudaStream_t on `device`) */
    int device;
    int rank, size;
    int failures;
} dev_env;

#define DCHECK(env, cond, ...)                                                                    \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            (env)->failures++;                                                                    \
            fprintf(stderr, "FAIL rank %d %s:%d: %s: ", (env)->rank, __FILE__, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
        }                                                                                         \
    } while (0)

/* Creates the caller's stream on the rank's device (local rank modulo the device count), runs
 * every case, destroys the stream. Returns the failures of this rank. */
int dev_run_cases(cfx_context *ctx);

#endif /* CFX_GPU_DEVICE_CASES_H */
