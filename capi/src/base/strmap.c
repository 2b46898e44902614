/* strmap - a string-keyed hash map with owned keys (see strmap.h). */
#include "base/strmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char tombstone_marker;
#define CX_STRMAP_TOMBSTONE (&tombstone_marker)

static size_t hash_string(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return (size_t)h;
}

static bool live(const cx_strmap_slot *slot)
{
    return slot->key != NULL && slot->key != CX_STRMAP_TOMBSTONE;
}

void cx_strmap_init(cx_strmap *m) { memset(m, 0, sizeof *m); }

void cx_strmap_destroy(cx_strmap *m)
{
    for (size_t i = 0; i < m->capacity; i++)
        if (live(&m->slots[i]))
            free(m->slots[i].key);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static cx_strmap_slot *find(const cx_strmap *m, const char *key, size_t hash)
{
    if (m->capacity == 0)
        return NULL;
    size_t mask = m->capacity - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        cx_strmap_slot *slot = &m->slots[i];
        if (slot->key == NULL)
            return NULL;
        if (live(slot) && slot->hash == hash && strcmp(slot->key, key) == 0)
            return slot;
    }
}

static bool grow(cx_strmap *m)
{
    size_t capacity = m->capacity ? m->capacity * 2 : 16;
    /* Shrinking back is not needed: rehashing drops tombstones, so only growth by live keys. */
    if (m->count * 4 < m->capacity)
        capacity = m->capacity;
    cx_strmap_slot *slots = calloc(capacity, sizeof *slots);
    if (!slots)
        return false;
    for (size_t i = 0; i < m->capacity; i++) {
        cx_strmap_slot *old = &m->slots[i];
        if (!live(old))
            continue;
        size_t j = old->hash & (capacity - 1);
        while (slots[j].key)
            j = (j + 1) & (capacity - 1);
        slots[j] = *old;
    }
    free(m->slots);
    m->slots = slots;
    m->capacity = capacity;
    m->used = m->count;
    return true;
}

void *cx_strmap_get(const cx_strmap *m, const char *key)
{
    cx_strmap_slot *slot = find(m, key, hash_string(key));
    return slot ? slot->value : NULL;
}

bool cx_strmap_put(cx_strmap *m, const char *key, void *value)
{
    size_t hash = hash_string(key);
    cx_strmap_slot *slot = find(m, key, hash);
    if (slot) {
        slot->value = value;
        return true;
    }
    if ((m->used + 1) * 4 > m->capacity * 3 && !grow(m))
        return false;
    char *copy = strdup(key);
    if (!copy)
        return false;
    size_t mask = m->capacity - 1;
    size_t i = hash & mask;
    while (live(&m->slots[i]))
        i = (i + 1) & mask;
    if (m->slots[i].key == NULL)
        m->used++;
    m->slots[i] = (cx_strmap_slot){copy, hash, value};
    m->count++;
    return true;
}

void *cx_strmap_remove(cx_strmap *m, const char *key)
{
    cx_strmap_slot *slot = find(m, key, hash_string(key));
    if (!slot)
        return NULL;
    void *value = slot->value;
    free(slot->key);
    slot->key = CX_STRMAP_TOMBSTONE;
    slot->value = NULL;
    m->count--;
    return value;
}

bool cx_strmap_next(const cx_strmap *m, size_t *pos, const char **key, void **value)
{
    for (; *pos < m->capacity; (*pos)++) {
        const cx_strmap_slot *slot = &m->slots[*pos];
        if (live(slot)) {
            *key = slot->key;
            *value = slot->value;
            (*pos)++;
            return true;
        }
    }
    return false;
}
