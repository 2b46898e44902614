/*
 * transport_local - the in-process transport: the ranks of a job are threads of one process.
 *
 * A world is shared by `size` threads; each creates its own transport (and context) for its rank.
 * Collectives meet at a generation-counted barrier: every rank publishes pointers to its buffers,
 * then each reads what it needs straight from the others' memory, then a second barrier releases
 * the buffers. Reductions are computed in rank order, so every rank gets bitwise the same result.
 * Used by the unit tests (1-64 thread ranks, also under ThreadSanitizer), by in-process benchmarks,
 * and with one rank for a job started without mpirun (CFX_TRANSPORT=local).
 */
#ifndef CFX_TRANSPORT_LOCAL_H
#define CFX_TRANSPORT_LOCAL_H

#include "transport/transport.h"

typedef struct cx_local_world cx_local_world;

/* A world of `size` thread ranks; released when the creator and every transport released it. */
cfx_status cx_local_world_create(int size, cx_local_world **out);
void cx_local_world_release(cx_local_world *w);

/* Rank `rank`'s transport on `w` (takes a reference on the world). */
cfx_status cx_transport_local_create(cx_local_world *w, int rank, cx_transport **out);

/* The registry's create function (transport.h's contract): a world of one (p->size 1 or unset);
 * thread ranks are made with the two calls above. */
cfx_status cx_transport_local_open(const cx_transport_params *p, cx_transport **out);

#endif /* CFX_TRANSPORT_LOCAL_H */
