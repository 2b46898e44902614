/* shm - the intra-node shared-memory allreduce (see shm.h). */
#include "exec/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/error.h"
#include "base/process.h"
#include "base/split.h"
#include "kernels/compress.h"
#include "kernels/reduce.h"
#include "exec/combine16.h"
#include "exec/shared_pool.h"

#define CACHE_LINE 64
#define OWN_STRIP_BYTES (16u << 10) /* a strip of the own block: reduced, then copied out from L1 */

/* The segment's first page: the barrier, each word on its own cache line. */
typedef struct shm_control {
    _Alignas(CACHE_LINE) atomic_uint arrived;
    _Alignas(CACHE_LINE) atomic_uint generation; /* 32 bits: a futex word */
    atomic_uint sleepers;                        /* waiters in futex_wait */
} shm_control;

/* Each local rank's entry in the segment, on a cache line of its own: who it is, for the message
 * when it fails to arrive, and the barrier generations it has reached, so that a waiter past its
 * deadline can tell the late ranks from the others. */
typedef struct shm_member {
    _Alignas(CACHE_LINE) atomic_uint reached;
    int32_t rank; /* in the transport */
    int32_t pid;  /* one host, one pid namespace: a peer's liveness is kill(pid, 0) and /proc */
} shm_member;

/* How often a waiter asleep at a barrier looks whether a late peer's process still exists: a dead
 * peer is named within this, a stopped or stuck one at the deadline. */
#define LIVENESS_PERIOD_S 0.1

/* Each local rank's offer of a batch for the direct path: whether all of its tensors lie in its
 * shared pool, and where (offsets into the pool), segment by segment, with each segment's length
 * (a rank cuts its batch into segments by where its tensors lie, so the cuts must be checked to be
 * the same on every local rank before one rank reads another's segment i). Written before a batch's
 * first barrier, read by the peers right after it; the next batch rewrites it only after another
 * barrier, so no reader sees it change. */
#define DIRECT_MAX_SEGS 4096
typedef struct direct_offer {
    uint32_t ok, nsegs;
    uint32_t mapped;        /* set up: 1 when this rank mapped every peer's pool, 2 when it could not */
    cx_pool_export pool;    /* where the peers map this rank's pool (written with the first offer) */
    struct { uint64_t src, dst, count; } at[DIRECT_MAX_SEGS];
} direct_offer;

/* The direct path is set up on the first batch every local rank offers (all see the same batches,
 * so all get there together): only then do all the pools exist, since nothing makes a pool but
 * cfx_alloc. A job that never allocates shared tensor memory maps nothing. */
typedef enum { DIRECT_UNTRIED, DIRECT_READY, DIRECT_OFF } direct_state;

struct cx_shm {
    int nlocal, me;
    uint64_t direct_map_fail; /* CFX_TEST_DIRECT_MAP_FAIL: bit L, local rank L cannot map */
    size_t chunk;          /* bytes per slot */
    size_t size;           /* bytes mapped */
    uint8_t *base;
    double timeout_s;      /* a barrier waits this long for a late peer (CFX_TRANSPORT_TIMEOUT_S) */
    cfx_status failed;     /* a barrier gave up: the segment's state is lost, every call fails */
    char failure[CX_ERROR_MAX];
    shm_control *control;
    shm_member *members;   /* [nlocal] */
    uint8_t *slots;        /* [2][nlocal][chunk] */
    uint8_t *results;      /* [2][chunk] */
    direct_offer *offers;  /* [nlocal] */
    uint64_t *and_rows;    /* [2][nlocal][CX_SHM_AND_MAX_WORDS]: each rank's words of a round */
    unsigned and_rounds;   /* AND rounds so far (the same count on every local rank) */
    unsigned generation;   /* this rank's view of the barrier generation */
    direct_state direct;
    bool exported;         /* this rank's pool is in its offer */
    uint8_t **peer_pools;  /* [nlocal] the local ranks' pools as mapped here (own: NULL) */
    uint64_t *peer_sizes;  /* [nlocal] their sizes, for munmap */
    uint8_t *strip;        /* OWN_STRIP_BYTES of private scratch for the direct path */
    uint8_t *piece;        /* two chunks of private scratch: its hierarchical form's blocks */
    uint16_t *wire16;      /* made on first use: a compressed cross-host block and what its
                            * once-rounded combine needs (cx_combine16_bytes) */
    char direct_off[512];  /* why the direct path is off */
};

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

static uint8_t *slot(cx_shm *s, int buffer, int rank)
{
    return s->slots + ((size_t)buffer * (size_t)s->nlocal + (size_t)rank) * s->chunk;
}

static void futex_wait(atomic_uint *word, unsigned value)
{
    struct timespec limit = {0, 50 * 1000 * 1000}; /* a bound, not a poll: the waker wakes us */
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT, value, &limit, NULL, 0);
}

static void futex_wake_all(atomic_uint *word)
{
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet. */
static bool process_ended(int pid)
{
    return cx_process_probe(pid, 0) == CX_PROCESS_ENDED;
}

/* Gives up on a barrier: names the local ranks that did not reach generation `gen` + 1 (those
 * whose process ended first, else all the late ones) and fails this and every later call. */
static cfx_status give_up(cx_shm *s, unsigned gen, double waited_s, bool ended_only)
{
    char host[256] = "?", who[1024] = "";
    gethostname(host, sizeof host - 1);
    size_t len = 0;
    for (int q = 0; q < s->nlocal; q++) {
        const shm_member *m = &s->members[q];
        if (q == s->me || (int)(atomic_load(&m->reached) - (gen + 1)) >= 0)
            continue;
        bool ended = process_ended(m->pid);
        if (ended_only && !ended)
            continue;
        int w = snprintf(who + len, sizeof who - len, "%srank %d on host %s (process %d %s)",
                         len ? ", " : "", m->rank, host, m->pid, ended ? "ended" : "did not arrive");
        if (w > 0 && (size_t)w < sizeof who - len)
            len += (size_t)w;
    }
    snprintf(s->failure, sizeof s->failure, "shared-memory barrier (local rank %d of %d, rank %d, "
             "host %s): a peer died or stopped answering within %g s (CFX_TRANSPORT_TIMEOUT_S); "
             "waited %.2f s: suspect %s", s->me, s->nlocal, s->members[s->me].rank, host,
             s->timeout_s, waited_s, len ? who : "a local rank that left the segment");
    s->failed = CFX_ERR_PEER_LOST;
    return cx_fail(s->failed, "%s", s->failure);
}

/* Waits for every local rank. A round's phases take a few hundred microseconds, so a waiter spins,
 * then yields (letting any other runnable thread have the core) for up to BARRIER_YIELD_S, then
 * sleeps on a futex that the last arriver wakes. Polling with nanosleep instead costs the timer
 * slack (about 50 us) per barrier, which at two barriers per chunk was a third of a 256 MiB
 * reduction's time. Every rank is in the same batch or agreement round when it gets here (the
 * negotiation put them there, and cycles run at least every cycle time on every rank), so a long
 * wait means a lost peer: a sleeping waiter checks the late ranks' processes every
 * LIVENESS_PERIOD_S and gives up with CFX_ERR_PEER_LOST when one ended, or at the deadline. */
#define BARRIER_YIELD_S 1e-3
static cfx_status barrier_yielding(cx_shm *s, double yield_s)
{
    if (s->failed)
        return cx_fail(s->failed, "%s", s->failure);
    unsigned gen = s->generation;
    shm_control *c = s->control;
    /* Relaxed: the arrival's fetch_add below orders it; only a waiter past its deadline reads it. */
    atomic_store_explicit(&s->members[s->me].reached, gen + 1, memory_order_relaxed);
    if (atomic_fetch_add(&c->arrived, 1) == (unsigned)s->nlocal - 1) {
        atomic_store_explicit(&c->arrived, 0, memory_order_relaxed);
        atomic_store(&c->generation, gen + 1);
        if (atomic_load(&c->sleepers))
            futex_wake_all(&c->generation);
    } else {
        double started = 0, until = 0, next_check = 0;
        for (unsigned spins = 0; atomic_load(&c->generation) == gen; spins++) {
            if (spins < 128)
                continue;
            if (until == 0) {
                started = cx_now_s();
                until = started + yield_s;
                next_check = started + LIVENESS_PERIOD_S;
            }
            if (spins % 64 || cx_now_s() < until) {
                sched_yield();
                continue;
            }
            atomic_fetch_add(&c->sleepers, 1);
            if (atomic_load(&c->generation) == gen)
                futex_wait(&c->generation, gen);
            atomic_fetch_sub(&c->sleepers, 1);
            double now = cx_now_s();
            if (now >= next_check && atomic_load(&c->generation) == gen) {
                next_check = now + LIVENESS_PERIOD_S;
                bool timed_out = s->timeout_s > 0 && now - started >= s->timeout_s;
                for (int q = 0; q < s->nlocal && !timed_out; q++)
                    if (q != s->me && (int)(atomic_load(&s->members[q].reached) - (gen + 1)) < 0 &&
                        process_ended(s->members[q].pid))
                        return give_up(s, gen, now - started, true);
                if (timed_out)
                    return give_up(s, gen, now - started, false);
            }
        }
    }
    s->generation = gen + 1;
    return CFX_OK;
}

static cfx_status barrier(cx_shm *s) { return barrier_yielding(s, BARRIER_YIELD_S); }

cfx_status cx_shm_create(cx_transport *t, size_t chunk_bytes, double timeout_s,
                         uint64_t direct_map_fail, cx_shm **out)
{
    *out = NULL;
    /* Rank 0 picks a job-unique tag; each host's segment is named by the tag and its host index. */
    uint64_t tag = 0;
    if (t->rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        tag = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    }
    void *buf = &tag;
    size_t len = sizeof tag;
    cfx_status st = t->ops->bcast_bytes(t, &buf, &len, 0);
    if (st)
        return st;
    if (t->rank != 0) {
        memcpy(&tag, buf, sizeof tag);
        free(buf);
    }
    cx_shm *s = calloc(1, sizeof *s);
    if (!s)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the shared-memory path");
    s->nlocal = t->local_size;
    s->me = t->local_rank;
    s->direct_map_fail = direct_map_fail;
    s->timeout_s = timeout_s;
    s->chunk = round_up(chunk_bytes, CACHE_LINE);
    size_t control = round_up(sizeof(shm_control), 4096);
    size_t members = round_up((size_t)s->nlocal * sizeof(shm_member), 4096);
    size_t offers = round_up((size_t)s->nlocal * sizeof(direct_offer), 4096);
    size_t and_rows =
        round_up(2 * (size_t)s->nlocal * CX_SHM_AND_MAX_WORDS * sizeof(uint64_t), 4096);
    s->size = control + members + offers + and_rows + s->chunk * 2 * (size_t)s->nlocal + s->chunk * 2;
    char name[64];
    snprintf(name, sizeof name, "/conflux-%016llx-%d", (unsigned long long)tag, t->cross_rank);
    int fd = -1;
    cfx_status local = CFX_OK;
    if (s->me == 0) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)s->size) != 0)
            local = cx_fail(CFX_ERR_TRANSPORT, "cannot create shared memory %s (%zu bytes) in "
                            "/dev/shm", name, s->size);
    }
    /* Everyone waits for the creators, then opens; a failure anywhere is seen by all below. */
    if ((st = t->ops->barrier(t))) {
        if (fd >= 0)
            close(fd);
        free(s);
        return st;
    }
    if (!local && s->me != 0 && (fd = shm_open(name, O_RDWR, 0600)) < 0)
        local = cx_fail(CFX_ERR_TRANSPORT, "cannot open shared memory %s", name);
    if (!local) {
        void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            local = cx_fail(CFX_ERR_TRANSPORT, "cannot map shared memory %s (%zu bytes)", name, s->size);
        else
            s->base = p;
    }
    if (!local) { /* read by the peers only when they wait for this rank, after the AND below */
        shm_member *me = (shm_member *)(s->base + control) + s->me;
        me->rank = t->rank;
        me->pid = (int32_t)getpid();
    }
    if (fd >= 0)
        close(fd);
    /* Agree on success everywhere: one failed rank means nobody uses the segment. */
    uint64_t ok = local ? 0 : ~0ull;
    char msg[CX_ERROR_MAX];
    snprintf(msg, sizeof msg, "%s", cx_error_message());
    st = t->ops->allreduce_and(t, &ok, 1);
    if (s->me == 0)
        shm_unlink(name); /* mapped by all (or abandoned): the name is no longer needed */
    if (st || !ok) {
        if (s->base)
            munmap(s->base, s->size);
        free(s);
        return st ? st : cx_fail(CFX_ERR_TRANSPORT, "shared-memory path unavailable: %s",
                                 local ? msg : "another rank could not map it");
    }
    s->control = (shm_control *)s->base;
    s->members = (shm_member *)(s->base + control);
    s->offers = (direct_offer *)(s->base + control + members);
    s->and_rows = (uint64_t *)(s->base + control + members + offers);
    s->slots = s->base + control + members + offers + and_rows;
    s->results = s->slots + s->chunk * 2 * (size_t)s->nlocal;
    *out = s;
    return CFX_OK;
}

/* One barrier per round: rank r writes its words into row [round % 2][r], and after the barrier
 * every rank ANDs all rows of that parity. A row is rewritten two rounds later, and a rank can only
 * get there once every rank has passed the next round's barrier, so after it read this round's
 * rows. A late peer is waited for by yielding for at most AND_YIELD_S, then on the futex: idle
 * heartbeat rounds come every cycle time or less often, and their ranks arrive close together. */
#define AND_YIELD_S 200e-6
cfx_status cx_shm_allreduce_and(cx_shm *s, uint64_t *words, size_t count, bool *done)
{
    *done = count <= CX_SHM_AND_MAX_WORDS;
    if (!*done)
        return CFX_OK;
    size_t row = CX_SHM_AND_MAX_WORDS, half = (size_t)s->nlocal * row;
    uint64_t *rows = s->and_rows + (size_t)(s->and_rounds++ & 1) * half;
    memcpy(rows + (size_t)s->me * row, words, count * sizeof *words);
    cfx_status st = barrier_yielding(s, AND_YIELD_S);
    for (int q = 0; q < s->nlocal && !st; q++) {
        const uint64_t *peer = rows + (size_t)q * row;
        if (q != s->me)
            for (size_t i = 0; i < count; i++)
                words[i] &= peer[i];
    }
    return st;
}

int cx_shm_direct_state(const cx_shm *s, const char **why)
{
    *why = s->direct_off;
    return s->direct == DIRECT_READY ? 1 : s->direct == DIRECT_OFF ? -1 : 0;
}

static void unmap_peer_pools(cx_shm *s)
{
    for (int q = 0; s->peer_pools && q < s->nlocal; q++)
        if (s->peer_pools[q])
            munmap(s->peer_pools[q], (size_t)s->peer_sizes[q]);
    free(s->peer_pools);
    free(s->peer_sizes);
    free(s->strip);
    free(s->piece);
    s->peer_pools = NULL;
    s->peer_sizes = NULL;
    s->strip = NULL;
    s->piece = NULL;
}

/* Maps every peer's pool from the offers (after a barrier at which all offered), then agrees
 * with the peers over the segment: ready only if every rank mapped all; otherwise off for good,
 * with the reason kept for the log, and the batch takes the copies. */
static cfx_status setup_direct(cx_shm *s)
{
    cfx_status st = CFX_OK;
    s->peer_pools = calloc((size_t)s->nlocal, sizeof *s->peer_pools);
    s->peer_sizes = calloc((size_t)s->nlocal, sizeof *s->peer_sizes);
    s->strip = aligned_alloc(CACHE_LINE, OWN_STRIP_BYTES);
    s->piece = aligned_alloc(CACHE_LINE, 2 * s->chunk);
    if (!s->peer_pools || !s->peer_sizes || !s->strip || !s->piece)
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the direct path");
    if (!st && s->me < 64 && ((s->direct_map_fail >> s->me) & 1)) /* tests: this rank cannot map */
        st = cx_fail(CFX_ERR_TRANSPORT, "CFX_TEST_DIRECT_MAP_FAIL=%d", s->me);
    for (int q = 0; q < s->nlocal && !st; q++) {
        if (q == s->me)
            continue;
        st = cx_pool_map_peer(&s->offers[q].pool, (void **)&s->peer_pools[q]);
        if (!st)
            s->peer_sizes[q] = s->offers[q].pool.size;
    }
    if (st)
        snprintf(s->direct_off, sizeof s->direct_off, "%s", cx_error_message());
    s->offers[s->me].mapped = st ? 2 : 1;
    cfx_status lost = barrier(s);
    if (lost) {
        unmap_peer_pools(s);
        return lost;
    }
    int failed = -1;
    for (int q = 0; q < s->nlocal; q++)
        if (s->offers[q].mapped != 1 && failed < 0)
            failed = q;
    s->direct = failed < 0 ? DIRECT_READY : DIRECT_OFF;
    if (failed >= 0) {
        unmap_peer_pools(s);
        if (!st)
            snprintf(s->direct_off, sizeof s->direct_off, "local rank %d could not map the other "
                     "ranks' shared tensor memory", failed);
    }
    return CFX_OK;
}

cfx_status cx_shm_failure(const cx_shm *s) { return s->failed; }

void cx_shm_destroy(cx_shm *s)
{
    if (!s)
        return;
    unmap_peer_pools(s);
    munmap(s->base, s->size);
    free(s->wire16);
    free(s);
}

/* Element offset of block `i` of n elements over `parts`, rounded to 16 elements so every block
 * starts cache-aligned for the vector loops. */
static size_t block_start(size_t n, int parts, int i)
{
    size_t b = cx_split_start(n, parts, i);
    return i == parts ? n : (b / 16 * 16 < n ? b / 16 * 16 : n);
}

/* A position in a segment list, advanced as chunks are copied in or out. */
typedef struct cursor {
    size_t seg, pos; /* segment index, elements consumed within it */
} cursor;

/* What to do with each stretch (the part of a chunk inside one segment) of a walk. */
typedef enum { WALK_SKIP, WALK_COPY_IN, WALK_COPY_OUT, WALK_REDUCE_OWN } walk_kind;
typedef struct walk_op {
    walk_kind kind;
    uint8_t *buf;           /* COPY_IN: destination; COPY_OUT: source; REDUCE_OWN: the result */
    const uint8_t *other;   /* REDUCE_OWN: NULL: res (op)= own; else res = other (op) own, or
                             * own (op) other with own_first */
    bool own_first;
    cfx_dtype dtype;
    cfx_reduce_op op;
    double factor;          /* COPY_IN: prescale; COPY_OUT: postscale */
} walk_op;

/* Applies `w` to the next `count` elements of the segments, stretch by stretch, and advances the
 * cursor past them. A joined rank's missing source reads as the op's identity; a missing
 * destination is skipped. */
static void walk(const cx_segment *segs, cursor *c, size_t count, const walk_op *w)
{
    size_t esize = cfx_dtype_size(w->dtype), at = 0;
    while (count) {
        const cx_segment *g = &segs[c->seg];
        size_t n = g->count - c->pos < count ? g->count - c->pos : count;
        const uint8_t *src = g->src ? (const uint8_t *)g->src + c->pos * esize : NULL;
        uint8_t *dst = g->dst ? (uint8_t *)g->dst + c->pos * esize : NULL;
        uint8_t *buf = w->buf + at * esize;
        switch (w->kind) {
        case WALK_SKIP:
            break;
        case WALK_COPY_IN:
            if (src)
                cx_scale_copy(buf, src, n, w->dtype, w->factor);
            else
                cx_fill_identity(buf, n, w->dtype, w->op);
            break;
        case WALK_COPY_OUT:
            if (dst)
                cx_scale_copy(dst, buf, n, w->dtype, w->factor);
            break;
        case WALK_REDUCE_OWN: /* only where every source is present (not staged) */
            if (!w->other)
                cx_reduce_into(buf, src, n, w->dtype, w->op);
            else if (w->own_first)
                cx_reduce3(buf, src, w->other + at * esize, n, w->dtype, w->op);
            else
                cx_reduce3(buf, w->other + at * esize, src, n, w->dtype, w->op);
            break;
        }
        at += n;
        count -= n;
        if ((c->pos += n) == g->count) {
            c->seg++;
            c->pos = 0;
        }
    }
}

/* Reduces this rank's block (elements [lo, lo + count) of chunk buffer k) into res, combining the
 * local ranks in rank order: the peers' copies from their slots, this rank's own from its slot
 * when staged, else straight from its tensors (cursor `own`). */
static void reduce_own_block(cx_shm *s, int k, const cx_segment *segs, cursor own, bool staged,
                             size_t lo, size_t count, uint8_t *res, cfx_dtype dtype, cfx_reduce_op op)
{
    size_t b = lo * cfx_dtype_size(dtype);
    const uint8_t *in[2]; /* local ranks 0 and 1 (there are always two or more) */
    for (int q = 0; q < 2; q++)
        in[q] = q == s->me && !staged ? NULL : slot(s, k, q) + b;
    walk_op w = {WALK_REDUCE_OWN, res, in[0] ? in[0] : in[1], !in[0], dtype, op, 1.0};
    if (in[0] && in[1]) {
        cx_reduce3(res, in[0], in[1], count, dtype, op);
    } else {
        cursor c = own;
        walk(segs, &c, count, &w);
    }
    for (int q = 2; q < s->nlocal; q++) {
        if (q == s->me && !staged) {
            cursor c = own;
            w.other = NULL;
            walk(segs, &c, count, &w);
        } else {
            cx_reduce_into(res, slot(s, k, q) + b, count, dtype, op);
        }
    }
}

/* Copies the elements of chunk buffer k (`count` of them, this rank's block [lo, hi)) from the
 * tensors at cursor `c` into this rank's slot: all but the own block, which goes too when
 * staged; `*own` gets the cursor at the own block. With `skip` nothing is copied and the cursors
 * just move on. */
static void copy_in_chunk(cx_shm *s, int k, const cx_segment *segs, cursor *c, cursor *own,
                          size_t count, size_t lo, size_t hi, bool stage_own, bool skip,
                          cfx_dtype dtype, cfx_reduce_op op, double prescale)
{
    size_t esize = cfx_dtype_size(dtype);
    walk_op copy = {WALK_COPY_IN, slot(s, k, s->me), NULL, false, dtype, op, prescale};
    walk_op pass = {WALK_SKIP, copy.buf, NULL, false, dtype, op, 1.0};
    walk(segs, c, lo, skip ? &pass : &copy);
    *own = *c;
    copy.buf += lo * esize;
    walk(segs, c, hi - lo, skip || !stage_own ? &pass : &copy);
    copy.buf += (hi - lo) * esize;
    walk(segs, c, count - hi, skip ? &pass : &copy);
}

/* Writes this rank's offer for the direct path (every tensor of the batch, input and output, in
 * its shared pool, and nothing to prescale) and returns it. */
static bool offer_direct(cx_shm *s, const cx_segment *segs, size_t nsegs, size_t esize,
                         double prescale)
{
    direct_offer *o = &s->offers[s->me];
    bool ok = prescale == 1.0 && nsegs <= DIRECT_MAX_SEGS;
    for (size_t i = 0; i < nsegs && ok; i++) {
        size_t bytes = segs[i].count * esize;
        o->at[i].src = o->at[i].dst = 0;
        o->at[i].count = segs[i].count;
        if (bytes)
            ok = segs[i].src && segs[i].dst && cx_pool_offset(segs[i].src, bytes, &o->at[i].src) &&
                 cx_pool_offset(segs[i].dst, bytes, &o->at[i].dst);
    }
    if (ok && !s->exported) /* the pool exists: the tensors are in it */
        s->exported = cx_pool_get_export(&o->pool) == CFX_OK;
    ok = ok && s->exported;
    o->nsegs = (uint32_t)(ok ? nsegs : 0);
    o->ok = ok;
    return ok;
}

/* Whether every local rank's offer cut the batch into the same segments as local rank 0's (each
 * rank reads the same offers, so all decide alike). */
static bool same_cuts(const cx_shm *s)
{
    const direct_offer *first = &s->offers[0];
    for (int q = 1; q < s->nlocal; q++) {
        const direct_offer *o = &s->offers[q];
        if (o->nsegs != first->nsegs)
            return false;
        for (uint32_t i = 0; i < o->nsegs; i++)
            if (o->at[i].count != first->at[i].count)
                return false;
    }
    return true;
}

/* A position in the batch for the direct path: segment `seg` holds elements [start, start +
 * count); it only moves forward. */
typedef struct batch_pos {
    size_t seg, start;
} batch_pos;

/* Rank q's tensor at element `at` of the batch (input or output), through its pool as mapped here
 * for a peer. Stretches never cross a segment: see direct_stretch. */
static uint8_t *direct_at(const cx_shm *s, const cx_segment *segs, const batch_pos *p, int q,
                          bool output, size_t at, size_t esize)
{
    size_t pos = (at - p->start) * esize;
    if (q == s->me)
        return (output ? (uint8_t *)segs[p->seg].dst : (uint8_t *)segs[p->seg].src) + pos;
    const direct_offer *o = &s->offers[q];
    return s->peer_pools[q] + (output ? o->at[p->seg].dst : o->at[p->seg].src) + pos;
}

/* Moves `p` to the segment holding element `at` and returns how many elements from `at` on stay
 * in it, at most `limit`. */
static size_t direct_stretch(const cx_segment *segs, batch_pos *p, size_t at, size_t limit)
{
    while (p->start + segs[p->seg].count <= at)
        p->start += segs[p->seg++].count;
    size_t m = p->start + segs[p->seg].count - at;
    return m < limit ? m : limit;
}

/* Reduces elements [lo, hi) of the batch over every local rank, in local-rank order (as the copy
 * path does), straight from their tensors into `buf`; `*p` moves along. */
static void direct_reduce(const cx_shm *s, const cx_segment *segs, batch_pos *p, size_t lo,
                          size_t hi, uint8_t *buf, cfx_dtype dtype, cfx_reduce_op op)
{
    size_t esize = cfx_dtype_size(dtype);
    for (size_t at = lo, m; at < hi; at += m, buf += m * esize) {
        m = direct_stretch(segs, p, at, hi - at);
        cx_reduce3(buf, direct_at(s, segs, p, 0, false, at, esize),
                   direct_at(s, segs, p, 1, false, at, esize), m, dtype, op);
        for (int q = 2; q < s->nlocal; q++)
            cx_reduce_into(buf, direct_at(s, segs, p, q, false, at, esize), m, dtype, op);
    }
}

/* Writes `buf` (elements [lo, hi) of the result), scaled by postscale, into every local rank's
 * output; `*p` moves along. */
static void direct_write(const cx_shm *s, const cx_segment *segs, batch_pos *p, size_t lo,
                         size_t hi, const uint8_t *buf, cfx_dtype dtype, double postscale)
{
    size_t esize = cfx_dtype_size(dtype);
    for (size_t at = lo, m; at < hi; at += m, buf += m * esize) {
        m = direct_stretch(segs, p, at, hi - at);
        for (int q = 0; q < s->nlocal; q++)
            cx_scale_copy(direct_at(s, segs, p, q, true, at, esize), buf, m, dtype, postscale);
    }
}

/* The cross-host leg of this rank's block (`count` elements of `buf`, in place): in the tensor's
 * dtype, or with `wire` >= 0 packed into that 16-bit dtype, combined over the hosts in float32
 * and rounded once (exec/combine16.h), and unpacked. The block is chunk-sized and was just
 * reduced, so both conversions run on cache-resident data. */
static cfx_status cross_leg(cx_shm *s, cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                            cfx_reduce_op op, int wire, void *residual)
{
    if (wire < 0)
        return t->ops->cross_allreduce(t, buf, count, dtype, op);
    /* A block holds at most a chunk of 4-byte elements. */
    size_t bytes = cx_combine16_bytes(s->chunk / 4 + 1, t->cross_size);
    if (!s->wire16 && !(s->wire16 = malloc(bytes)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a compressed block (%zu bytes)",
                       bytes);
    cx_compress_pack(s->wire16, buf, residual, count, dtype, (cfx_dtype)wire, 1.0);
    cfx_status st = cx_combine16(t, CX_GROUP_CROSS, s->wire16, count, (cfx_dtype)wire, op);
    if (!st)
        cx_compress_unpack(buf, s->wire16, count, dtype, (cfx_dtype)wire, 1.0);
    return st;
}

/* A posted block's result, written into every local rank's output. */
static cfx_status direct_wait_write(cx_shm *s, cx_transport *t, const cx_segment *segs,
                                   batch_pos *wr, size_t lo, size_t hi, const uint8_t *piece,
                                   cfx_dtype dtype, double postscale)
{
    cfx_status st = t->ops->cross_allreduce_wait(t);
    if (!st)
        direct_write(s, segs, wr, lo, hi, piece, dtype, postscale);
    return st;
}

/* The direct path across hosts: block i of each chunk is reduced into private scratch,
 * allreduced across hosts, then written into every local rank's output. Where the transport can
 * post the cross-host call and the block crosses uncompressed, chunk k+1 is reduced while chunk k
 * crosses, so the link does not wait for the reduction: the blocks alternate between the two
 * halves of `piece`, and the writes follow in chunk order. */
static cfx_status direct_across_hosts(cx_shm *s, cx_transport *t, const cx_segment *segs,
                                      size_t n, cfx_dtype dtype, cfx_reduce_op op,
                                      double postscale, int wire, uint8_t *residual)
{
    bool pipelined = wire < 0 && cx_transport_has(t, CX_TRANSPORT_CROSS_PIPELINE);
    size_t esize = cfx_dtype_size(dtype), per_chunk = s->chunk / esize;
    batch_pos rd = {0, 0}, wr = {0, 0}; /* where the reads and the writes have got to */
    size_t lo[2] = {0, 0}, hi[2] = {0, 0};
    bool crossing = false; /* the other half's chunk is under way */
    int k = 0;
    cfx_status st = CFX_OK;
    for (size_t off = 0; off < n; off += per_chunk, k ^= 1) {
        size_t count = n - off < per_chunk ? n - off : per_chunk;
        lo[k] = off + block_start(count, s->nlocal, s->me);
        hi[k] = off + block_start(count, s->nlocal, s->me + 1);
        uint8_t *piece = s->piece + (size_t)k * s->chunk;
        direct_reduce(s, segs, &rd, lo[k], hi[k], piece, dtype, op);
        /* Ranks with an empty block still call, so the cross group's calls match. */
        if (!pipelined) {
            if ((st = cross_leg(s, t, piece, hi[k] - lo[k], dtype, op, wire,
                                residual ? residual + lo[k] * esize : NULL)))
                return st;
            direct_write(s, segs, &wr, lo[k], hi[k], piece, dtype, postscale);
            continue;
        }
        if ((st = t->ops->cross_allreduce_post(t, piece, hi[k] - lo[k], dtype, op)))
            return st;
        int other = k ^ 1;
        if (crossing && (st = direct_wait_write(s, t, segs, &wr, lo[other], hi[other],
                                                s->piece + (size_t)other * s->chunk, dtype,
                                                postscale)))
            return st;
        crossing = true;
    }
    int last = k ^ 1; /* the half written last */
    return crossing ? direct_wait_write(s, t, segs, &wr, lo[last], hi[last],
                                        s->piece + (size_t)last * s->chunk, dtype, postscale)
                    : CFX_OK;
}

/* The direct path: every local rank's tensors are in its pool, so nothing is copied in or out.
 * On one host, local rank i reduces block i of the whole batch in L1-sized strips, each written
 * into every rank's output right after its reduction. Across hosts (hierarchical), the work keeps
 * the copy path's chunks and blocks, so every local rank makes exactly the cross-host calls the
 * copy path makes and each host may take either path: block i of each chunk is reduced into
 * private scratch, allreduced across hosts, then written into every local rank's output. (Not the
 * shared result area: with no barrier per chunk, a rank's block of a short last chunk would
 * overlap a slower rank's block of a full one.) Every element has one reader and one writer, so
 * the only barrier is the one at the end. */
static cfx_status direct_allreduce(cx_shm *s, cx_transport *t, const cx_segment *segs, size_t n,
                                   cfx_dtype dtype, cfx_reduce_op op, double postscale,
                                   bool hierarchical, int wire, uint8_t *residual)
{
    size_t esize = cfx_dtype_size(dtype);
    batch_pos rd = {0, 0}, wr = {0, 0}; /* where the reads and the writes have got to */
    cfx_status st = CFX_OK;
    if (!hierarchical) {
        size_t lo = block_start(n, s->nlocal, s->me), hi = block_start(n, s->nlocal, s->me + 1);
        for (size_t a = lo, strip = OWN_STRIP_BYTES / esize; a < hi; a += strip) {
            size_t e = hi - a < strip ? hi : a + strip;
            direct_reduce(s, segs, &rd, a, e, s->strip, dtype, op);
            direct_write(s, segs, &wr, a, e, s->strip, dtype, postscale);
        }
    } else {
        st = direct_across_hosts(s, t, segs, n, dtype, op, postscale, wire, residual);
    }
    cfx_status lost = barrier(s);
    return st ? st : lost;
}

/* What the copy path still owes a chunk once its block is reduced: where this rank's block
 * goes in its outputs, the chunk's block bounds, and its results. */
typedef struct chunk_tail {
    cursor own_out;
    size_t lo, hi, count;
    uint8_t *res;
} chunk_tail;

/* Copies the other ranks' blocks of a chunk out of the results into the tensors; every rank
 * must have passed a barrier after writing its block. `out` is the output cursor of the whole
 * batch; `out_op` the copy out, its buf set here. */
static void copy_out_others(const cx_segment *segs, cursor *out, const chunk_tail *c,
                            walk_op *out_op)
{
    size_t esize = cfx_dtype_size(out_op->dtype);
    out_op->buf = c->res;
    walk(segs, out, c->lo, out_op);
    walk_op skip_out = {WALK_SKIP, c->res, NULL, false, out_op->dtype, out_op->op, 1.0};
    walk(segs, out, c->hi - c->lo, &skip_out);
    out_op->buf = c->res + c->hi * esize;
    walk(segs, out, c->count - c->hi, out_op);
}

/* Copies this rank's block of a chunk out of the results into the tensors. */
static void copy_out_own(const cx_segment *segs, chunk_tail *c, walk_op *out_op)
{
    out_op->buf = c->res + c->lo * cfx_dtype_size(out_op->dtype);
    walk(segs, &c->own_out, c->hi - c->lo, out_op);
}

/* The end of a chunk on the copy path whose own block is out: the barrier after which every
 * block is in the results, and the other blocks out. */
static cfx_status finish_chunk(cx_shm *s, const cx_segment *segs, cursor *out, chunk_tail *c,
                               walk_op *out_op)
{
    cfx_status st = barrier(s);
    if (!st)
        copy_out_others(segs, out, c, out_op);
    return st;
}

/* finish_chunk for a chunk whose block was posted across hosts: its result, and the own block
 * out, first. */
static cfx_status finish_posted(cx_shm *s, cx_transport *t, const cx_segment *segs, cursor *out,
                                chunk_tail *c, walk_op *out_op)
{
    cfx_status st = t->ops->cross_allreduce_wait(t);
    if (st)
        return st;
    copy_out_own(segs, c, out_op);
    return finish_chunk(s, segs, out, c, out_op);
}

/* Round `off` (bytes into every block) of cx_shm_allgather_blocks: where local rank q's part of
 * it starts in the buffer, and its length (0 once q's block is done). */
static size_t gather_part(const cx_shm *s, int q, size_t count, size_t esize, size_t off,
                          size_t *at)
{
    size_t lo = cx_split_start(count, s->nlocal, q) * esize;
    size_t len = cx_split_start(count, s->nlocal, q + 1) * esize - lo;
    *at = lo + off;
    return off < len ? (len - off < s->chunk ? len - off : s->chunk) : 0;
}

cfx_status cx_shm_allgather_blocks(cx_shm *s, void *buf, size_t count, size_t esize)
{
    uint8_t *b = buf;
    size_t widest = (count + (size_t)s->nlocal - 1) / (size_t)s->nlocal; /* cx_split's largest */
    size_t rounds = (widest * esize + s->chunk - 1) / s->chunk, at;
    int k = 0;
    for (size_t r = 0; r < rounds; r++, k ^= 1) {
        size_t off = r * s->chunk, part = gather_part(s, s->me, count, esize, off, &at);
        if (part)
            memcpy(slot(s, k, s->me), b + at, part);
        cfx_status st = barrier(s);
        if (st)
            return st;
        for (int q = 0; q < s->nlocal; q++)
            if (q != s->me && (part = gather_part(s, q, count, esize, off, &at)))
                memcpy(b + at, slot(s, k, q), part);
    }
    /* A slot is rewritten (by the next round, or the next collective) only after a barrier that
     * every reader passed after reading it: the rounds alternate the slots, and this last one
     * covers both. */
    return rounds ? barrier(s) : CFX_OK;
}

cfx_status cx_shm_allreduce(cx_shm *s, cx_transport *t, const cx_segment *segs, size_t nsegs,
                            cfx_dtype dtype, cfx_reduce_op op, double prescale, double postscale,
                            bool hierarchical)
{
    return cx_shm_allreduce_wire(s, t, segs, nsegs, dtype, op, prescale, postscale, hierarchical,
                                 -1, NULL);
}

cfx_status cx_shm_allreduce_wire(cx_shm *s, cx_transport *t, const cx_segment *segs,
                                 size_t nsegs, cfx_dtype dtype, cfx_reduce_op op, double prescale,
                                 double postscale, bool hierarchical, int wire, void *residual)
{
    size_t esize = cfx_dtype_size(dtype);
    size_t per_chunk = s->chunk / esize;
    size_t n = 0;
    for (size_t i = 0; i < nsegs; i++)
        n += segs[i].count;
    /* This rank's own block is read where it lies, unless it must be scaled or a joined rank's
     * identity stands in for it: then it is staged in the rank's own slot like the rest. */
    bool stage_own = prescale != 1.0;
    for (size_t i = 0; i < nsegs && !stage_own; i++)
        stage_own = segs[i].count && !segs[i].src;
    cursor in = {0, 0}, out = {0, 0};
    /* Skip leading empty segments so the cursors never stand on one. */
    while (in.seg < nsegs && segs[in.seg].count == 0)
        in.seg++;
    out = in;
    /* A rank offering the direct path skips the first chunk's copy in; if the offer is not taken
     * it copies in after the barrier, and one more barrier follows. Every rank reads the same
     * offers, so all take the same path. */
    bool offers = n && s->direct != DIRECT_OFF; /* the same on every rank */
    bool offered = offers && offer_direct(s, segs, nsegs, esize, prescale);
    bool pipelined = hierarchical && wire < 0 &&
                     cx_transport_has(t, CX_TRANSPORT_CROSS_PIPELINE);
    /* The last chunk, when `pending`: posted across hosts (`pipelined`), or with its results in
     * once every rank passed the next barrier. */
    chunk_tail prev = {{0, 0}, 0, 0, 0, NULL};
    bool pending = false;
    int k = 0;
    for (size_t off = 0; off < n; off += per_chunk, k ^= 1) {
        size_t count = n - off < per_chunk ? n - off : per_chunk;
        size_t lo = block_start(count, s->nlocal, s->me);
        size_t hi = block_start(count, s->nlocal, s->me + 1);
        cursor in_first = in, own;
        copy_in_chunk(s, k, segs, &in, &own, count, lo, hi, stage_own, off == 0 && offered, dtype,
                      op, prescale);
        cfx_status st = barrier(s);
        if (st)
            return st;
        if (off == 0 && offers) {
            int takers = 0;
            for (int q = 0; q < s->nlocal; q++)
                takers += s->offers[q].ok != 0;
            bool all_take = takers == s->nlocal && same_cuts(s);
            if (all_take && s->direct == DIRECT_UNTRIED && (st = setup_direct(s)))
                return st;
            if (all_take && s->direct == DIRECT_READY)
                return direct_allreduce(s, t, segs, n, dtype, op, postscale, hierarchical,
                                        wire, residual);
            if (takers) { /* some ranks skipped their copy in */
                if (offered)
                    copy_in_chunk(s, k, segs, &in_first, &own, count, lo, hi, stage_own, false,
                                  dtype, op, prescale);
                if ((st = barrier(s)))
                    return st;
            }
        }
        walk_op out_op = {WALK_COPY_OUT, NULL, NULL, false, dtype, op, postscale};
        /* Every rank wrote its block of the last chunk before this barrier. */
        if (pending && !pipelined)
            copy_out_others(segs, &out, &prev, &out_op);
        uint8_t *res = s->results + (size_t)k * s->chunk;
        /* The own block goes out before the next barrier (no peer reads this rank's tensors,
         * only its slot): one strip at a time, right after its reduction, while it is in L1.
         * Hierarchical mode copies it out after the cross-host step. */
        chunk_tail cur = {own, lo, hi, count, res};
        size_t strip = hierarchical ? hi - lo : OWN_STRIP_BYTES / esize;
        for (size_t a = lo; a < hi; a += strip) {
            size_t m = hi - a < strip ? hi - a : strip;
            reduce_own_block(s, k, segs, own, stage_own, a, m, res + a * esize, dtype, op);
            walk_op step = {WALK_SKIP, res, NULL, false, dtype, op, 1.0};
            walk(segs, &own, m, &step); /* `own` follows the strips */
            if (!hierarchical) {
                out_op.buf = res + a * esize;
                walk(segs, &cur.own_out, m, &out_op);
            }
        }
        if (pipelined) {
            /* This chunk crosses while the last one is finished; the next is copied in and
             * reduced (the slots and results alternate, and each barrier keeps a slot from being
             * rewritten before every rank read it). */
            st = t->ops->cross_allreduce_post(t, res + lo * esize, hi - lo, dtype, op);
            if (!st && pending)
                st = finish_posted(s, t, segs, &out, &prev, &out_op);
        } else if (hierarchical) {
            /* Every local rank sends its own block across hosts: all links work at once. Ranks
             * with an empty block still call, so the cross communicator's calls match. */
            void *own_residual = residual ? (uint8_t *)residual + (off + lo) * esize : NULL;
            st = cross_leg(s, t, res + lo * esize, hi - lo, dtype, op, wire, own_residual);
            if (!st)
                copy_out_own(segs, &cur, &out_op);
        }
        if (st)
            return st;
        /* Not posted, one barrier a chunk: the next chunk's, after its copy in, also says that
         * this chunk's results are in. The slots and results alternate: the next copy in writes
         * the other slot, and this chunk's slot and result are rewritten only after the barrier
         * after next, which every rank passes only once it has read them. (A posted chunk's
         * result comes in only after the next barrier, hence its own one.) */
        prev = cur;
        pending = true;
    }
    if (!pending)
        return CFX_OK;
    walk_op out_op = {WALK_COPY_OUT, prev.res, NULL, false, dtype, op, postscale};
    return pipelined ? finish_posted(s, t, segs, &out, &prev, &out_op)
                     : finish_chunk(s, segs, &out, &prev, &out_op);
}
