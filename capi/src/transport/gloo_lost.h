/*
 * gloo_lost - naming the rank a failed Gloo call lost (C++, internal to transport/): heartbeats
 * through the store (a stopped process keeps its sockets open; only its silence shows), every
 * rank's socket endpoints (the address in Gloo's message -> the rank), the kernel's word on peers
 * of this machine (base/process.h), and the blame the first survivor publishes for the others.
 */
#ifndef CFX_GLOO_LOST_H
#define CFX_GLOO_LOST_H

#include <string>
#include <vector>

#include <gloo/context.h>
#include <gloo/rendezvous/store.h>

#include "transport/gloo_state.h"

namespace cx_gloo {

/* The heartbeat thread of the world (one per Root): started once the world is connected, stopped
 * before the Root is freed. */
void start_heartbeat(Root *root);
void stop_heartbeat(Root *root);

/* World ranks whose heartbeat stopped (more than 2.5 periods), and whether the store went silent
 * itself (then the heartbeats say nothing new). */
std::vector<int> silent_world_ranks(Root *root, bool *store_silent);

/* Publishes this process's socket endpoints under "endpoints/<rank>" and learns every other
 * rank's into s->pair_peers. Collective over ctx. */
void learn_pair_peers(State *s, gloo::rendezvous::Store &store, gloo::Context &ctx);

/* Who an I/O failure (Gloo's message `text`) points at, as "rank R on host H (why)", and that
 * rank's world rank in *world_rank (-1 when not one rank). */
std::string suspects(const State *s, int self, const std::string &text, int *world_rank);

/* What this rank, failing first, found: "blame/<world rank>" = the world rank it named (-1: none),
 * for the survivors whose errors name no one, and to tell them this rank failed before it left.
 * Skipped when the store went silent. */
void publish_blame(const State *s, int lost_world_rank);

} // namespace cx_gloo

#endif /* CFX_GLOO_LOST_H */
