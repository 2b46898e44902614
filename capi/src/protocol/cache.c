/* cache - the response cache with identical bit assignments on every rank (see cache.h). */
#include "protocol/cache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"

cfx_status cx_cache_init(cx_cache *c, size_t capacity)
{
    memset(c, 0, sizeof *c);
    cx_strmap_init(&c->by_name);
    c->capacity = capacity;
    if (capacity && !(c->entries = calloc(capacity, sizeof *c->entries)))
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a response cache of %zu entries",
                       capacity);
    return CFX_OK;
}

void cx_cache_destroy(cx_cache *c)
{
    for (size_t i = 0; i < c->nbits; i++)
        if (c->entries[i].in_use)
            cx_response_free(&c->entries[i].response);
    free(c->entries);
    cx_strmap_destroy(&c->by_name);
    memset(c, 0, sizeof *c);
}

static bool same_params(const cx_response *r, const cx_request *q)
{
    if (r->coll != q->coll || r->dtype != q->dtype || !cx_same_device_kind(r->device, q->device) ||
        r->ndim != q->ndim || r->group_size != q->group_size)
        return false;
    if (r->coll == CX_ALLREDUCE || r->coll == CX_REDUCESCATTER) {
        if (r->op != q->op || r->prescale != q->prescale || r->postscale != q->postscale ||
            r->compression != q->compression)
            return false;
    }
    if (r->coll == CX_BROADCAST && r->root != q->root)
        return false;
    /* allgather/alltoall: dim 0 may differ per rank; the cached response holds rank 0's. The
     * rows of allgather are part of the response, so they must still match for this rank. */
    int32_t first = (r->coll == CX_ALLGATHER || r->coll == CX_ALLTOALL) ? 1 : 0;
    for (int32_t i = first; i < r->ndim; i++)
        if (r->shape[i] != q->shape[i])
            return false;
    return true;
}

cx_cache_result cx_cache_lookup(const cx_cache *c, const cx_request *req, size_t *bit)
{
    if (c->capacity == 0)
        return CX_CACHE_MISS;
    uintptr_t v = (uintptr_t)cx_strmap_get(&c->by_name, req->name);
    if (v == 0)
        return CX_CACHE_MISS;
    *bit = v - 1;
    return same_params(&c->entries[*bit].response, req) ? CX_CACHE_HIT : CX_CACHE_INVALID;
}

bool cx_cache_cacheable(const cx_response *r)
{
    /* Allgather rows of other ranks change freely. Grouped members are not cached one by one:
     * an eviction could leave part of a group cached and part negotiated, and the coordinator
     * would wait for ever for the cached members to complete the group. */
    return r->status == CFX_OK && r->coll != CX_BARRIER && r->coll != CX_JOIN &&
           r->coll != CX_ALLGATHER && r->group_size <= 1;
}

static size_t pick_slot(cx_cache *c)
{
    if (c->nbits < c->capacity)
        return c->nbits++;
    size_t victim = 0;
    for (size_t i = 0; i < c->nbits; i++) {
        if (!c->entries[i].in_use)
            return i;
        if (c->entries[i].last_used < c->entries[victim].last_used)
            victim = i;
    }
    return victim;
}

bool cx_cache_put(cx_cache *c, const cx_response *r, size_t *bit, size_t *evicted)
{
    *evicted = SIZE_MAX;
    if (c->capacity == 0)
        return false;
    cx_response copy;
    if (!cx_response_copy(&copy, r))
        return false;
    uintptr_t v = (uintptr_t)cx_strmap_get(&c->by_name, r->name);
    size_t b;
    if (v) {
        b = v - 1;
    } else {
        b = pick_slot(c);
        if (!cx_strmap_put(&c->by_name, r->name, (void *)(uintptr_t)(b + 1))) {
            cx_response_free(&copy);
            return false;
        }
    }
    cx_cache_entry *e = &c->entries[b];
    if (e->in_use) {
        *evicted = b;
        if (strcmp(e->response.name, r->name) != 0)
            cx_strmap_remove(&c->by_name, e->response.name);
        cx_response_free(&e->response);
    }
    e->in_use = true;
    e->response = copy;
    e->last_used = ++c->clock;
    *bit = b;
    return true;
}

void cx_cache_erase(cx_cache *c, size_t bit)
{
    if (bit >= c->nbits || !c->entries[bit].in_use)
        return;
    cx_cache_entry *e = &c->entries[bit];
    cx_strmap_remove(&c->by_name, e->response.name);
    cx_response_free(&e->response);
    e->in_use = false;
}

void cx_cache_touch(cx_cache *c, size_t bit)
{
    if (bit < c->nbits && c->entries[bit].in_use)
        c->entries[bit].last_used = ++c->clock;
}

const cx_response *cx_cache_get(const cx_cache *c, size_t bit)
{
    return (bit < c->nbits && c->entries[bit].in_use) ? &c->entries[bit].response : NULL;
}
