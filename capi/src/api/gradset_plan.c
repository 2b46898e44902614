/*
 * gradset_plan (api) - a committed gradient set's layout (api/gradset_plan.h): buckets, owned
 * storage, residuals, and the items and queue entries the loop reduces.
 */
#include "api/gradset_plan.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/strmap.h"
#include "engine/context.h"
#include "exec/shared_pool.h"

/* The first bucket (the gradients backward produces first) holds at most 1 MiB, as DDP's does: it
 * goes out while backward is still in the last layers, so that the background thread's first batch
 * (an agreement, a pass over the direct path) overlaps with backward instead of waiting for the
 * first full bucket. When every gradient is ready at once, consecutive ready buckets run as one
 * batch (engine/gradset.c), so the cut costs nothing there. */
#define FIRST_BUCKET_BYTES ((size_t)1 << 20)

/* Item `i` of the set: one allreduce, in place, of `elements` elements at `data` (a bucket's block
 * or one gradient's buffer), with the set's op, scales and compression. */
static void set_item(cfx_gradset *s, size_t i, char *name, int32_t dtype, int32_t device,
                     size_t elements, void *data, size_t bytes)
{
    cx_response *it = &s->items[i];
    it->name = name; /* the set's item_names own it */
    it->coll = CX_ALLREDUCE;
    it->dtype = (uint8_t)dtype;
    it->op = (uint8_t)s->op;
    it->device = device;
    it->ndim = 1;
    it->shape[0] = (int64_t)elements;
    it->prescale = s->prescale;
    it->postscale = s->postscale;
    it->compression = s->compression;
    s->entries[i].input = s->entries[i].output = data;
    s->entries[i].bytes = bytes;
}

cfx_status cx_gradset_plan(cfx_gradset *s, const cx_gradset_reg *order, uint32_t count)
{
    cx_strmap local;
    cx_strmap_init(&local);
    for (int32_t i = 0; i < s->ngrads; i++)
        if (!cx_strmap_put(&local, s->grads[i].name, &s->grads[i])) {
            cx_strmap_destroy(&local);
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory planning '%s'", s->name);
        }
    /* Canonical order: rank 0's, reversed. canon[k] = this rank's gradient. */
    cx_grad **canon = malloc((count ? count : 1) * sizeof *canon);
    s->buckets = calloc(count ? count : 1, sizeof *s->buckets);
    if (!canon || !s->buckets) {
        free(canon);
        cx_strmap_destroy(&local);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory planning '%s'", s->name);
    }
    char key[CX_GRADSET_NAME_MAX + 1];
    for (uint32_t k = 0; k < count; k++) {
        const cx_gradset_reg *r = &order[count - 1 - k];
        memcpy(key, r->name, r->name_len);
        key[r->name_len] = '\0';
        canon[k] = cx_strmap_get(&local, key); /* validated: present */
    }
    cx_strmap_destroy(&local);
    /* Cut into buckets: the first at most FIRST_BUCKET_BYTES (bucket_bytes if smaller), the others
     * at most bucket_bytes. */
    int32_t nb = 0;
    size_t bytes = 0;
    size_t first_cap = (size_t)s->bucket_bytes < FIRST_BUCKET_BYTES ? (size_t)s->bucket_bytes
                                                                    : FIRST_BUCKET_BYTES;
    for (uint32_t k = 0; k < count; k++) {
        cx_grad *g = canon[k];
        cx_bucket *cur = nb ? &s->buckets[nb - 1] : NULL;
        size_t cap = nb == 1 ? first_cap : (size_t)s->bucket_bytes;
        bool fits = cur && cur->dtype == g->dtype && cur->device == g->device &&
                    bytes + g->bytes <= cap;
        if (!fits) {
            cur = &s->buckets[nb++];
            cur->dtype = g->dtype;
            cur->device = g->device;
            bytes = 0;
        }
        g->bucket = nb - 1;
        g->offset = bytes;
        bytes += g->bytes;
        cur->elements += g->elements;
        cur->bytes = bytes;
        cur->ngrads++;
    }
    s->nbuckets = nb;
    /* Items: owned, one per bucket (its block is one segment); borrowed, one per gradient; and
     * one per gradient for Adasum, whose dot products are per gradient (exec/adasum.h). */
    bool per_grad = !s->owned || s->op == CFX_OP_ADASUM;
    s->nitems = per_grad ? count : (size_t)nb;
    size_t ni = s->nitems ? s->nitems : 1;
    s->items = calloc(ni, sizeof *s->items);
    s->entries = calloc(ni, sizeof *s->entries);
    s->entry_ptrs = calloc(ni, sizeof *s->entry_ptrs);
    s->no_entries = calloc(ni, sizeof *s->no_entries);
    size_t name_len = strlen(s->name) + 24;
    s->item_names = calloc((size_t)(nb ? nb : 1), name_len);
    if (!s->items || !s->entries || !s->entry_ptrs || !s->no_entries || !s->item_names) {
        free(canon);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory planning '%s'", s->name);
    }
    /* Owned storage: one block, each bucket 64-byte aligned. */
    size_t total = 0;
    for (int32_t b = 0; b < nb; b++)
        total += (s->buckets[b].bytes + 63) & ~(size_t)63;
    cfx_status st = CFX_OK;
    if (s->owned && (st = cx_pool_alloc(total, s->ctx->cfg.shared_pool_bytes, &s->storage))) {
        free(canon);
        return st;
    }
    if (s->owned && total)
        memset(s->storage, 0, total);
    size_t residual_bytes = 0;
    for (int32_t b = 0; s->error_feedback && b < nb; b++)
        residual_bytes += s->buckets[b].bytes;
    if (s->error_feedback && !(s->residual = calloc(1, residual_bytes + 1))) {
        free(canon);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the residuals of gradient set "
                       "'%s' (%zu bytes)", s->name, residual_bytes);
    }
    residual_bytes = 0;
    size_t at = 0, item = 0;
    uint32_t k = 0;
    for (int32_t b = 0; b < nb; b++) {
        cx_bucket *bk = &s->buckets[b];
        char *bname = s->item_names + (size_t)b * name_len;
        snprintf(bname, name_len, "%s.bucket%d", s->name, b);
        bk->first_item = item;
        if (s->residual) {
            bk->residual = (char *)s->residual + residual_bytes;
            residual_bytes += bk->bytes;
        }
        if (s->owned) {
            bk->data = (char *)s->storage + at;
            at += (bk->bytes + 63) & ~(size_t)63;
        }
        for (int32_t j = 0; j < bk->ngrads; j++, k++) {
            cx_grad *g = canon[k];
            if (s->owned)
                g->data = (char *)bk->data + g->offset;
            if (per_grad) /* one item per gradient: its own memory */
                set_item(s, item++, bname, g->dtype, g->device, g->elements, g->data, g->bytes);
        }
        if (!per_grad)
            set_item(s, item++, bname, bk->dtype, bk->device, bk->elements, bk->data, bk->bytes);
        bk->nitems = item - bk->first_item;
    }
    for (size_t i = 0; i < s->nitems; i++) {
        s->entries[i].req.name = s->items[i].name;
        s->entries[i].req.dtype = s->items[i].dtype;
        s->entries[i].req.device = s->items[i].device;
        s->entries[i].req.ndim = 1;
        s->entries[i].req.shape[0] = s->items[i].shape[0];
        s->entry_ptrs[i] = &s->entries[i];
    }
    free(canon);
    return CFX_OK;
}

