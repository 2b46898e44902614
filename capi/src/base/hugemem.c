/* hugemem - private buffers on transparent huge pages where they fit (see hugemem.h). */
#include "base/hugemem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

static size_t mapped_length(size_t bytes) { return (bytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE; }

void *cx_huge_alloc(size_t bytes)
{
    if (bytes < HUGE_PAGE)
        return malloc(bytes ? bytes : 1);
    /* Over-map by one huge page and trim, so that the buffer starts on a 2 MiB boundary: a huge
     * page can only back an aligned 2 MiB range. */
    size_t len = mapped_length(bytes);
    uint8_t *raw = mmap(NULL, len + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    size_t lead = (HUGE_PAGE - (uintptr_t)raw % HUGE_PAGE) % HUGE_PAGE;
    if (lead)
        munmap(raw, lead);
    if (HUGE_PAGE - lead)
        munmap(raw + lead + len, HUGE_PAGE - lead);
#ifdef MADV_HUGEPAGE
    (void)madvise(raw + lead, len, MADV_HUGEPAGE); /* a hint: without THP, 4 KiB pages */
#endif
    return raw + lead;
}

void cx_huge_free(void *p, size_t bytes)
{
    if (!p)
        return;
    if (bytes < HUGE_PAGE)
        free(p);
    else
        munmap(p, mapped_length(bytes));
}
