/*
 * hugemem - private buffers that the kernel may back with 2 MiB transparent huge pages: the
 * engine's own large working buffers (fusion, scratch). With THP in `madvise` mode (a common
 * default) only regions that ask get huge pages; MPI's and memcpy's bandwidth over a buffer of
 * tens of MiB is ~1.8x higher on them here (docs/performance.md, "Pages"). Buffers under 2 MiB
 * hold no whole huge page and come from malloc.
 */
#ifndef CFX_HUGEMEM_H
#define CFX_HUGEMEM_H

#include <stddef.h>

/* bytes of memory (uninitialised), or NULL when out of memory. */
void *cx_huge_alloc(size_t bytes);
/* Frees what cx_huge_alloc(bytes) returned, with the same bytes; NULL is a no-op. */
void cx_huge_free(void *p, size_t bytes);

#endif /* CFX_HUGEMEM_H */
