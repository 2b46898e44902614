/* hosts - the host and cross-host grouping the transports share (see hosts.h). */
#include "transport/hosts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"

cfx_status cx_host_groups_make(const int *host_of, int size, int rank, cx_host_groups *out)
{
    memset(out, 0, sizeof *out);
    if (size < 1 || rank < 0 || rank >= size)
        return cx_fail(CFX_ERR_INTERNAL, "host groups of rank %d of %d", rank, size);
    int *local = malloc(sizeof *local * (size_t)size);
    int *cross = malloc(sizeof *cross * (size_t)size);
    int *first = malloc(sizeof *first * (size_t)size); /* the hosts' lowest ranks, in order */
    if (!local || !cross || !first) {
        free(local);
        free(cross);
        free(first);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the host groups of %d ranks", size);
    }
    int nhosts = 0;
    for (int r = 0; r < size; r++) {
        int seen = 0;
        for (int h = 0; h < nhosts && !seen; h++)
            seen = host_of[first[h]] == host_of[r];
        if (!seen)
            first[nhosts++] = r;
        if (host_of[r] == host_of[rank]) {
            if (r == rank)
                out->local_rank = out->local_size;
            local[out->local_size++] = r;
        }
    }
    for (int h = 0; h < nhosts; h++) {
        int index = 0;
        if (host_of[first[h]] == host_of[rank])
            out->host_index = h;
        for (int r = first[h]; r < size; r++) {
            if (host_of[r] != host_of[first[h]])
                continue;
            if (index++ == out->local_rank) {
                if (r == rank)
                    out->cross_rank = out->cross_size;
                cross[out->cross_size++] = r;
                break;
            }
        }
    }
    free(first);
    out->local_members = local;
    out->cross_members = cross;
    return CFX_OK;
}

cfx_status cx_host_groups_from_names(const char *const *names, int size, int rank,
                                     cx_host_groups *out)
{
    memset(out, 0, sizeof *out);
    int *host_of = malloc(sizeof *host_of * (size_t)(size > 0 ? size : 1));
    if (!host_of)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the host groups of %d ranks", size);
    for (int r = 0; r < size; r++) { /* a host is the lowest rank with its name */
        host_of[r] = r;
        for (int q = 0; q < r; q++)
            if (!strcmp(names[q], names[r])) {
                host_of[r] = q;
                break;
            }
    }
    cfx_status st = cx_host_groups_make(host_of, size, rank, out);
    free(host_of);
    return st;
}

void cx_host_groups_free(cx_host_groups *g)
{
    free(g->local_members);
    free(g->cross_members);
    g->local_members = g->cross_members = NULL;
}

void cx_host_name(int rank, int pretend_local_size, char *out, size_t cap)
{
    if (pretend_local_size > 0) {
        snprintf(out, cap, "pretend-host-%d", rank / pretend_local_size);
        return;
    }
    char name[256] = "";
    gethostname(name, sizeof name - 1);
    snprintf(out, cap, "%s", name);
}
