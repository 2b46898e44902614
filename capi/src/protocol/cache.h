/*
 * cache - the response cache: tensors negotiated before with the same parameters skip the
 * coordinator.
 *
 * Each cached response owns a bit. In steady state a cycle needs only one AND-allreduce of a bit
 * vector: a bit set on every rank means every rank submitted that tensor again with the same
 * parameters. The cache is only changed by operations every rank performs identically and in the
 * same order (puts after the broadcast response list, erasures of bits every rank learned are
 * invalid, touches in ascending bit order), so bit assignments stay identical on all ranks
 * without any extra communication. Least-recently-used entries are evicted when full.
 * Owned and used by the background thread alone.
 */
#ifndef CFX_CACHE_H
#define CFX_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/strmap.h"
#include "protocol/wire.h"

typedef struct cx_cache_entry {
    bool in_use;
    uint64_t last_used;
    cx_response response;
} cx_cache_entry;

typedef struct cx_cache {
    size_t capacity;
    size_t nbits;            /* bits ever assigned (highest + 1); vectors cover this many */
    cx_cache_entry *entries; /* capacity entries, indexed by bit */
    cx_strmap by_name;       /* name -> (bit + 1) as a pointer-sized integer */
    uint64_t clock;
    bool warned_eviction;
} cx_cache;

typedef enum cx_cache_result { CX_CACHE_MISS, CX_CACHE_HIT, CX_CACHE_INVALID } cx_cache_result;

cfx_status cx_cache_init(cx_cache *c, size_t capacity);
void cx_cache_destroy(cx_cache *c);

/* Classifies a request: HIT (same name and parameters; *bit set), INVALID (name cached with other
 * parameters; *bit set), MISS. */
cx_cache_result cx_cache_lookup(const cx_cache *c, const cx_request *req, size_t *bit);

/* Whether a response of this kind may be cached. */
bool cx_cache_cacheable(const cx_response *r);

/* Caches `r` (replacing an entry of the same name). *bit receives its bit; *evicted the bit whose
 * old entry was replaced or evicted (SIZE_MAX when none), so callers can fix up pending hits on it.
 * False when out of memory (the cache is then unchanged). */
bool cx_cache_put(cx_cache *c, const cx_response *r, size_t *bit, size_t *evicted);

void cx_cache_erase(cx_cache *c, size_t bit);
void cx_cache_touch(cx_cache *c, size_t bit);
const cx_response *cx_cache_get(const cx_cache *c, size_t bit);

#endif /* CFX_CACHE_H */
