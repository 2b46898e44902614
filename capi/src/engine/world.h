/*
 * world - how a context finds its world and builds its transport, from the launch read at init
 * (cx_config.launch) and the transport registry (transport/registry.h): the transport asked for
 * (CFX_TRANSPORT, options.transport), or under auto the entry that meets the way the launch calls
 * for: in the launcher's own world where that launcher started the process (mpirun: MPI), through
 * a rendezvous store (rendezvous/store.h) where another launcher did (CFX_RANK/CFX_SIZE, torchrun,
 * Slurm, Horovod: Gloo), within the process when nothing did (a world of one). A process that sees
 * a world of more than one rank it cannot join fails with CFX_ERR_CONFIG naming the launcher and
 * what is missing, never a silent world of one.
 */
#ifndef CFX_WORLD_H
#define CFX_WORLD_H

#include "base/config.h"
#include "transport/transport.h"

/* The transport for `cfg` (its transport kind), joined through `store` when one was handed in
 * (cfx_init_with_store; NULL otherwise). Logs at info which source gave the world. */
cfx_status cx_world_create_transport(const cx_config *cfg, const cfx_store_callbacks *store,
                                     cx_transport **out);

/* The transport of a group whose members alone call this (cfx_init_group): `rank` of `size` given
 * by the caller, met through `store` (the group's own key space) over the first transport that
 * meets through a store (Gloo); a group of one needs no store. */
cfx_status cx_world_join_group(const cx_config *cfg, const cfx_store_callbacks *store, int rank,
                               int size, cx_transport **out);

#endif /* CFX_WORLD_H */
