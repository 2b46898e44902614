/*
 * shm_segment - the host segment's layout and lifetime, private to the shared-memory path's files
 * (exec/shm_*.c; exec/shm.h is their interface): the control page and its barrier words, the
 * local ranks' member entries, their direct-path offers, the AND rows, the double-buffered slots
 * and results; mapping it at creation (an agreement over the transport: all or nobody) and
 * unmapping it, with the peers' pools the direct path mapped.
 *
 * What reads it: shm_barrier.c (the barrier, the peers' liveness, the one-host AND), shm_copy.c
 * (the copy path and the dispatch of a batch), shm_direct.c (the direct path), shm_cross.c (the
 * cross-host leg and the pipelined direct form), shm_gather.c (the allgather of blocks).
 */
#ifndef CFX_SHM_SEGMENT_H
#define CFX_SHM_SEGMENT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "base/split.h"
#include "exec/shared_pool.h"
#include "exec/shm.h"

#define CX_SHM_CACHE_LINE 64
#define CX_SHM_OWN_STRIP_BYTES (16u << 10) /* a strip of the own block: reduced, then copied out from L1 */

/* The segment's first page: the barrier, each word on its own cache line. */
typedef struct shm_control {
    _Alignas(CX_SHM_CACHE_LINE) atomic_uint arrived;
    _Alignas(CX_SHM_CACHE_LINE) atomic_uint generation; /* 32 bits: a futex word */
    atomic_uint sleepers;                        /* waiters in futex_wait */
} shm_control;

/* Each local rank's entry in the segment, on a cache line of its own: who it is, for the message
 * when it fails to arrive, and the barrier generations it has reached, so that a waiter past its
 * deadline can tell the late ranks from the others. */
typedef struct shm_member {
    _Alignas(CX_SHM_CACHE_LINE) atomic_uint reached;
    int32_t rank; /* in the transport */
    int32_t pid;  /* one host, one pid namespace: a peer's liveness is kill(pid, 0) and /proc */
} shm_member;

/* How often a waiter asleep at a barrier looks whether a late peer's process still exists: a dead
 * peer is named within this, a stopped or stuck one at the deadline. */
#define CX_SHM_LIVENESS_PERIOD_S 0.1

/* Each local rank's offer of a batch for the direct path: whether all of its tensors lie in its
 * shared pool, and where (offsets into the pool), segment by segment, with each segment's length
 * (a rank cuts its batch into segments by where its tensors lie, so the cuts must be checked to be
 * the same on every local rank before one rank reads another's segment i). Written before a batch's
 * first barrier, read by the peers right after it; the next batch rewrites it only after another
 * barrier, so no reader sees it change. */
#define CX_SHM_DIRECT_MAX_SEGS 4096
typedef struct direct_offer {
    uint32_t ok, nsegs;
    uint32_t mapped;        /* set up: 1 when this rank mapped every peer's pool, 2 when it could not */
    cx_pool_export pool;    /* where the peers map this rank's pool (written with the first offer) */
    struct { uint64_t src, dst, count; } at[CX_SHM_DIRECT_MAX_SEGS];
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
    uint8_t *strip;        /* CX_SHM_OWN_STRIP_BYTES of private scratch for the direct path */
    uint8_t *piece;        /* two chunks of private scratch: its hierarchical form's blocks */
    uint16_t *wire16;      /* made on first use: a compressed cross-host block and what its
                            * once-rounded combine needs (cx_combine16_bytes) */
    char direct_off[512];  /* why the direct path is off */
};

static inline uint8_t *cx_shm_slot(cx_shm *s, int buffer, int rank)
{
    return s->slots + ((size_t)buffer * (size_t)s->nlocal + (size_t)rank) * s->chunk;
}

/* Element offset of block `i` of n elements over `parts`, rounded to 16 elements so every block
 * starts cache-aligned for the vector loops. */
static inline size_t cx_shm_block_start(size_t n, int parts, int i)
{
    size_t b = cx_split_start(n, parts, i);
    return i == parts ? n : (b / 16 * 16 < n ? b / 16 * 16 : n);
}

/* Unmaps the peers' pools and frees the direct path's scratch (accepts what was never made). */
void cx_shm_unmap_peers(cx_shm *s);

#endif /* CFX_SHM_SEGMENT_H */
