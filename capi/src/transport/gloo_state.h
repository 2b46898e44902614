/*
 * gloo_state - what the Gloo transport's pieces share (C++, internal to transport/): the Root that
 * the world transport and its splits hold together (the store, Gloo's device, the deadlines, the
 * heartbeat's record), and each transport's State (its Gloo contexts and exchanges, and what every
 * rank published about itself: host, address, world rank, process, socket endpoints).
 * transport_gloo.cpp runs the transport over them; gloo_lost.cpp names the rank a failed call lost.
 */
#ifndef CFX_GLOO_STATE_H
#define CFX_GLOO_STATE_H

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gloo/context.h>
#include <gloo/transport/device.h>

extern "C" {
#include "rendezvous/store.h"
}

namespace cx_gloo {

using millis = std::chrono::milliseconds;

class PostedExchange; /* gloo_exchange.h: an allreduce in one hop over posted receives */

/* What the world transport and its splits share: the store, Gloo's device, the deadlines. Freed
 * with the last transport that uses it. */
struct Root {
    cx_store *store = nullptr;
    std::shared_ptr<gloo::transport::Device> dev;
    std::atomic<int> refs{1};
    int world_rank = 0, world_size = 0;
    double timeout_s = 30, rendezvous_s = 60;
    int test_local_size = 0;
    int store_on_rank0 = 0;
    std::atomic<bool> broken{false}; /* a peer was lost: no goodbye through the store */
    /* Heartbeats through the store, so a timeout can name the rank that went silent (a stopped
     * process keeps its connections open: only its silence shows). */
    std::thread beat;
    std::mutex beat_mu;
    std::condition_variable beat_cv;
    bool beat_stop = false;
    double beat_period_s = 1;
    std::vector<std::string> beat_seen; /* per world rank: its last counter */
    std::vector<double> beat_advanced;  /* per world rank: when its counter last moved */
    double beat_round = 0;              /* when the store last answered a whole round */
};

struct State {
    Root *root = nullptr;
    std::string prefix;                         /* this transport's key space in the store */
    std::shared_ptr<gloo::Context> ctx, cross;  /* cross: NULL when cross_size is 1 */
    std::unique_ptr<PostedExchange> world_small; /* small allreduces of the world */
    /* The cross leg when there are two hosts: two exchanges, so that a chunk may cross while the
     * next is posted (cross_allreduce_post takes them in turn; a plain call, the first). */
    std::unique_ptr<PostedExchange> cross_pair[2];
    unsigned cross_posted = 0, cross_waited = 0; /* cross_allreduce_post and _wait calls so far */
    std::vector<std::string> hosts, addrs;      /* per rank: host name, address Gloo listens on */
    std::vector<int> world_ranks;               /* per rank: its rank in the world */
    /* Per rank on this machine (same boot and pid namespace): its pid and start time; 0 else. */
    std::vector<int> pids;
    std::vector<unsigned long long> starts;
    /* Every other rank's socket endpoints ("[10.0.0.2]:4567", as Gloo's messages write them) ->
     * that rank: an I/O error names the address, the message names the rank. */
    std::vector<std::pair<std::string, int>> pair_peers;
    std::vector<int> local_members, cross_members; /* ranks, in local / cross rank order */
    unsigned split_count = 0;
    std::mutex split_mu;
};

} // namespace cx_gloo

#endif /* CFX_GLOO_STATE_H */
