/* shared_pool - the process's shared tensor memory (see shared_pool.h). */
#include "exec/shared_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"

#define ALIGN 64
#define PAGE 4096
#define PUNCH_MIN (64u << 10) /* freed blocks this big give their whole pages back */

typedef struct extent {
    uint64_t off, len;
} extent;

/* A sorted array of disjoint extents. */
typedef struct extent_list {
    extent *v;
    size_t n, cap;
} extent_list;

static struct {
    pthread_mutex_t lock;
    pid_t pid;                 /* the process that made it; another pid means a forked child */
    int fd;
    uint8_t *base;
    uint64_t size, used;
    int64_t configured;        /* CFX_SHARED_POOL_BYTES as the first caller read it; 0: default */
    extent_list free_list, allocated;
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1};

/* The range published to cx_pool_offset; written once under the lock, read without it. */
static _Atomic(uintptr_t) pool_lo, pool_hi;

/* First index whose offset is >= off. */
static size_t lower_bound(const extent_list *l, uint64_t off)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->v[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static cfx_status insert_at(extent_list *l, size_t i, extent e)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        extent *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the shared pool's bookkeeping");
        l->v = v;
        l->cap = cap;
    }
    memmove(&l->v[i + 1], &l->v[i], (l->n - i) * sizeof *l->v);
    l->v[i] = e;
    l->n++;
    return CFX_OK;
}

static void remove_at(extent_list *l, size_t i)
{
    memmove(&l->v[i], &l->v[i + 1], (l->n - i - 1) * sizeof *l->v);
    l->n--;
}

static uint64_t default_size(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 1ull << 34;
}

/* In a forked child the parent's pool is not this process's: cx_pool_offset must not place the
 * child's tensors in it (a peer would read the child's offsets in the child's own pool). */
static void forget_in_child(void)
{
    atomic_store(&pool_lo, 0);
    atomic_store(&pool_hi, 0);
}

static void watch_forks(void)
{
    (void)pthread_atfork(NULL, NULL, forget_in_child);
}

/* A core dump reads every page of a mapping, and reading a hole of the sparse pool makes it real
 * memory: a dump of a process with a RAM-sized pool would fill the machine. Tensor data is left
 * out of dumps (best effort: an old kernel without MADV_DONTDUMP just dumps it). */
static void exclude_from_dumps(void *p, size_t size)
{
    (void)madvise(p, size, MADV_DONTDUMP);
}

/* The bytes of reserved, unused hugetlb pages (HugePages_Free x Hugepagesize in /proc/meminfo) and
 * their page size; 0 when none are reserved (vm.nr_hugepages = 0, the usual case) or unreadable. */
static uint64_t free_hugetlb_bytes(uint64_t *page_bytes)
{
    FILE *f = fopen("/proc/meminfo", "r");
    unsigned long long pages = 0, kib = 0;
    char line[128];
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        (void)sscanf(line, "HugePages_Free: %llu", &pages);
        (void)sscanf(line, "Hugepagesize: %llu kB", &kib);
    }
    fclose(f);
    *page_bytes = (uint64_t)kib << 10;
    return (uint64_t)pages * *page_bytes;
}

/* The pool on reserved huge pages (memfd_create MFD_HUGETLB), when the host reserved enough of them
 * for all of it: transparent huge pages do not reach shared memory where shmem_enabled is `never`,
 * and a hugetlb file cannot be sparse beyond its reservation, so only a pool that the free
 * reserved pages cover (CFX_SHARED_POOL_BYTES at most that) gets them. Mapped without
 * MAP_NORESERVE, so the kernel reserves every page now or refuses (no SIGBUS at first touch).
 * Returns the fd and sets *base and *size (rounded up to whole huge pages), or -1 to fall back to
 * 4 KiB pages quietly. */
static int hugetlb_pool(uint64_t *size, void **base)
{
#ifdef MFD_HUGETLB
    uint64_t page = 0, avail = free_hugetlb_bytes(&page);
    if (!page || avail < *size)
        return -1;
    uint64_t len = (*size + page - 1) / page * page;
    if (len > avail)
        return -1;
    int fd = memfd_create("conflux-shared-pool", MFD_CLOEXEC | MFD_HUGETLB);
    if (fd < 0)
        return -1;
    void *p = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0)
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return -1;
    }
    *size = len;
    *base = p;
    return fd;
#else
    (void)size, (void)base;
    return -1;
#endif
}

/* Makes the pool (under the lock). A forked child drops its parent's: that memory is the
 * parent's to hand out, and is left mapped for whatever the child still reads from it. */
static cfx_status ensure_pool(int64_t configured)
{
    if (pool.base && pool.pid == getpid())
        return CFX_OK;
    if (pool.base) {
        close(pool.fd);
        free(pool.free_list.v);
        free(pool.allocated.v);
        pool.free_list = (extent_list){0};
        pool.allocated = (extent_list){0};
        pool.base = NULL;
        pool.fd = -1;
        atomic_store(&pool_lo, 0);
        atomic_store(&pool_hi, 0);
    }
    pool.configured = configured;
    uint64_t size = configured > 0 ? (uint64_t)configured : default_size();
    size = (size + PAGE - 1) / PAGE * PAGE;
    void *p = MAP_FAILED;
    int fd = hugetlb_pool(&size, &p);
    if (fd < 0)
        fd = memfd_create("conflux-shared-pool", MFD_CLOEXEC);
    if (fd < 0)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cannot create the shared pool: memfd_create: %s",
                       strerror(errno));
    if (p == MAP_FAILED && ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        close(fd);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cannot size the shared pool to %llu bytes: %s",
                       (unsigned long long)size, strerror(e));
    }
    if (p == MAP_FAILED)
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cannot map the shared pool (%llu bytes; "
                       "CFX_SHARED_POOL_BYTES sets it): %s", (unsigned long long)size, strerror(e));
    }
    exclude_from_dumps(p, size);
    cfx_status st = insert_at(&pool.free_list, 0, (extent){0, size});
    if (st) {
        munmap(p, size);
        close(fd);
        return st;
    }
    pool.fd = fd;
    pool.base = p;
    pool.size = size;
    pool.used = 0;
    pool.pid = getpid();
    static pthread_once_t fork_watch = PTHREAD_ONCE_INIT;
    pthread_once(&fork_watch, watch_forks);
    atomic_store(&pool_lo, (uintptr_t)p);
    atomic_store(&pool_hi, (uintptr_t)p + size);
    return CFX_OK;
}

cfx_status cx_pool_alloc(size_t bytes, int64_t pool_bytes, void **out)
{
    *out = NULL;
    if (bytes > UINT64_MAX - ALIGN)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "cfx_alloc: %zu bytes is more than any pool", bytes);
    uint64_t len = bytes ? (bytes + ALIGN - 1) / ALIGN * ALIGN : ALIGN;
    pthread_mutex_lock(&pool.lock);
    cfx_status st = ensure_pool(pool_bytes);
    size_t i = 0;
    while (!st && i < pool.free_list.n && pool.free_list.v[i].len < len)
        i++;
    if (!st && i == pool.free_list.n)
        st = cx_fail(CFX_ERR_OUT_OF_MEMORY, "cfx_alloc: no room for %zu bytes in the shared pool "
                     "(%llu of %llu bytes in use; CFX_SHARED_POOL_BYTES sets its size)", bytes,
                     (unsigned long long)pool.used, (unsigned long long)pool.size);
    if (!st) {
        extent *f = &pool.free_list.v[i];
        extent block = {f->off, len};
        st = insert_at(&pool.allocated, lower_bound(&pool.allocated, block.off), block);
        if (!st) {
            f = &pool.free_list.v[i]; /* unchanged: only the allocated list grew */
            f->off += len;
            f->len -= len;
            if (f->len == 0)
                remove_at(&pool.free_list, i);
            pool.used += len;
            *out = pool.base + block.off;
        }
    }
    pthread_mutex_unlock(&pool.lock);
    return st;
}

/* Gives the whole pages inside [off, off + len) back to the kernel; the memory reads as zeros
 * afterwards. Best effort: the block is free either way. */
static void punch(uint64_t off, uint64_t len)
{
    uint64_t lo = (off + PAGE - 1) / PAGE * PAGE, hi = (off + len) / PAGE * PAGE;
    if (len >= PUNCH_MIN && hi > lo)
        (void)fallocate(pool.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)lo,
                        (off_t)(hi - lo));
}

cfx_status cx_pool_free(void *p)
{
    if (!p)
        return CFX_OK;
    pthread_mutex_lock(&pool.lock);
    cfx_status st = CFX_OK;
    uint8_t *b = p;
    size_t i = 0;
    bool ours = pool.base && pool.pid == getpid() && b >= pool.base && b < pool.base + pool.size;
    if (ours) {
        i = lower_bound(&pool.allocated, (uint64_t)(b - pool.base));
        ours = i < pool.allocated.n && pool.base + pool.allocated.v[i].off == b;
    }
    if (!ours) {
        st = cx_fail(CFX_ERR_INVALID_ARGUMENT, "cfx_free: %p is not a block from cfx_alloc in this "
                     "process (never allocated there, or already freed)", p);
    } else {
        extent e = pool.allocated.v[i];
        /* Into the free list, merged with the free neighbours; done before the allocated entry
         * goes so that a failed insert leaves everything as it was. */
        size_t j = lower_bound(&pool.free_list, e.off);
        bool prev = j > 0 && pool.free_list.v[j - 1].off + pool.free_list.v[j - 1].len == e.off;
        bool next = j < pool.free_list.n && e.off + e.len == pool.free_list.v[j].off;
        if (prev && next) {
            pool.free_list.v[j - 1].len += e.len + pool.free_list.v[j].len;
            remove_at(&pool.free_list, j);
        } else if (prev) {
            pool.free_list.v[j - 1].len += e.len;
        } else if (next) {
            pool.free_list.v[j].off = e.off;
            pool.free_list.v[j].len += e.len;
        } else {
            st = insert_at(&pool.free_list, j, e);
        }
        if (!st) {
            remove_at(&pool.allocated, i);
            pool.used -= e.len;
            punch(e.off, e.len);
        }
    }
    pthread_mutex_unlock(&pool.lock);
    return st;
}

cfx_status cx_pool_get_export(cx_pool_export *out)
{
    pthread_mutex_lock(&pool.lock);
    cfx_status st = ensure_pool(pool.configured);
    if (!st)
        *out = (cx_pool_export){(int64_t)pool.pid, pool.fd, pool.size};
    pthread_mutex_unlock(&pool.lock);
    return st;
}

bool cx_pool_offset(const void *p, size_t bytes, uint64_t *out)
{
    uintptr_t lo = atomic_load_explicit(&pool_lo, memory_order_acquire);
    uintptr_t hi = atomic_load_explicit(&pool_hi, memory_order_acquire), a = (uintptr_t)p;
    if (!lo || a < lo || a >= hi || bytes > hi - a)
        return false;
    *out = (uint64_t)(a - lo);
    return true;
}

cfx_status cx_pool_map_peer(const cx_pool_export *e, void **out)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%lld/fd/%lld", (long long)e->pid, (long long)e->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return cx_fail(CFX_ERR_TRANSPORT, "cannot open the shared pool of process %lld (%s): %s",
                       (long long)e->pid, path, strerror(errno));
    void *p = mmap(NULL, e->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    int err = errno;
    close(fd);
    if (p != MAP_FAILED)
        exclude_from_dumps(p, e->size);
    if (p == MAP_FAILED)
        return cx_fail(CFX_ERR_TRANSPORT, "cannot map the shared pool of process %lld (%llu "
                       "bytes): %s", (long long)e->pid, (unsigned long long)e->size, strerror(err));
    *out = p;
    return CFX_OK;
}
