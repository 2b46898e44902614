/*
 * test_hooks - the CFX_TEST_* variables: the one place the engine's test-only behaviour is read.
 *
 * Tests reach paths a healthy single machine never takes (a peer with another wire version,
 * pretend hosts, a rank whose allocation fails, a direct map that fails, the device path set-up
 * must choose). Each hook is parsed once, with the configuration at context creation
 * (cx_config_load, config.h), into cx_test_hooks; production modules read the parsed fields and
 * never the environment. A malformed hook is CFX_ERR_CONFIG naming the variable and its value, as
 * for every other CFX_* variable. Unset, every field says "off" (zero, but for the wire version:
 * -1).
 */
#ifndef CFX_TEST_HOOKS_H
#define CFX_TEST_HOOKS_H

#include <stdint.h>

#include "conflux/conflux.h"

typedef const char *(*cx_config_lookup)(const char *name, void *user);

typedef struct cx_test_hooks {
    /* CFX_TEST_WIRE_VERSION=MAJOR.MINOR: the wire protocol this rank claims in the handshake;
     * -1 = this build's own (protocol/handshake.c). */
    int32_t wire_major, wire_minor;
    /* CFX_TEST_LOCAL_SIZE=N: the MPI transport splits the job into pretend hosts of N consecutive
     * ranks, so the two-level paths run on one machine; 0 = real hosts (transport_mpi.c). */
    int32_t local_size;
    /* CFX_TEST_DIRECT_MAP_FAIL=L: local rank L (0..63) cannot map its peers' pools, so the
     * shared-memory direct path turns off for good (exec/shm_direct.c); bit L set, 0 = none. */
    uint64_t direct_map_fail;
    /* CFX_TEST_DEVICE_PATH=nccl|staged: the path device set-up must have chosen, else every
     * device batch fails saying what was chosen and why (exec/device_exec.c); "" = any. */
    char device_path[8];
    /* CFX_TEST_FAIL=RANKS:PREFIX[:done]: the ranks RANKS (comma-separated, 0..63) fail every batch
     * whose first tensor name starts with PREFIX, at its ready agreement, or with ":done" at the
     * device paths' done agreement (exec/agree.c). */
    struct cx_fail_test {
        uint64_t ranks;   /* bit r: rank r fails */
        int32_t phase;    /* the cx_agree_phase it fails in (1 ready, 2 done) */
        char prefix[56];  /* "" = off */
    } fail;
} cx_test_hooks;

/* Every hook off. */
void cx_test_hooks_off(cx_test_hooks *h);

/* Reads the hooks through `lookup` (NULL or "" = unset) into *h, every hook off first. */
cfx_status cx_test_hooks_load(cx_test_hooks *h, cx_config_lookup lookup, void *user);

#endif /* CFX_TEST_HOOKS_H */
