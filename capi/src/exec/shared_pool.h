/*
 * shared_pool - the process's shared tensor memory (cfx_alloc / cfx_free), and the handle other
 * processes on the host use to map it.
 *
 * One memfd per process, sized once (CFX_SHARED_POOL_BYTES, default the machine's RAM: a sparse
 * file and address space, not memory) and mapped shared. A local peer maps the same pages through
 * /proc/<pid>/fd/<fd>, so a pointer into the pool is reachable from every local rank at the peer's
 * base of the mapping plus the pointer's offset. The allocator is first-fit over sorted arrays of
 * free and allocated extents, kept in private memory under one mutex, so cfx_free can tell a
 * foreign pointer or a double free from a block even if the caller wrote past its end. Freed whole
 * pages go back to the kernel (fallocate PUNCH_HOLE). Core dumps leave the pool out: reading its
 * holes would make them memory. After fork the child starts an empty pool of
 * its own (its parent's blocks are not its to hand out). Where the host reserved enough hugetlb
 * pages for the whole pool (vm.nr_hugepages; then CFX_SHARED_POOL_BYTES within them), the memfd is
 * MFD_HUGETLB and reserved up front; otherwise, quietly, 4 KiB pages.
 */
#ifndef CFX_SHARED_POOL_H
#define CFX_SHARED_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "conflux/conflux.h"

/* cfx_alloc / cfx_free (conflux.h has the contract). The pool is made by the first call, of
 * pool_bytes (CFX_SHARED_POOL_BYTES, read by the caller's entry point; 0: a default from the
 * machine's memory); later calls' pool_bytes do not resize it. */
cfx_status cx_pool_alloc(size_t bytes, int64_t pool_bytes, void **out);
cfx_status cx_pool_free(void *p);

/* What a peer needs to map this process's pool. */
typedef struct cx_pool_export {
    int64_t pid;
    int64_t fd;
    uint64_t size;
} cx_pool_export;

/* Creates the pool if this process has none yet and describes it. */
cfx_status cx_pool_get_export(cx_pool_export *out);

/* Where [p, p + bytes) lies in this process's pool: true with its offset, false when any of it
 * lies outside (or there is no pool). Lock-free: the pool's range never changes once made. */
bool cx_pool_offset(const void *p, size_t bytes, uint64_t *out);

/* Maps a peer's pool read-write; unmap with munmap(*out, e->size). */
cfx_status cx_pool_map_peer(const cx_pool_export *e, void **out);

#endif /* CFX_SHARED_POOL_H */
