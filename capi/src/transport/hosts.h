/*
 * hosts - the host and cross-host grouping every transport whose ranks may span hosts shares
 * (registry.h: CX_ENTRY_HOST_GROUPS): from every rank's host, this rank's local group (the ranks
 * on its host, in rank order) and cross group (the ranks with its local rank, one per host, hosts
 * in the order of their lowest rank), which fill cx_transport's local_* and cross_* and decide
 * the shared-memory and two-level paths (exec/shm_layer.h). Pretend hosts (CFX_TEST_LOCAL_SIZE,
 * tests) are hosts of that many consecutive ranks, whatever the machine.
 */
#ifndef CFX_TRANSPORT_HOSTS_H
#define CFX_TRANSPORT_HOSTS_H

#include <stddef.h>

#include "conflux/conflux.h"

#ifdef __cplusplus
extern "C" { /* the Gloo transport (C++) groups its ranks with it */
#endif

typedef struct cx_host_groups {
    int local_rank, local_size; /* this rank in its host's ranks */
    int cross_rank, cross_size; /* this rank among the ranks with its local rank */
    int *local_members;         /* the world ranks of this host, in rank order (local_size) */
    int *cross_members;         /* the world ranks with this local rank, by host (cross_size) */
    int host_index;             /* this host, counted in the order of the hosts' lowest ranks */
} cx_host_groups;

/* The groups of `rank` when rank r of `size` runs on host host_of[r] (any value; equal values:
 * the same host). *out's lists are malloc'ed (cx_host_groups_free). */
cfx_status cx_host_groups_make(const int *host_of, int size, int rank, cx_host_groups *out);

/* The same from host names: equal names are one host. */
cfx_status cx_host_groups_from_names(const char *const *names, int size, int rank,
                                     cx_host_groups *out);

void cx_host_groups_free(cx_host_groups *g);

/* The name of the host `rank` runs on: "pretend-host-<rank / pretend_local_size>" when
 * pretend_local_size > 0, else this machine's host name. */
void cx_host_name(int rank, int pretend_local_size, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* CFX_TRANSPORT_HOSTS_H */
