/* gloo_lost - naming the rank a failed Gloo call lost (see gloo_lost.h). */
#include "transport/gloo_lost.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern "C" {
#include "base/process.h"
}

namespace cx_gloo {

namespace {

double steady_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

void beat_main(Root *root)
{
    const int n = root->world_size;
    std::vector<std::string> keys;
    for (int r = 0; r < n; r++)
        keys.push_back("beat/" + std::to_string(r));
    std::unique_lock<std::mutex> hold(root->beat_mu);
    for (uint64_t count = 1; !root->beat_stop; count++) {
        hold.unlock();
        std::string mine = std::to_string(count);
        bool ok = !cx_store_set(root->store, keys[root->world_rank].c_str(), mine.data(),
                                mine.size());
        std::vector<std::string> seen(static_cast<size_t>(n));
        for (int r = 0; ok && r < n; r++) {
            int present = 0;
            void *data = nullptr;
            size_t len = 0;
            ok = !root->store->ops->check(root->store, keys[r].c_str(), &present);
            if (ok && present && !(ok = !root->store->ops->get(root->store, keys[r].c_str(), &data,
                                                               &len)))
                break;
            if (data)
                seen[r].assign(static_cast<char *>(data), len);
            free(data);
        }
        hold.lock();
        double now = steady_s();
        if (ok) {
            for (int r = 0; r < n; r++)
                if (seen[r] != root->beat_seen[r]) {
                    root->beat_seen[r] = seen[r];
                    root->beat_advanced[r] = now;
                }
            root->beat_round = now;
        }
        root->beat_cv.wait_for(hold, std::chrono::duration<double>(root->beat_period_s));
    }
}

/* The world rank that world rank `who` published as lost ("blame/<who>"), or -1 (none yet, or
 * the store went silent: a silent store would hold this thread too). */
int blamed_by(Root *root, int who)
{
    bool store_silent = false;
    silent_world_ranks(root, &store_silent);
    std::string key = "blame/" + std::to_string(who);
    int present = 0, blamed = -1;
    void *data = nullptr;
    size_t len = 0;
    if (store_silent || root->store->ops->check(root->store, key.c_str(), &present) || !present ||
        root->store->ops->get(root->store, key.c_str(), &data, &len))
        return -1;
    blamed = std::atoi(std::string(static_cast<char *>(data), len).c_str());
    free(data);
    return blamed;
}

/* What another rank that lost a peer first published ("blame/<world rank>" = the world rank it
 * named), when the store still answers: a rank whose connection was closed by a survivor shutting
 * down learns from that survivor who was lost. -1 when nobody said. */
int blamed_by_others(const State *s)
{
    Root *root = s->root;
    bool store_silent = false;
    silent_world_ranks(root, &store_silent);
    if (store_silent)
        return -1; /* a silent store would hold this thread too */
    for (int attempt = 0; attempt < 5; attempt++) {
        for (int r = 0; r < root->world_size; r++) {
            std::string key = "blame/" + std::to_string(r);
            int present = 0;
            void *data = nullptr;
            size_t len = 0;
            if (r == root->world_rank || root->store->ops->check(root->store, key.c_str(), &present) ||
                !present || root->store->ops->get(root->store, key.c_str(), &data, &len))
                continue;
            int blamed = std::atoi(std::string(static_cast<char *>(data), len).c_str());
            free(data);
            if (blamed >= 0)
                return blamed;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
}

/* This process's IPv4 TCP endpoints, as Gloo's messages write them ("[ip]:port"):
 * the local ends of its sockets (/proc/self/fd -> inodes -> /proc/net/tcp). A pair's connection
 * shows the peer's end in a survivor's error whichever side connected. */
std::vector<std::string> own_endpoints()
{
    std::vector<std::string> inodes, out;
    if (DIR *d = opendir("/proc/self/fd")) {
        while (struct dirent *e = readdir(d)) {
            char link[64] = "", path[300];
            snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
            ssize_t n = readlink(path, link, sizeof link - 1);
            if (n > 9 && !strncmp(link, "socket:[", 8))
                inodes.emplace_back(link + 8, static_cast<size_t>(n - 9));
        }
        closedir(d);
    }
    FILE *f = fopen("/proc/net/tcp", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        unsigned a, port, st;
        char inode[32];
        /* Every state: a connection Gloo started may not be established yet when this runs, and
         * its local port is fixed from connect() on. */
        if (sscanf(line, " %*d: %8X:%4X %*8X:%*4X %2X %*s %*s %*s %*s %*s %31s", &a, &port, &st,
                   inode) != 4 || std::find(inodes.begin(), inodes.end(), inode) == inodes.end())
            continue;
        char ep[64];
        snprintf(ep, sizeof ep, "[%u.%u.%u.%u]:%u", a & 255, (a >> 8) & 255, (a >> 16) & 255,
                 a >> 24, port);
        out.push_back(ep);
    }
    if (f)
        fclose(f);
    return out;
}

} // namespace

void start_heartbeat(Root *root)
{
    double now = steady_s();
    root->beat_period_s = std::max(0.5, std::min(2.0, root->timeout_s / 5));
    root->beat_seen.assign(static_cast<size_t>(root->world_size), std::string());
    root->beat_advanced.assign(static_cast<size_t>(root->world_size), now);
    root->beat_round = now;
    root->beat = std::thread(beat_main, root);
}

void stop_heartbeat(Root *root)
{
    if (!root->beat.joinable())
        return;
    {
        std::lock_guard<std::mutex> hold(root->beat_mu);
        root->beat_stop = true;
    }
    root->beat_cv.notify_all();
    if (root->broken)
        cx_store_interrupt(root->store); /* it may be blocked on a silent store server */
    root->beat.join();
}

std::vector<int> silent_world_ranks(Root *root, bool *store_silent)
{
    std::lock_guard<std::mutex> hold(root->beat_mu);
    double now = steady_s(), stale = 2.5 * root->beat_period_s;
    std::vector<int> out;
    *store_silent = now - root->beat_round > stale;
    for (int r = 0; !*store_silent && r < root->world_size; r++)
        if (r != root->world_rank && now - root->beat_advanced[r] > stale)
            out.push_back(r);
    return out;
}

/* Each rank publishes the endpoints its sockets have (pairs' listening addresses and connections'
 * local ends) one per line; every rank keeps them all: the address in a failing pair's message ->
 * that rank. */
void learn_pair_peers(State *s, gloo::rendezvous::Store &store, gloo::Context &ctx)
{
    std::string mine;
    for (int q = 0; q < ctx.size; q++)
        if (q != ctx.rank)
            mine += ctx.getPair(q)->address().str() + "\n";
    for (const auto &ep : own_endpoints())
        mine += ep + "\n";
    store.set("endpoints/" + std::to_string(ctx.rank), std::vector<char>(mine.begin(), mine.end()));
    for (int r = 0; r < ctx.size; r++) {
        if (r == ctx.rank)
            continue;
        std::vector<char> v = store.get("endpoints/" + std::to_string(r));
        std::string text(v.begin(), v.end());
        for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
            s->pair_peers.emplace_back(text.substr(at, nl - at), r);
    }
}

/* Who an I/O failure points at, and that rank's world rank (-1 when not one rank): the only other
 * rank of two; the ranks on this machine whose process ended or stopped without having failed
 * first; the rank whose pair address Gloo's message names; the ranks whose heartbeat
 * stopped; rank 0 when the store it serves went silent; the rank another survivor named. */
std::string suspects(const State *s, int self, const std::string &text, int *world_rank)
{
    const int n = static_cast<int>(s->hosts.size());
    auto one = [&](int r) {
        *world_rank = s->world_ranks[r];
        return "rank " + std::to_string(r) + " on host " + s->hosts[r];
    };
    *world_rank = -1;
    if (n == 2)
        return one(1 - self);
    /* A peer on this machine whose process ended or stopped is the one lost, whatever address
     * Gloo's message names: the kernel's word is surer than any other clue. A survivor that
     * failed before this rank published "blame/<its rank>" before it left: it is not the one. */
    bool store_silent = false;
    std::vector<int> quiet = silent_world_ranks(s->root, &store_silent);
    for (cx_process_state fate : {CX_PROCESS_ENDED, CX_PROCESS_STOPPED}) {
        std::string all;
        int found = 0;
        for (int r = 0; r < n && !store_silent; r++) {
            std::string key = "blame/" + std::to_string(s->world_ranks[r]);
            int blamed_someone = 0;
            if (r != self && s->pids[r] > 0 && cx_process_probe(s->pids[r], s->starts[r]) == fate &&
                !s->root->store->ops->check(s->root->store, key.c_str(), &blamed_someone) &&
                !blamed_someone)
                all += (found++ ? " and " : "") + one(r);
        }
        if (found) {
            if (found > 1)
                *world_rank = -1;
            return all + (found > 1 ? " (their processes " : " (its process ") +
                   (fate == CX_PROCESS_ENDED ? "ended)" : found > 1 ? "are stopped)" : "is stopped)");
        }
    }
    for (const auto &p : s->pair_peers) /* "[ip]:port" followed by a non-digit */
        for (size_t at = text.find(p.first); at != std::string::npos;
             at = text.find(p.first, at + 1))
            if (!isdigit(static_cast<unsigned char>(text[at + p.first.size()]))) {
                /* A survivor that closed its end after losing a peer itself said whom it lost. */
                int closer = s->world_ranks[p.second];
                int theirs = blamed_by(s->root, closer);
                for (int r = 0; theirs >= 0 && r < n; r++)
                    if (s->world_ranks[r] == theirs && r != self)
                        return one(r) + " (as rank " + std::to_string(p.second) +
                               ", which closed its connection, found)";
                return one(p.second);
            }
    std::vector<int> quiet_here;
    for (int r = 0; r < n; r++)
        if (r != self && std::find(quiet.begin(), quiet.end(), s->world_ranks[r]) != quiet.end())
            quiet_here.push_back(r);
    std::string beats = " (no heartbeat for over " +
                        std::to_string(static_cast<int>(2.5 * s->root->beat_period_s + 0.5)) + " s)";
    if (quiet_here.size() == 1)
        return one(quiet_here[0]) + beats;
    if (!quiet_here.empty()) {
        std::string all;
        for (int r : quiet_here)
            all += (all.empty() ? "" : " and ") + one(r);
        *world_rank = -1;
        return all + beats;
    }
    if (store_silent && s->root->store_on_rank0 && s->world_ranks[0] == 0 && self != 0)
        return one(0) + " (the rendezvous store it serves stopped answering too)";
    int blamed = blamed_by_others(s);
    for (int r = 0; r < n; r++)
        if (blamed >= 0 && s->world_ranks[r] == blamed && r != self)
            return one(r) + " (as another rank found)";
    std::string hosts;
    for (int r = 0; r < n; r++)
        if (hosts.find(s->hosts[r]) == std::string::npos)
            hosts += (hosts.empty() ? "" : ", ") + s->hosts[r];
    return "a rank on one of the hosts " + hosts;
}

void publish_blame(const State *s, int lost_world_rank)
{
    bool store_silent = false;
    silent_world_ranks(s->root, &store_silent);
    if (store_silent)
        return;
    std::string key = "blame/" + std::to_string(s->root->world_rank),
                v = std::to_string(lost_world_rank);
    cx_store_set(s->root->store, key.c_str(), v.data(), v.size());
}

} // namespace cx_gloo
