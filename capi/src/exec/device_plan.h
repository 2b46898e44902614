/*
 * device_plan - which data path device tensors take (pure, host only; exposed for tests): every
 * rank publishes a cx_device_info at set-up (device_exec.c), and every rank computes the same
 * path from all of them.
 */
#ifndef CFX_DEVICE_PLAN_H
#define CFX_DEVICE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What one rank tells the others at set-up (fixed size, sent as bytes). */
typedef struct cx_device_info {
    uint8_t usable;   /* this rank has its CUDA device, and its stream, events and staging work */
    uint8_t nccl;     /* this build has the NCCL data path */
    char host[62];    /* the machine: kernel boot id, else the host name */
    char bus[64];     /* PCI bus id of the device ("0000:19:00.0"), one physical GPU per host */
} cx_device_info;

typedef enum cx_device_path {
    CX_DEVICE_PATH_STAGED = 1, /* through page-locked host memory and the host data path */
    CX_DEVICE_PATH_NCCL = 2    /* pack kernel, ncclAllReduce, unpack kernel on Conflux's stream */
} cx_device_path;

/* The path every rank takes, from every rank's info (the same answer on every rank); `why` gets
 * the reason for the host-staged path (naming the ranks), or "". */
cx_device_path cx_device_plan(const cx_device_info *all, int size, bool deterministic, char *why,
                              size_t why_len);

#endif /* CFX_DEVICE_PLAN_H */
