/*
 * world - how a context finds its world and builds its transport: Open MPI's launch gives the MPI
 * transport; a launcher's variables (CFX_RANK/CFX_SIZE, torchrun, Slurm, Horovod; base/launch_env.h)
 * give a rendezvous store (rendezvous/store.h) and the Gloo transport over it; nothing gives a
 * world of one. A process that sees a world of more than one rank it cannot join fails with
 * CFX_ERR_CONFIG naming the launcher and what is missing, never a silent world of one.
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
 * by the caller, met over Gloo through `store` (the group's own key space); a group of one needs
 * no store. */
cfx_status cx_world_join_group(const cx_config *cfg, const cfx_store_callbacks *store, int rank,
                               int size, cx_transport **out);

#endif /* CFX_WORLD_H */
