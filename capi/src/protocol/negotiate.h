/*
 * negotiate - the coordinator (rank 0): collects every rank's requests across cycles, decides which
 * tensors are ready everywhere, validates them and answers with the ordered response list that
 * every rank executes.
 *
 * A tensor is ready once every rank either submitted it or has joined. Its response carries the
 * agreed parameters, or, when ranks disagree (collective, dtype, device, shape, op, scale factors,
 * root, group size) or the collective cannot run with joined ranks, an error naming the tensor,
 * the ranks and both values, which every rank completes the tensor with. The members of a grouped
 * call are answered together. Order: readiness order within a cycle, ranks scanned 0..n-1.
 * Tensors some ranks never submit are reported after the stall warning time (naming the missing
 * ranks) and failed with CFX_ERR_STALL after the stall timeout.
 * Owned and used by rank 0's background thread alone.
 */
#ifndef CFX_NEGOTIATE_H
#define CFX_NEGOTIATE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/log.h"
#include "base/strmap.h"
#include "protocol/wire.h"

typedef struct cx_coordinator {
    int size;
    cx_strmap pending;  /* name -> cx_pending*, submitted by some ranks, not yet answered */
    cx_strmap groups;   /* group name -> cx_group*, members answered but held for the rest */
    bool *joined;       /* size entries */
    int joined_count;
    int last_joined;
    uint64_t arrivals;  /* sequence numbers for deterministic stall reports */
    struct cx_timeline *timeline; /* the context's, or NULL: "rank r ready" marks (timeline.h) */
} cx_coordinator;

cfx_status cx_coordinator_init(cx_coordinator *c, int size);
void cx_coordinator_destroy(cx_coordinator *c);

/* Takes the request lists of all ranks (lists[r] from rank r) and appends the responses that are
 * now ready to *out, in execution order. */
cfx_status cx_coordinator_process(cx_coordinator *c, const cx_request_list *lists, double now,
                                  cx_response_list *out);

/* Logs tensors pending longer than warning_s (with the missing ranks); fails those pending longer
 * than timeout_s (> 0) by appending CFX_ERR_STALL responses to *out. */
cfx_status cx_coordinator_check_stalls(cx_coordinator *c, double now, double warning_s,
                                       double timeout_s, const cx_logger *log,
                                       cx_response_list *out);

/* Moves *r to the end of a list built by this function (not one from decoding); false when out
 * of memory (r is then freed). */
bool cx_response_list_push(cx_response_list *l, cx_response *r);

#endif /* CFX_NEGOTIATE_H */
