/* shm_barrier - the segment's barrier, the peers' liveness, the one-host AND (shm_barrier.h). */
#include "exec/shm_barrier.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/process.h"

static void futex_wait(atomic_uint *word, unsigned value)
{
    struct timespec limit = {0, 50 * 1000 * 1000}; /* a bound, not a poll: the waker wakes us */
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT, value, &limit, NULL, 0);
}

static void futex_wake_all(atomic_uint *word)
{
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet. */
static bool process_ended(int pid)
{
    return cx_process_probe(pid, 0) == CX_PROCESS_ENDED;
}

/* Gives up on a barrier: names the local ranks that did not reach generation `gen` + 1 (those
 * whose process ended first, else all the late ones) and fails this and every later call. */
static cfx_status give_up(cx_shm *s, unsigned gen, double waited_s, bool ended_only)
{
    char host[256] = "?", who[1024] = "";
    gethostname(host, sizeof host - 1);
    size_t len = 0;
    for (int q = 0; q < s->nlocal; q++) {
        const shm_member *m = &s->members[q];
        if (q == s->me || (int)(atomic_load(&m->reached) - (gen + 1)) >= 0)
            continue;
        bool ended = process_ended(m->pid);
        if (ended_only && !ended)
            continue;
        int w = snprintf(who + len, sizeof who - len, "%srank %d on host %s (process %d %s)",
                         len ? ", " : "", m->rank, host, m->pid, ended ? "ended" : "did not arrive");
        if (w > 0 && (size_t)w < sizeof who - len)
            len += (size_t)w;
    }
    snprintf(s->failure, sizeof s->failure, "shared-memory barrier (local rank %d of %d, rank %d, "
             "host %s): a peer died or stopped answering within %g s (CFX_TRANSPORT_TIMEOUT_S); "
             "waited %.2f s: suspect %s", s->me, s->nlocal, s->members[s->me].rank, host,
             s->timeout_s, waited_s, len ? who : "a local rank that left the segment");
    s->failed = CFX_ERR_PEER_LOST;
    return cx_fail(s->failed, "%s", s->failure);
}

/* Waits for every local rank. A round's phases take a few hundred microseconds, so a waiter spins,
 * then yields (letting any other runnable thread have the core) for up to BARRIER_YIELD_S, then
 * sleeps on a futex that the last arriver wakes. Polling with nanosleep instead costs the timer
 * slack (about 50 us) per barrier, which at two barriers per chunk was a third of a 256 MiB
 * reduction's time. Every rank is in the same batch or agreement round when it gets here (the
 * negotiation put them there, and cycles run at least every cycle time on every rank), so a long
 * wait means a lost peer: a sleeping waiter checks the late ranks' processes every
 * CX_SHM_LIVENESS_PERIOD_S and gives up with CFX_ERR_PEER_LOST when one ended, or at the deadline. */
#define BARRIER_YIELD_S 1e-3
cfx_status cx_shm_barrier_yielding(cx_shm *s, double yield_s)
{
    if (s->failed)
        return cx_fail(s->failed, "%s", s->failure);
    unsigned gen = s->generation;
    shm_control *c = s->control;
    /* Relaxed: the arrival's fetch_add below orders it; only a waiter past its deadline reads it. */
    atomic_store_explicit(&s->members[s->me].reached, gen + 1, memory_order_relaxed);
    if (atomic_fetch_add(&c->arrived, 1) == (unsigned)s->nlocal - 1) {
        atomic_store_explicit(&c->arrived, 0, memory_order_relaxed);
        atomic_store(&c->generation, gen + 1);
        if (atomic_load(&c->sleepers))
            futex_wake_all(&c->generation);
    } else {
        double started = 0, until = 0, next_check = 0;
        for (unsigned spins = 0; atomic_load(&c->generation) == gen; spins++) {
            if (spins < 128)
                continue;
            if (until == 0) {
                started = cx_now_s();
                until = started + yield_s;
                next_check = started + CX_SHM_LIVENESS_PERIOD_S;
            }
            if (spins % 64 || cx_now_s() < until) {
                sched_yield();
                continue;
            }
            atomic_fetch_add(&c->sleepers, 1);
            if (atomic_load(&c->generation) == gen)
                futex_wait(&c->generation, gen);
            atomic_fetch_sub(&c->sleepers, 1);
            double now = cx_now_s();
            if (now >= next_check && atomic_load(&c->generation) == gen) {
                next_check = now + CX_SHM_LIVENESS_PERIOD_S;
                bool timed_out = s->timeout_s > 0 && now - started >= s->timeout_s;
                for (int q = 0; q < s->nlocal && !timed_out; q++)
                    if (q != s->me && (int)(atomic_load(&s->members[q].reached) - (gen + 1)) < 0 &&
                        process_ended(s->members[q].pid))
                        return give_up(s, gen, now - started, true);
                if (timed_out)
                    return give_up(s, gen, now - started, false);
            }
        }
    }
    s->generation = gen + 1;
    return CFX_OK;
}

cfx_status cx_shm_barrier(cx_shm *s) { return cx_shm_barrier_yielding(s, BARRIER_YIELD_S); }

/* One barrier per round: rank r writes its words into row [round % 2][r], and after the barrier
 * every rank ANDs all rows of that parity. A row is rewritten two rounds later, and a rank can only
 * get there once every rank has passed the next round's barrier, so after it read this round's
 * rows. A late peer is waited for by yielding for at most AND_YIELD_S, then on the futex: idle
 * heartbeat rounds come every cycle time or less often, and their ranks arrive close together. */
#define AND_YIELD_S 200e-6
cfx_status cx_shm_allreduce_and(cx_shm *s, uint64_t *words, size_t count, bool *done)
{
    *done = count <= CX_SHM_AND_MAX_WORDS;
    if (!*done)
        return CFX_OK;
    size_t row = CX_SHM_AND_MAX_WORDS, half = (size_t)s->nlocal * row;
    uint64_t *rows = s->and_rows + (size_t)(s->and_rounds++ & 1) * half;
    memcpy(rows + (size_t)s->me * row, words, count * sizeof *words);
    cfx_status st = cx_shm_barrier_yielding(s, AND_YIELD_S);
    for (int q = 0; q < s->nlocal && !st; q++) {
        const uint64_t *peer = rows + (size_t)q * row;
        if (q != s->me)
            for (size_t i = 0; i < count; i++)
                words[i] &= peer[i];
    }
    return st;
}

