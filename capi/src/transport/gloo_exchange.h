/*
 * gloo_exchange - PostedExchange, the Gloo transport's allreduce in one hop over receives posted a
 * call ahead (C++, internal to transport/): the cross-host leg between two hosts, whole or in two
 * halves (start, finish) so that two chunks may be under way on two exchanges, and the world's
 * small allreduces. State (gloo_state.h) holds the exchanges; transport_gloo.cpp calls them.
 */
#ifndef CFX_GLOO_EXCHANGE_H
#define CFX_GLOO_EXCHANGE_H

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

namespace cx_gloo {

using millis = std::chrono::milliseconds;

/* An allreduce in one hop, over receives posted in advance: every rank sends its whole buffer to
 * every other and combines what it receives in rank order (the same order on every rank, so every
 * rank holds the same bits). Gloo's ring passes a small buffer around the ring 2 (n - 1) times and
 * cuts a large one into segments in two phases; and a Gloo send waits until its receiver has said
 * it is ready (a receive posted there), so every hop waited for the receiving process to run
 * first. Here each rank posts its receives for the next call as soon as this call has read its
 * inbox, so the next call's bytes leave at once. Used for the cross-host leg between two hosts
 * (the same bytes on the wire as the ring: each leader sends its block once) and for the small
 * allreduces of the world (the ready bits of every cycle, lone small tensors).
 * The inbox holds `start` bytes from each peer; with `grow` it grows with the calls (alike on
 * every rank: all see the same sizes in the same order) up to kInboxMax, and bytes beyond it go
 * as a second message per peer on the next slot, its receives posted when the call starts; without
 * `grow` larger calls are not taken (takes()). */
class PostedExchange {
  public:
    using Reduce = std::function<void(void *acc, const void *in, size_t count)>;
    static constexpr size_t kInboxMax = size_t(64) << 20;

    PostedExchange(const std::shared_ptr<gloo::Context> &ctx, uint64_t slot, size_t start,
                   bool grow)
        : ctx_(ctx), slot_(slot), grow_(grow)
    {
        post(start);
    }

    ~PostedExchange()
    {
        /* The receives still posted go with their buffer; the pairs outlive it (ctx_ is held). */
        inbox_.reset();
    }

    bool takes(size_t bytes) const { return grow_ || bytes <= cap_; }

    /* `commutative`: x op y == y op x bit for bit, so that with two ranks each may combine in
     * place, its own first. */
    void allreduce(void *buf, size_t bytes, size_t es, const Reduce &reduce, bool commutative,
                   millis timeout)
    {
        start(buf, bytes, es, reduce, commutative);
        finish(timeout);
    }

    /* allreduce in two halves: start sends `buf` and posts what the call needs beyond the inbox;
     * finish waits, combines into `buf` and posts the next call's receives. One call at a time
     * per exchange: two exchanges on their own slots let two calls be under way. */
    void start(void *buf, size_t bytes, size_t es, const Reduce &reduce, bool commutative)
    {
        const int n = ctx_->size, me = ctx_->rank;
        call_ = Call{static_cast<char *>(buf), bytes, es, reduce, commutative};
        if (bytes == 0)
            return;
        const size_t first = std::min(bytes, cap_), rest = bytes - first;
        if (rest) {
            rest_area_.resize(rest * static_cast<size_t>(n));
            rest_in_ = ctx_->createUnboundBuffer(rest_area_.data(), rest_area_.size());
            for (int q = 0; q < n; q++)
                if (q != me)
                    rest_in_->recv(q, slot_ + 1, rest * static_cast<size_t>(q), rest);
        }
        out_ = ctx_->createUnboundBuffer(buf, bytes);
        for (int q = 0; q < n; q++) {
            if (q == me)
                continue;
            out_->send(q, slot_, 0, first);
            if (rest)
                out_->send(q, slot_ + 1, first, rest);
        }
    }

    void finish(millis timeout)
    {
        const int n = ctx_->size;
        const Call c = call_;
        if (c.bytes == 0)
            return;
        const size_t first = std::min(c.bytes, cap_), rest = c.bytes - first;
        /* Receives first: a peer that never sends is the one to time out on. */
        for (int k = 1; k < n; k++)
            if (!inbox_->waitRecv(timeout))
                throw gloo::IoException("a receive of the posted exchange was aborted");
        /* Every send must have left `buf` before the result overwrites it. */
        for (int k = (n - 1) * (rest ? 2 : 1); k > 0; k--)
            if (!out_->waitSend(timeout))
                throw gloo::IoException("a send of the posted exchange was aborted");
        combine(c.buf, inbox_area_.data(), cap_, first, c.es, c.reduce, c.commutative);
        /* The next call's receives, before this one's rest is waited for: the peers' next bytes
         * may leave as soon as they are done here. */
        size_t next = cap_;
        while (grow_ && next < c.bytes && next < kInboxMax)
            next *= 2;
        post(next);
        if (rest) {
            for (int k = 1; k < n; k++)
                if (!rest_in_->waitRecv(timeout))
                    throw gloo::IoException("a receive of the posted exchange was aborted");
            combine(c.buf + first, rest_area_.data(), rest, rest, c.es, c.reduce, c.commutative);
        }
    }

  private:
    /* mine = c_0 op c_1 op ... op c_(n-1), left to right, with c_me = mine and c_q at q * stride
     * of `area`. */
    void combine(char *mine, const char *area, size_t stride, size_t len, size_t es,
                 const Reduce &reduce, bool commutative)
    {
        const int n = ctx_->size, me = ctx_->rank;
        if (me == 0 || (n == 2 && commutative)) {
            for (int q = 0; q < n; q++)
                if (q != me)
                    reduce(mine, area + stride * static_cast<size_t>(q), len / es);
            return;
        }
        scratch_.assign(area, area + len);
        for (int q = 1; q < n; q++)
            reduce(scratch_.data(), q == me ? mine : area + stride * static_cast<size_t>(q),
                   len / es);
        memcpy(mine, scratch_.data(), len);
    }

    void post(size_t capacity)
    {
        const int n = ctx_->size, me = ctx_->rank;
        if (capacity != cap_ || !inbox_) {
            inbox_.reset();
            cap_ = capacity;
            inbox_area_.assign(cap_ * static_cast<size_t>(n), 0);
            inbox_ = ctx_->createUnboundBuffer(inbox_area_.data(), inbox_area_.size());
        }
        for (int q = 0; q < n; q++)
            if (q != me)
                inbox_->recv(q, slot_, cap_ * static_cast<size_t>(q), cap_);
    }

    std::shared_ptr<gloo::Context> ctx_;
    uint64_t slot_;
    bool grow_;
    size_t cap_ = 0;
    std::vector<char> inbox_area_, rest_area_, scratch_;
    std::unique_ptr<gloo::transport::UnboundBuffer> inbox_, rest_in_, out_;
    /* the call between start and finish */
    struct Call {
        char *buf;
        size_t bytes, es;
        Reduce reduce;
        bool commutative;
    } call_{nullptr, 0, 1, nullptr, true};
};

} // namespace cx_gloo

#endif /* CFX_GLOO_EXCHANGE_H */
