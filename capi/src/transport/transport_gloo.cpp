/*
 * transport_gloo - the Gloo transport (see transport_gloo.h). C++ because Gloo's API is; nothing
 * C++ crosses transport_gloo.h: every entry point catches every exception and turns it into a
 * status and cx_last_error() text.
 *
 * Collectives: allreduce (every dtype through the engine's kernels, so float16/bfloat16 reduce
 * pairwise through float32 as over MPI) is Gloo's ring, except the cross-host leg between two
 * hosts and the world's small allreduces, which go through a posted exchange (gloo_exchange.h:
 * one hop, receives posted a call ahead); broadcast and barrier are Gloo's; gather of bytes,
 * allgatherv, alltoallv and sendrecv are point-to-point over Gloo's unbound buffers (exact
 * displacements, zero-length pieces skipped); reduce_scatter is an allreduce whose own slice is
 * kept. Every wait carries the deadline of cx_transport_params.timeout_s; a failed wait names the rank
 * it lost through gloo_lost.h. What the pieces share (Root, State) is in gloo_state.h.
 */
#include "transport/transport_gloo.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "transport/gloo_exchange.h"
#include "transport/gloo_lost.h"
#include "transport/gloo_state.h"
#include "transport/hosts.h"

extern "C" {
#include "base/dtype.h"
#include "base/error.h"
#include "base/process.h"
#include "kernels/reduce.h"
}

namespace {

using namespace cx_gloo;

/* Slots of the point-to-point calls: far above the slots Gloo's collectives build from their
 * prefixes (gloo/types.h), one per kind so two kinds never match each other's messages. */
constexpr uint64_t kSlotBase = 0xC0F1ull << 48;
constexpr uint64_t kGatherBytesSlot = kSlotBase + 1;
constexpr uint64_t kAllgathervSlot = kSlotBase + 2;
constexpr uint64_t kAlltoallvSlot = kSlotBase + 3;
constexpr uint64_t kSendrecvSlot = kSlotBase + 4;
/* The posted exchanges (PostedExchange below): each uses its slot and the next. */
constexpr uint64_t kWorldExchangeSlot = kSlotBase + 5;
constexpr uint64_t kCrossExchangeSlot = kSlotBase + 7; /* and + 9: State::cross_pair[1] */
/* The world's exchange takes allreduces up to this many bytes, in worlds up to this size (each
 * rank sends its bytes to every other: n (n - 1) messages a call). */
constexpr size_t kWorldExchangeBytes = size_t(64) << 10;
constexpr int kWorldExchangeRanks = 32;
/* The two-host exchange's inbox at first: a block of the default 1 MiB chunk fits. */
constexpr size_t kCrossExchangeStart = size_t(1) << 20;

/* The rendezvous store as Gloo sees it. Failures become gloo::IoException, which the entry points
 * below turn back into the store's status text. */
class StoreAdapter : public gloo::rendezvous::Store {
  public:
    StoreAdapter(cx_store *s, double wait_s) : s_(s), wait_s_(wait_s) {}

    void set(const std::string &key, const std::vector<char> &data) override
    {
        /* An empty value still passes a valid pointer (stores may memcpy it). */
        if (cx_store_set(s_, key.c_str(), data.empty() ? "" : data.data(), data.size()))
            throw gloo::IoException(cx_error_message());
    }

    std::vector<char> get(const std::string &key) override
    {
        void *d = nullptr;
        size_t n = 0;
        if (cx_store_get(s_, key.c_str(), wait_s_, &d, &n))
            throw gloo::IoException(cx_error_message());
        std::vector<char> v(static_cast<char *>(d), static_cast<char *>(d) + n);
        free(d);
        return v;
    }

    void wait(const std::vector<std::string> &keys) override
    {
        wait(keys, millis(static_cast<long>(wait_s_ * 1000)));
    }

    void wait(const std::vector<std::string> &keys, const millis &timeout) override
    {
        std::vector<const char *> k;
        for (const auto &s : keys)
            k.push_back(s.c_str());
        if (cx_store_wait(s_, k.data(), k.size(), static_cast<double>(timeout.count()) / 1000.0))
            throw gloo::IoException(cx_error_message());
    }

  private:
    cx_store *s_;
    double wait_s_;
};

} // namespace

namespace {

struct gloo_transport {
    cx_transport base; /* first: the engine sees a cx_transport */
    State *st;
};

State *state_of(cx_transport *t) { return reinterpret_cast<gloo_transport *>(t)->st; }

millis deadline_of(const State *s)
{
    return millis(static_cast<long>(s->root->timeout_s * 1000));
}

/* Runs `body`, turning every exception into a status with text naming the call. */
template <class F> cfx_status guarded(cx_transport *t, const char *what, F &&body)
{
    State *s = state_of(t);
    try {
        body();
        return CFX_OK;
    } catch (const gloo::IoException &e) {
        bool first = !s->root->broken.exchange(true);
        int lost = -1;
        std::string who = suspects(s, t->rank, e.what(), &lost);
        if (first)
            publish_blame(s, lost);
        return cx_fail(CFX_ERR_PEER_LOST, "gloo %s (rank %d of %d): a peer died or stopped "
                       "answering within %g s (CFX_TRANSPORT_TIMEOUT_S): suspect %s; gloo says: %s",
                       what, t->rank, t->size, s->root->timeout_s, who.c_str(), e.what());
    } catch (const std::bad_alloc &) {
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "gloo %s: out of memory", what);
    } catch (const std::exception &e) {
        return cx_fail(CFX_ERR_TRANSPORT, "gloo %s (rank %d of %d): %s", what, t->rank, t->size,
                       e.what());
    } catch (...) {
        return cx_fail(CFX_ERR_TRANSPORT, "gloo %s (rank %d of %d): an unknown exception", what,
                       t->rank, t->size);
    }
}

/* Pending unbound-buffer operations, waited for together with the transport's deadline. */
struct Pending {
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> sends, recvs;
    millis timeout;
    explicit Pending(millis t) : timeout(t) {}

    void send(gloo::Context &ctx, const void *p, size_t n, int to, uint64_t slot)
    {
        if (!n)
            return;
        sends.push_back(ctx.createUnboundBuffer(const_cast<void *>(p), n));
        sends.back()->send(to, slot);
    }
    void recv(gloo::Context &ctx, void *p, size_t n, int from, uint64_t slot)
    {
        if (!n)
            return;
        recvs.push_back(ctx.createUnboundBuffer(p, n));
        recvs.back()->recv(from, slot);
    }
    void wait()
    {
        /* Receives first: a peer that never sends is the one to time out on. */
        for (auto &b : recvs)
            if (!b->waitRecv(timeout))
                throw gloo::IoException("a receive was aborted");
        for (auto &b : sends)
            if (!b->waitSend(timeout))
                throw gloo::IoException("a send was aborted");
    }
};

template <size_t N> struct Elem {
    unsigned char b[N];
};

/* c = a (op) b over n elements, through the engine's kernels (float16/bfloat16 via float32). */
gloo::AllreduceOptions::Func reducer(cfx_dtype dtype, cfx_reduce_op op)
{
    const size_t es = cfx_dtype_size(dtype);
    return [dtype, op, es](void *c, const void *a, const void *b, size_t n) {
        if (c == b) {
            cx_reduce_into(c, a, n, dtype, op); /* every op here is commutative */
            return;
        }
        if (c != a)
            memcpy(c, a, n * es);
        cx_reduce_into(c, b, n, dtype, op);
    };
}

template <size_t N>
void allreduce_elems(gloo::AllreduceOptions &o, void *buf, size_t count)
{
    o.setOutput(static_cast<Elem<N> *>(buf), count);
}

void run_allreduce(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t count,
                   cfx_dtype dtype, cfx_reduce_op op, millis timeout)
{
    if (count == 0 || ctx->size == 1)
        return;
    if (op == CFX_OP_AVERAGE)
        op = CFX_OP_SUM; /* the engine scales */
    gloo::AllreduceOptions o(ctx);
    switch (cfx_dtype_size(dtype)) {
    case 1: allreduce_elems<1>(o, buf, count); break;
    case 2: allreduce_elems<2>(o, buf, count); break;
    case 4: allreduce_elems<4>(o, buf, count); break;
    case 8: allreduce_elems<8>(o, buf, count); break;
    default: throw std::invalid_argument("dtype of an unsupported element size");
    }
    o.setReduceFunction(reducer(dtype, op));
    o.setTimeout(timeout);
    gloo::allreduce(o);
}

/* The exchange's combine for the engine's op (every op here is commutative). */
PostedExchange::Reduce exchange_reduce(cfx_dtype dtype, cfx_reduce_op op)
{
    if (op == CFX_OP_AVERAGE)
        op = CFX_OP_SUM; /* the engine scales */
    return [dtype, op](void *acc, const void *in, size_t n) {
        cx_reduce_into(acc, in, n, dtype, op);
    };
}

/* run_allreduce's reduction through a posted exchange. */
void exchange_allreduce(PostedExchange &x, void *buf, size_t count, cfx_dtype dtype,
                        cfx_reduce_op op, millis timeout)
{
    const size_t es = cfx_dtype_size(dtype);
    x.allreduce(buf, count * es, es, exchange_reduce(dtype, op), true, timeout);
}

/* An allreduce over the whole transport: small ones through the posted exchange, the rest
 * through Gloo's. */
void world_allreduce(State *s, void *buf, size_t count, cfx_dtype dtype, cfx_reduce_op op)
{
    if (s->world_small && s->world_small->takes(count * cfx_dtype_size(dtype)))
        exchange_allreduce(*s->world_small, buf, count, dtype, op, deadline_of(s));
    else
        run_allreduce(s->ctx, buf, count, dtype, op, deadline_of(s));
}

/* ---- control plane -------------------------------------------------------------------------- */

cfx_status gloo_gather_bytes(cx_transport *t, const void *send, size_t len, void **recv_out,
                             size_t *lens_out)
{
    State *s = state_of(t);
    *recv_out = nullptr;
    char *all = nullptr;
    cfx_status st = guarded(t, "gather of request bytes", [&] {
        std::vector<uint64_t> lens(static_cast<size_t>(t->size), 0);
        lens[t->rank] = len;
        /* Everyone learns every length with one allreduce of a vector holding its own (cheaper to
         * write than a gather of lengths, and the lengths are few bytes). */
        world_allreduce(s, lens.data(), lens.size(), CFX_INT64, CFX_OP_SUM);
        Pending p(deadline_of(s));
        if (t->rank != 0) {
            p.send(*s->ctx, send, len, 0, kGatherBytesSlot);
            p.wait();
            return;
        }
        size_t total = 0;
        for (uint64_t l : lens)
            total += l;
        all = static_cast<char *>(malloc(total ? total : 1));
        if (!all)
            throw std::bad_alloc();
        size_t off = 0;
        for (int r = 0; r < t->size; r++) {
            lens_out[r] = lens[r];
            if (r == 0)
                memcpy(all + off, send, len);
            else
                p.recv(*s->ctx, all + off, lens[r], r, kGatherBytesSlot);
            off += lens[r];
        }
        p.wait();
    });
    if (st) {
        free(all);
        return st;
    }
    *recv_out = all;
    return CFX_OK;
}

void broadcast_raw(const std::shared_ptr<gloo::Context> &ctx, void *buf, size_t bytes, int root,
                   millis timeout)
{
    if (bytes == 0 || ctx->size == 1)
        return;
    gloo::BroadcastOptions o(ctx);
    o.setOutput(static_cast<Elem<1> *>(buf), bytes);
    o.setRoot(root);
    o.setTimeout(timeout);
    gloo::broadcast(o);
}

cfx_status gloo_bcast_bytes(cx_transport *t, void **buf, size_t *len, int root)
{
    State *s = state_of(t);
    char *mine = nullptr;
    cfx_status st = guarded(t, "broadcast of response bytes", [&] {
        uint64_t n = t->rank == root ? *len : 0;
        broadcast_raw(s->ctx, &n, sizeof n, root, deadline_of(s));
        if (t->rank == root) {
            broadcast_raw(s->ctx, *buf, n, root, deadline_of(s));
            return;
        }
        mine = static_cast<char *>(malloc(n ? n : 1));
        if (!mine)
            throw std::bad_alloc();
        broadcast_raw(s->ctx, mine, n, root, deadline_of(s));
        *len = n;
    });
    if (st) {
        free(mine);
        return st;
    }
    if (t->rank != root)
        *buf = mine;
    return CFX_OK;
}

cfx_status gloo_allreduce_and(cx_transport *t, uint64_t *words, size_t count)
{
    State *s = state_of(t);
    return guarded(t, "AND-allreduce of the ready bits", [&] {
        if (count == 0 || t->size == 1)
            return;
        if (s->world_small && s->world_small->takes(count * sizeof *words)) {
            s->world_small->allreduce(words, count * sizeof *words, sizeof *words,
                                      [](void *acc, const void *in, size_t n) {
                                          auto *a = static_cast<uint64_t *>(acc);
                                          auto *b = static_cast<const uint64_t *>(in);
                                          for (size_t i = 0; i < n; i++)
                                              a[i] &= b[i];
                                      }, true, deadline_of(s));
            return;
        }
        gloo::AllreduceOptions o(s->ctx);
        o.setOutput(words, count);
        o.setReduceFunction([](void *c, const void *a, const void *b, size_t n) {
            auto *cc = static_cast<uint64_t *>(c);
            auto *aa = static_cast<const uint64_t *>(a);
            auto *bb = static_cast<const uint64_t *>(b);
            for (size_t i = 0; i < n; i++)
                cc[i] = aa[i] & bb[i];
        });
        o.setTimeout(deadline_of(s));
        gloo::allreduce(o);
    });
}

/* ---- data plane ----------------------------------------------------------------------------- */

cfx_status check_op(cx_transport *t, cfx_reduce_op op, const char *what)
{
    if (op == CFX_OP_ADASUM || op < 0 || op >= CFX_OP_COUNT)
        return cx_fail(CFX_ERR_UNSUPPORTED, "gloo %s (rank %d): op %d is not a plain reduction "
                       "(Adasum runs over sendrecv)", what, t->rank, (int)op);
    return CFX_OK;
}

cfx_status gloo_allreduce(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                          cfx_reduce_op op)
{
    State *s = state_of(t);
    cfx_status st = check_op(t, op, "allreduce");
    return st ? st : guarded(t, "allreduce", [&] {
        world_allreduce(s, buf, count, dtype, op);
    });
}

cfx_status gloo_allgatherv(cx_transport *t, const void *send, size_t send_bytes, void *recv,
                           const size_t *recv_bytes, const size_t *displs)
{
    State *s = state_of(t);
    return guarded(t, "allgatherv", [&] {
        char *out = static_cast<char *>(recv);
        if (send_bytes && out + displs[t->rank] != send)
            memmove(out + displs[t->rank], send, send_bytes);
        Pending p(deadline_of(s));
        for (int r = 0; r < t->size; r++) {
            if (r == t->rank)
                continue;
            p.recv(*s->ctx, out + displs[r], recv_bytes[r], r, kAllgathervSlot);
            p.send(*s->ctx, send, send_bytes, r, kAllgathervSlot);
        }
        p.wait();
    });
}

cfx_status gloo_broadcast(cx_transport *t, void *buf, size_t bytes, int root)
{
    State *s = state_of(t);
    return guarded(t, "broadcast", [&] { broadcast_raw(s->ctx, buf, bytes, root, deadline_of(s)); });
}

cfx_status gloo_alltoallv(cx_transport *t, const void *send, const size_t *send_bytes,
                          const size_t *sdispls, void *recv, const size_t *recv_bytes,
                          const size_t *rdispls)
{
    State *s = state_of(t);
    return guarded(t, "alltoallv", [&] {
        const char *in = static_cast<const char *>(send);
        char *out = static_cast<char *>(recv);
        if (send_bytes[t->rank])
            memmove(out + rdispls[t->rank], in + sdispls[t->rank], send_bytes[t->rank]);
        Pending p(deadline_of(s));
        for (int r = 0; r < t->size; r++) {
            if (r == t->rank)
                continue;
            p.recv(*s->ctx, out + rdispls[r], recv_bytes[r], r, kAlltoallvSlot);
            p.send(*s->ctx, in + sdispls[r], send_bytes[r], r, kAlltoallvSlot);
        }
        p.wait();
    });
}

cfx_status gloo_reduce_scatter(cx_transport *t, const void *send, void *recv, const size_t *counts,
                               cfx_dtype dtype, cfx_reduce_op op)
{
    State *s = state_of(t);
    cfx_status st = check_op(t, op, "reduce_scatter");
    return st ? st : guarded(t, "reduce_scatter", [&] {
        /* Gloo has no reduce-scatter: an allreduce of the whole, then this rank's slice. */
        size_t total = 0, before = 0;
        for (int r = 0; r < t->size; r++) {
            if (r < t->rank)
                before += counts[r];
            total += counts[r];
        }
        const size_t es = cfx_dtype_size(dtype);
        std::vector<unsigned char> whole(total * es);
        memcpy(whole.data(), send, total * es);
        run_allreduce(s->ctx, whole.data(), total, dtype, op, deadline_of(s));
        memcpy(recv, whole.data() + before * es, counts[t->rank] * es);
    });
}

cfx_status gloo_barrier(cx_transport *t)
{
    State *s = state_of(t);
    return guarded(t, "barrier", [&] {
        if (t->size == 1)
            return;
        gloo::BarrierOptions o(s->ctx);
        o.setTimeout(deadline_of(s));
        gloo::barrier(o);
    });
}

/* Two hosts: the call's sends leave in the post, its receives were posted after the last call
 * of the same exchange, and the wait combines. More hosts: Gloo's allreduce, whole, in the post. */
cfx_status gloo_cross_allreduce_post(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                     cfx_reduce_op op)
{
    State *s = state_of(t);
    cfx_status st = check_op(t, op, "cross-host allreduce");
    if (st)
        return st;
    st = guarded(t, "cross-host allreduce", [&] {
        if (s->cross_posted - s->cross_waited >= CX_CROSS_IN_FLIGHT)
            throw std::logic_error("more cross-host allreduces under way than CX_CROSS_IN_FLIGHT");
        const size_t es = cfx_dtype_size(dtype);
        if (s->cross_pair[0])
            s->cross_pair[s->cross_posted % 2]->start(buf, count * es, es,
                                                      exchange_reduce(dtype, op), true);
        else if (s->cross)
            run_allreduce(s->cross, buf, count, dtype, op, deadline_of(s));
        s->cross_posted++;
    });
    if (st) /* the caller waits for nothing more */
        s->cross_waited = s->cross_posted;
    return st;
}

cfx_status gloo_cross_allreduce_wait(cx_transport *t)
{
    State *s = state_of(t);
    cfx_status st = guarded(t, "cross-host allreduce", [&] {
        if (s->cross_waited == s->cross_posted)
            throw std::logic_error("a wait with no cross-host allreduce under way");
        unsigned k = s->cross_waited++;
        if (s->cross_pair[0])
            s->cross_pair[k % 2]->finish(deadline_of(s));
    });
    if (st) /* the caller waits for nothing more */
        s->cross_waited = s->cross_posted;
    return st;
}

/* The plain call is a post and its wait, with none of the posted ones under way. */
cfx_status gloo_cross_allreduce(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                cfx_reduce_op op)
{
    State *s = state_of(t);
    if (s->cross_posted != s->cross_waited)
        return cx_fail(CFX_ERR_INTERNAL, "gloo cross-host allreduce (rank %d): a plain call while "
                       "a posted one is under way", t->rank);
    cfx_status st = gloo_cross_allreduce_post(t, buf, count, dtype, op);
    return st ? st : gloo_cross_allreduce_wait(t);
}

cfx_status gloo_sendrecv(cx_transport *t, cx_group group, const void *send, size_t send_bytes,
                         int to, void *recv, size_t recv_bytes, int from)
{
    State *s = state_of(t);
    /* Group ranks to ranks of this transport: the world context carries every group. */
    auto world_rank = [&](int r) {
        if (r < 0)
            return r;
        if (group == CX_GROUP_LOCAL)
            return s->local_members.at(static_cast<size_t>(r));
        if (group == CX_GROUP_CROSS)
            return s->cross_members.at(static_cast<size_t>(r));
        return r;
    };
    return guarded(t, "sendrecv", [&] {
        int dst = world_rank(to), src = world_rank(from);
        if (dst == t->rank && src == t->rank) {
            memmove(recv, send, std::min(send_bytes, recv_bytes));
            return;
        }
        Pending p(deadline_of(s));
        if (src >= 0)
            p.recv(*s->ctx, recv, recv_bytes, src, kSendrecvSlot);
        if (dst >= 0)
            p.send(*s->ctx, send, send_bytes, dst, kSendrecvSlot);
        p.wait();
    });
}

/* ---- construction, split, destruction ------------------------------------------------------- */

void release_root(Root *root)
{
    if (--root->refs > 0)
        return;
    stop_heartbeat(root);
    /* Where rank 0 serves the TCP store, it waits until every rank has said it is done with the
     * store (bounded by the rendezvous deadline) before the server goes away under them. After a
     * peer was lost nobody waits for it. A store served by someone else (a launcher, a driver, a
     * file store) outlives the world without it: there rank 0 must not wait, or a rank that left
     * without its goodbye would hold rank 0's shutdown for the whole rendezvous deadline. */
    bool goodbye = root->store_on_rank0 && !root->broken;
    if (goodbye) {
        std::string mine = "world-done/" + std::to_string(root->world_rank);
        cx_store_set(root->store, mine.c_str(), "", 0);
    }
    if (root->world_rank == 0 && goodbye) {
        std::vector<std::string> keys;
        std::vector<const char *> k;
        for (int r = 0; r < root->world_size; r++)
            keys.push_back("world-done/" + std::to_string(r));
        for (const auto &key : keys)
            k.push_back(key.c_str());
        cx_store_wait(root->store, k.data(), k.size(), root->rendezvous_s);
    }
    cx_store_destroy(root->store);
    delete root;
}

void gloo_destroy(cx_transport *t)
{
    if (!t)
        return;
    State *s = state_of(t);
    Root *root = s->root;
    s->cross_pair[1].reset();
    s->cross_pair[0].reset();
    s->world_small.reset();
    s->cross.reset();
    s->ctx.reset();
    delete s;
    delete reinterpret_cast<gloo_transport *>(t);
    release_root(root);
}

cfx_status build(Root *root, const std::string &prefix, int rank, int size, cx_transport **out);

cfx_status gloo_split(cx_transport *t, const int *ranks, size_t n, cx_transport **out)
{
    State *s = state_of(t);
    *out = nullptr;
    std::string prefix;
    int new_rank = -1;
    {
        std::lock_guard<std::mutex> hold(s->split_mu);
        prefix = s->prefix + "/split" + std::to_string(s->split_count++);
    }
    for (size_t i = 0; i < n; i++)
        if (ranks[i] == t->rank)
            new_rank = static_cast<int>(i);
    if (new_rank < 0)
        return CFX_OK;
    s->root->refs++;
    cfx_status st = build(s->root, prefix, new_rank, static_cast<int>(n), out);
    if (st)
        release_root(s->root);
    return st;
}

/* A peer the host segment lost: no goodbye through the store waits for it (release_root). */
void gloo_mark_lost(cx_transport *t) { state_of(t)->root->broken = true; }

/* The engine's segment reduces a host's share faster than Gloo's TCP pairs; every Gloo wait has
 * the transport deadline, so a call in flight ends with CFX_ERR_PEER_LOST when a peer is lost. */
const cx_transport_ops gloo_ops = {
    "gloo",
    {true, true, CX_TRANSPORT_CROSS_ALLREDUCE | CX_TRANSPORT_SPLIT | CX_TRANSPORT_SENDRECV |
                     CX_TRANSPORT_MARK_LOST | CX_TRANSPORT_CROSS_PIPELINE,
     /* Every receive wakes Gloo's I/O thread, then the caller: a cross-host call's wake-ups
      * cost up to milliseconds on a busy host, where MPI polls in the caller; 8 MiB chunks
      * halved the ResNet-50 step between two pretend hosts (docs/performance.md, "Chunks
      * across hosts"), and the pipelined leg overlaps the rest. */
     size_t(8) << 20},
    gloo_gather_bytes, gloo_bcast_bytes, gloo_allreduce_and, gloo_allreduce,
    gloo_allgatherv, gloo_broadcast, gloo_alltoallv, gloo_reduce_scatter, gloo_barrier,
    gloo_cross_allreduce, gloo_cross_allreduce_post, gloo_cross_allreduce_wait, gloo_split,
    gloo_sendrecv, gloo_mark_lost, gloo_destroy};

std::string host_name(const Root *root, int world_rank)
{
    char name[256];
    cx_host_name(world_rank, root->test_local_size, name, sizeof name);
    return name;
}

/* The transport over `size` ranks meeting under `prefix`: hosts and addresses through the store,
 * then the local and cross groups, then Gloo's full mesh (and the cross mesh). */
cfx_status build(Root *root, const std::string &prefix, int rank, int size, cx_transport **out)
{
    auto *g = new (std::nothrow) gloo_transport();
    State *s = g ? new (std::nothrow) State() : nullptr;
    if (!s) {
        delete g;
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "gloo: no memory for a transport");
    }
    g->base.ops = &gloo_ops;
    g->base.rank = rank;
    g->base.size = size;
    g->st = s;
    s->root = root;
    s->prefix = prefix;
    cx_transport *t = &g->base;
    cfx_status st = guarded(t, "connection of the ranks", [&] {
        StoreAdapter whole(root->store, root->rendezvous_s);
        gloo::rendezvous::PrefixStore store(prefix, whole);
        /* Per rank, one line each: host name, Gloo's address, world rank, and "<machine> <pid>
         * <start time>" so that ranks on one machine can tell a dead peer from a slow one. */
        char machine[160];
        cx_process_machine(machine, sizeof machine);
        std::string me = host_name(root, root->world_rank) + "\n" + root->dev->str() + "\n" +
                         std::to_string(root->world_rank) + "\n" + machine + " " +
                         std::to_string(getpid()) + " " +
                         std::to_string(cx_process_start_time(getpid()));
        store.set("host/" + std::to_string(rank), std::vector<char>(me.begin(), me.end()));
        for (int r = 0; r < size; r++) {
            std::vector<char> v = store.get("host/" + std::to_string(r));
            std::string text(v.begin(), v.end());
            std::vector<std::string> line;
            for (size_t at = 0; at <= text.size();) {
                size_t nl = std::min(text.find('\n', at), text.size());
                line.push_back(text.substr(at, nl - at));
                at = nl + 1;
            }
            line.resize(4);
            s->hosts.push_back(line[0]);
            s->world_ranks.push_back(line[2].empty() ? r : std::stoi(line[2]));
            /* Device::str() is "[address]" (with an interface sometimes): keep the address. */
            size_t a = line[1].find('['), b = line[1].find(']');
            s->addrs.push_back(a != std::string::npos && b != std::string::npos
                                   ? line[1].substr(a + 1, b - a - 1) : line[1]);
            char their_machine[160] = "";
            int pid = 0;
            unsigned long long start = 0;
            bool here = sscanf(line[3].c_str(), "%159s %d %llu", their_machine, &pid, &start) == 3 &&
                        !strcmp(their_machine, machine) && r != rank;
            s->pids.push_back(here ? pid : 0);
            s->starts.push_back(here ? start : 0);
        }
        /* The grouping every transport shares (hosts.h). */
        std::vector<const char *> names;
        for (const auto &h : s->hosts)
            names.push_back(h.c_str());
        cx_host_groups hg;
        if (cx_host_groups_from_names(names.data(), size, rank, &hg))
            throw std::runtime_error(cx_error_message());
        s->local_members.assign(hg.local_members, hg.local_members + hg.local_size);
        s->cross_members.assign(hg.cross_members, hg.cross_members + hg.cross_size);
        t->local_rank = hg.local_rank;
        t->local_size = hg.local_size;
        t->cross_rank = hg.cross_rank;
        t->cross_size = hg.cross_size;
        cx_host_groups_free(&hg);

        auto world = std::make_shared<gloo::rendezvous::Context>(rank, size);
        world->setTimeout(millis(static_cast<long>(root->rendezvous_s * 1000)));
        gloo::rendezvous::PrefixStore mesh("mesh", store);
        world->connectFullMesh(mesh, root->dev);
        world->setTimeout(deadline_of(s));
        s->ctx = world;
        if (size > 1 && size <= kWorldExchangeRanks)
            s->world_small.reset(new PostedExchange(world, kWorldExchangeSlot,
                                                    kWorldExchangeBytes, false));
        learn_pair_peers(s, store, *world);
        if (t->cross_size > 1) {
            auto cross = std::make_shared<gloo::rendezvous::Context>(t->cross_rank, t->cross_size);
            cross->setTimeout(millis(static_cast<long>(root->rendezvous_s * 1000)));
            gloo::rendezvous::PrefixStore cross_store("cross" + std::to_string(t->local_rank),
                                                      store);
            cross->connectFullMesh(cross_store, root->dev);
            cross->setTimeout(deadline_of(s));
            s->cross = cross;
            if (t->cross_size == 2)
                for (int i = 0; i < 2; i++)
                    s->cross_pair[i].reset(new PostedExchange(cross, kCrossExchangeSlot + 2 * i,
                                                              kCrossExchangeStart, true));
        }
    });
    if (st) {
        delete s;
        delete g;
        return st;
    }
    *out = t;
    return CFX_OK;
}

/* Gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that just died would kill this
 * process with SIGPIPE instead of failing the call with EPIPE. Ignored, unless the program installed
 * a handler of its own (then that handler sees it). */
void ignore_sigpipe()
{
    struct sigaction now;
    if (sigaction(SIGPIPE, nullptr, &now) == 0 && now.sa_handler == SIG_DFL)
        signal(SIGPIPE, SIG_IGN);
}

} // namespace

extern "C" cfx_status cx_transport_gloo_create(const cx_transport_params *p, cx_transport **out)
{
    *out = nullptr;
    cx_store *store = p->store;
    ignore_sigpipe();
    Root *root = new (std::nothrow) Root();
    if (!root) {
        cx_store_destroy(store);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "gloo: no memory for the transport");
    }
    root->store = store;
    root->world_rank = p->rank;
    root->world_size = p->size;
    root->timeout_s = p->timeout_s;
    root->rendezvous_s = p->rendezvous_s;
    root->test_local_size = p->pretend_local_size;
    try {
        /* Gloo listens on the address this process reached the store from (the interface its
         * peers can reach), else on what this host's name resolves to. */
        gloo::transport::tcp::attr attr;
        char name[256] = "";
        gethostname(name, sizeof name - 1);
        attr.hostname = store->local_addr[0] ? store->local_addr : name;
        root->dev = gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception &e) {
        cx_store_destroy(store);
        delete root;
        return cx_fail(CFX_ERR_TRANSPORT, "gloo: cannot open a TCP device: %s", e.what());
    }
    root->store_on_rank0 = p->store_on_rank0;
    cfx_status st = build(root, "world", p->rank, p->size, out);
    if (st) {
        cx_store_destroy(store);
        delete root;
        return st;
    }
    try {
        start_heartbeat(root);
    } catch (const std::exception &e) {
        gloo_destroy(*out);
        *out = nullptr;
        return cx_fail(CFX_ERR_INTERNAL, "gloo: cannot start the heartbeat thread: %s", e.what());
    }
    return CFX_OK;
}
