/* exec_state - the reservation of the collective engine's buffers (see exec_state.h). */
#include "exec/exec_state.h"

#include <stdlib.h>

#include "base/error.h"
#include "base/hugemem.h"

/* From 2 MiB on huge pages (hugemem.h): the fusion and scratch buffers are what MPI reduces on
 * the cross-host path. */
cfx_status cx_exec_reserve(void **buf, size_t *cap, size_t bytes)
{
    if (*cap >= bytes)
        return CFX_OK;
    size_t ncap = *cap ? *cap : 4096;
    while (ncap < bytes)
        ncap *= 2;
    void *p = cx_huge_alloc(ncap);
    if (!p)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte buffer", ncap);
    cx_huge_free(*buf, *cap);
    *buf = p;
    *cap = ncap;
    return CFX_OK;
}

