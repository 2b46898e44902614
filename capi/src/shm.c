/* shm - the intra-node shared-memory allreduce (see shm.h). */
#include "shm.h"

#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "reduce.h"

#define CACHE_LINE 64

/* The segment's first page: the barrier, each on its own cache line. */
typedef struct shm_control {
    _Alignas(CACHE_LINE) atomic_uint_fast64_t arrived;
    _Alignas(CACHE_LINE) atomic_uint_fast64_t generation;
} shm_control;

struct cx_shm {
    int nlocal, me;
    size_t chunk;          /* bytes per slot */
    size_t size;           /* bytes mapped */
    uint8_t *base;
    shm_control *control;
    uint8_t *slots;        /* [2][nlocal][chunk] */
    uint8_t *results;      /* [2][chunk] */
    uint64_t generation;   /* this rank's view of the barrier generation */
};

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

static uint8_t *slot(cx_shm *s, int buffer, int rank)
{
    return s->slots + ((size_t)buffer * (size_t)s->nlocal + (size_t)rank) * s->chunk;
}

/* Waits for every local rank: spin briefly, then yield, then sleep (ranks may share cores). */
static void barrier(cx_shm *s)
{
    uint64_t gen = s->generation;
    if (atomic_fetch_add_explicit(&s->control->arrived, 1, memory_order_acq_rel) ==
        (uint64_t)s->nlocal - 1) {
        atomic_store_explicit(&s->control->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&s->control->generation, gen + 1, memory_order_release);
    } else {
        unsigned spins = 0;
        long sleep_ns = 1000;
        while (atomic_load_explicit(&s->control->generation, memory_order_acquire) == gen) {
            if (++spins < 256)
                continue;
            if (spins < 1024) {
                sched_yield();
                continue;
            }
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
            if (sleep_ns < 100000)
                sleep_ns *= 2;
        }
    }
    s->generation = gen + 1;
}

cfx_status cx_shm_create(cx_transport *t, size_t chunk_bytes, cx_shm **out)
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
    s->chunk = round_up(chunk_bytes, CACHE_LINE);
    size_t control = round_up(sizeof(shm_control), 4096);
    s->size = control + s->chunk * 2 * (size_t)s->nlocal + s->chunk * 2;
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
    s->slots = s->base + control;
    s->results = s->slots + s->chunk * 2 * (size_t)s->nlocal;
    *out = s;
    return CFX_OK;
}

void cx_shm_destroy(cx_shm *s)
{
    if (!s)
        return;
    munmap(s->base, s->size);
    free(s);
}

/* Element offset of block `i` of n elements over `parts`, rounded to 16 elements so every block
 * starts cache-aligned for the vector loops. */
static size_t block_start(size_t n, int parts, int i)
{
    size_t b = (size_t)((unsigned __int128)n * (unsigned)i / (unsigned)parts);
    return i == parts ? n : (b / 16 * 16 < n ? b / 16 * 16 : n);
}

/* A position in a segment list, advanced as chunks are copied in or out. */
typedef struct cursor {
    size_t seg, pos; /* segment index, elements consumed within it */
} cursor;

/* Copies the next `count` elements of the segments' sources into `to`, scaled. */
static void copy_in(const cx_segment *segs, cursor *c, size_t count, uint8_t *to, size_t esize,
                    cfx_dtype dtype, cfx_reduce_op op, double factor)
{
    while (count) {
        const cx_segment *g = &segs[c->seg];
        size_t n = g->count - c->pos < count ? g->count - c->pos : count;
        if (g->src)
            cx_scale_copy(to, (const uint8_t *)g->src + c->pos * esize, n, dtype, factor);
        else
            cx_fill_identity(to, n, dtype, op);
        to += n * esize;
        count -= n;
        if ((c->pos += n) == g->count) {
            c->seg++;
            c->pos = 0;
        }
    }
}

/* Copies `count` elements from `from` into the next stretch of the segments' destinations. */
static void copy_out(const cx_segment *segs, cursor *c, size_t count, const uint8_t *from,
                     size_t esize, cfx_dtype dtype, double factor)
{
    while (count) {
        const cx_segment *g = &segs[c->seg];
        size_t n = g->count - c->pos < count ? g->count - c->pos : count;
        if (g->dst)
            cx_scale_copy((uint8_t *)g->dst + c->pos * esize, from, n, dtype, factor);
        from += n * esize;
        count -= n;
        if ((c->pos += n) == g->count) {
            c->seg++;
            c->pos = 0;
        }
    }
}

cfx_status cx_shm_allreduce(cx_shm *s, cx_transport *t, const cx_segment *segs, size_t nsegs,
                            cfx_dtype dtype, cfx_reduce_op op, double prescale, double postscale,
                            bool hierarchical)
{
    size_t esize = cfx_dtype_size(dtype);
    size_t per_chunk = s->chunk / esize;
    size_t n = 0;
    for (size_t i = 0; i < nsegs; i++)
        n += segs[i].count;
    cursor in = {0, 0}, out = {0, 0};
    /* Skip leading empty segments so the cursors never stand on one. */
    while (in.seg < nsegs && segs[in.seg].count == 0)
        in.seg++;
    out = in;
    int k = 0;
    for (size_t off = 0; off < n; off += per_chunk, k ^= 1) {
        size_t count = n - off < per_chunk ? n - off : per_chunk;
        copy_in(segs, &in, count, slot(s, k, s->me), esize, dtype, op, prescale);
        barrier(s);
        size_t lo = block_start(count, s->nlocal, s->me);
        size_t hi = block_start(count, s->nlocal, s->me + 1);
        uint8_t *res = s->results + (size_t)k * s->chunk;
        if (hi > lo) {
            size_t b = lo * esize;
            if (s->nlocal == 1)
                memcpy(res + b, slot(s, k, 0) + b, (hi - lo) * esize);
            else
                cx_reduce3(res + b, slot(s, k, 0) + b, slot(s, k, 1) + b, hi - lo, dtype, op);
            for (int r = 2; r < s->nlocal; r++)
                cx_reduce_into(res + b, slot(s, k, r) + b, hi - lo, dtype, op);
        }
        if (hierarchical) {
            /* Every local rank sends its own block across hosts: all links work at once. Ranks
             * with an empty block still call, so the cross communicator's calls match. */
            cfx_status st = t->ops->cross_allreduce(t, res + lo * esize, hi - lo, dtype, op);
            if (st)
                return st;
        }
        barrier(s);
        copy_out(segs, &out, count, res, esize, dtype, postscale);
    }
    return CFX_OK;
}
