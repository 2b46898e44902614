/*
 * transport_gloo - the Gloo transport (C++ in transport_gloo.cpp, behind this C interface): the
 * cross-process transport for jobs that mpirun did not start (cfxrun --transport gloo, torchrun,
 * Slurm's srun). The ranks connect through a rendezvous store (rendezvous/store.h) into a full
 * mesh of TCP pairs (Gloo's tcp device); the local group is the ranks whose hosts have the same
 * name (exchanged through the store; grouped by hosts.h as every transport's), so shared memory and
 * the hierarchical split work as over MPI;
 * the cross group is a second Gloo context. Every wait has the deadline given at creation: a peer
 * that dies or stops answering fails the call with CFX_ERR_PEER_LOST.
 * Built only with CONFLUX_WITH_GLOO (CFX_HAVE_GLOO).
 */
#ifndef CFX_TRANSPORT_GLOO_H
#define CFX_TRANSPORT_GLOO_H

#include "conflux/conflux.h"
#include "rendezvous/store.h"
#include "transport/transport.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The registry's create function (transport.h's contract): joins the world of p->size ranks
 * through p->store (taken over, also on failure: the transport frees it after every rank is done
 * with it). Collective over the world. */
cfx_status cx_transport_gloo_create(const cx_transport_params *p, cx_transport **out);

#ifdef __cplusplus
}
#endif

#endif /* CFX_TRANSPORT_GLOO_H */
