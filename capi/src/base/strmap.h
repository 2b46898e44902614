/*
 * strmap - a string-keyed hash map (open addressing, linear probing), keys copied and owned.
 *
 * Used for the tensor table (name -> entry), the coordinator's message table and the response
 * cache's name index. Not thread-safe: each owner locks as it needs.
 */
#ifndef CFX_STRMAP_H
#define CFX_STRMAP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct cx_strmap_slot {
    char *key;   /* NULL: empty; CX_STRMAP_TOMBSTONE: deleted */
    size_t hash;
    void *value;
} cx_strmap_slot;

typedef struct cx_strmap {
    cx_strmap_slot *slots;
    size_t capacity; /* a power of two, or 0 */
    size_t count;    /* live keys */
    size_t used;     /* live + tombstones */
} cx_strmap;

void cx_strmap_init(cx_strmap *m);
/* Frees the keys and slots (not the values). */
void cx_strmap_destroy(cx_strmap *m);
void *cx_strmap_get(const cx_strmap *m, const char *key);
/* Inserts or replaces; returns false when out of memory. */
bool cx_strmap_put(cx_strmap *m, const char *key, void *value);
/* Removes the key and returns its value (NULL if absent). */
void *cx_strmap_remove(cx_strmap *m, const char *key);

/* Iteration: for (size_t i = 0; cx_strmap_next(m, &i, &key, &value);) ... */
bool cx_strmap_next(const cx_strmap *m, size_t *pos, const char **key, void **value);

#endif /* CFX_STRMAP_H */
