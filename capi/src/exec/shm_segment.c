/* shm_segment - the host segment's layout and lifetime (see shm_segment.h, shm.h). */
#include "exec/shm_segment.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

cfx_status cx_shm_create(cx_transport *t, size_t chunk_bytes, double timeout_s,
                         uint64_t direct_map_fail, cx_shm **out)
{
    *out = NULL;
    /* Rank 0 picks a job-unique tag; each host's segment is named by the tag and its host index. */
    uint64_t tag = 0;
    if (t->rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        tag = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    }
    void *buf = &tag;
    size_t len = sizeof tag;
    cfx_status st = t->ops->bcast_bytes(t, &buf, &len, 0);
    if (st)
        return st;
    if (t->rank != 0) {
        memcpy(&tag, buf, sizeof tag);
        free(buf);
    }
    cx_shm *s = calloc(1, sizeof *s);
    if (!s)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the shared-memory path");
    s->nlocal = t->local_size;
    s->me = t->local_rank;
    s->direct_map_fail = direct_map_fail;
    s->timeout_s = timeout_s;
    s->chunk = round_up(chunk_bytes, CX_SHM_CACHE_LINE);
    size_t control = round_up(sizeof(shm_control), 4096);
    size_t members = round_up((size_t)s->nlocal * sizeof(shm_member), 4096);
    size_t offers = round_up((size_t)s->nlocal * sizeof(direct_offer), 4096);
    size_t and_rows =
        round_up(2 * (size_t)s->nlocal * CX_SHM_AND_MAX_WORDS * sizeof(uint64_t), 4096);
    s->size = control + members + offers + and_rows + s->chunk * 2 * (size_t)s->nlocal + s->chunk * 2;
    char name[64];
    snprintf(name, sizeof name, "/conflux-%016llx-%d", (unsigned long long)tag, t->cross_rank);
    int fd = -1;
    cfx_status local = CFX_OK;
    if (s->me == 0) {
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)s->size) != 0)
            local = cx_fail(CFX_ERR_TRANSPORT, "cannot create shared memory %s (%zu bytes) in "
                            "/dev/shm", name, s->size);
    }
    /* Everyone waits for the creators, then opens; a failure anywhere is seen by all below. */
    if ((st = t->ops->barrier(t))) {
        if (fd >= 0)
            close(fd);
        free(s);
        return st;
    }
    if (!local && s->me != 0 && (fd = shm_open(name, O_RDWR, 0600)) < 0)
        local = cx_fail(CFX_ERR_TRANSPORT, "cannot open shared memory %s", name);
    if (!local) {
        void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            local = cx_fail(CFX_ERR_TRANSPORT, "cannot map shared memory %s (%zu bytes)", name, s->size);
        else
            s->base = p;
    }
    if (!local) { /* read by the peers only when they wait for this rank, after the AND below */
        shm_member *me = (shm_member *)(s->base + control) + s->me;
        me->rank = t->rank;
        me->pid = (int32_t)getpid();
    }
    if (fd >= 0)
        close(fd);
    /* Agree on success everywhere: one failed rank means nobody uses the segment. */
    uint64_t ok = local ? 0 : ~0ull;
    char msg[CX_ERROR_MAX];
    snprintf(msg, sizeof msg, "%s", cx_error_message());
    st = t->ops->allreduce_and(t, &ok, 1);
    if (s->me == 0)
        shm_unlink(name); /* mapped by all (or abandoned): the name is no longer needed */
    if (st || !ok) {
        if (s->base)
            munmap(s->base, s->size);
        free(s);
        return st ? st : cx_fail(CFX_ERR_TRANSPORT, "shared-memory path unavailable: %s",
                                 local ? msg : "another rank could not map it");
    }
    s->control = (shm_control *)s->base;
    s->members = (shm_member *)(s->base + control);
    s->offers = (direct_offer *)(s->base + control + members);
    s->and_rows = (uint64_t *)(s->base + control + members + offers);
    s->slots = s->base + control + members + offers + and_rows;
    s->results = s->slots + s->chunk * 2 * (size_t)s->nlocal;
    *out = s;
    return CFX_OK;
}

int cx_shm_direct_state(const cx_shm *s, const char **why)
{
    *why = s->direct_off;
    return s->direct == DIRECT_READY ? 1 : s->direct == DIRECT_OFF ? -1 : 0;
}

void cx_shm_unmap_peers(cx_shm *s)
{
    for (int q = 0; s->peer_pools && q < s->nlocal; q++)
        if (s->peer_pools[q])
            munmap(s->peer_pools[q], (size_t)s->peer_sizes[q]);
    free(s->peer_pools);
    free(s->peer_sizes);
    free(s->strip);
    free(s->piece);
    s->peer_pools = NULL;
    s->peer_sizes = NULL;
    s->strip = NULL;
    s->piece = NULL;
}

cfx_status cx_shm_failure(const cx_shm *s) { return s->failed; }

void cx_shm_destroy(cx_shm *s)
{
    if (!s)
        return;
    cx_shm_unmap_peers(s);
    munmap(s->base, s->size);
    free(s->wire16);
    free(s);
}

