/* loop - the background thread and the threads that drive cycles: who runs a cycle, when, and
 * how it idles between them (see loop.h; the cycle itself is cycle.c). */
#include "engine/loop.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "base/clock.h"
#include "base/error.h"
#include "engine/cycle.h"
#include "engine/gradset.h"
#include "exec/device_exec.h"
#include "exec/execute.h"

struct cx_loop {
    cx_loop_env env;
    /* Whoever runs a cycle holds run_mu: the background thread, or a thread waiting for its own
     * work (cx_loop_drive). `stopped` (under run_mu): the loop has ended, no cycle runs again.
     * `drivers`: threads inside cx_loop_drive, so the background thread stands aside. */
    pthread_mutex_t run_mu;
    bool stopped;
    atomic_int drivers;
    atomic_bool gradsets_busy; /* cx_gradsets_busy after the last cycle */
    atomic_int driven;         /* set by every driven cycle: the context is not idle */
    cx_cycle *cycle; /* what a cycle works on; only whoever holds run_mu touches it */
};

cfx_status cx_loop_create(const cx_loop_env *given, cx_loop **out)
{
    cx_loop *L = calloc(1, sizeof *L);
    if (!L)
        return cx_fail(CFX_ERR_OUT_OF_MEMORY, "out of memory for the background loop");
    L->env = *given;
    pthread_mutex_init(&L->run_mu, NULL);
    atomic_init(&L->drivers, 0);
    atomic_init(&L->gradsets_busy, false);
    atomic_init(&L->driven, 0);
    cfx_status st = cx_cycle_create(&L->env, &L->cycle);
    if (st) {
        cx_loop_destroy(L);
        return st;
    }
    *out = L;
    return CFX_OK;
}

cx_exec *cx_loop_exec(cx_loop *L) { return cx_cycle_exec(L->cycle); }

void cx_loop_destroy(cx_loop *L)
{
    if (!L)
        return;
    cx_cycle_destroy(L->cycle);
    pthread_mutex_destroy(&L->run_mu);
    free(L);
}

/* Bounded adaptive spinning. After a cycle that did work the thread polls the queue (lock-free)
 * for a while before it sleeps, so a request submitted soon after the last one does not pay a
 * futex wake-up. The budget adapts: doubled (up to SPIN_MAX_S) when a spin caught work, halved
 * (down to SPIN_MIN_S) when it ran out; after SPIN_WINDOW_S without progress the thread does not
 * spin at all, so an idle context stays asleep and a rank waiting on a slow peer stops polling. */
#define SPIN_MIN_S 2e-6
#define SPIN_MAX_S 100e-6
#define SPIN_WINDOW_S 2e-3
/* A context idle for DEEP_IDLE_CYCLES heartbeat cycles in a row (nothing in flight, no waiter)
 * wakes only every DEEP_IDLE_STRETCH cycle times to take part in other ranks' cycles. */
#define DEEP_IDLE_CYCLES 200
#define DEEP_IDLE_STRETCH 50
/* How long a driving thread yields to a background thread in its cycle before it waits as usual. */
#define DRIVE_YIELD_S 50e-6

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls for new work for up to budget_s; true when some arrived. */
static bool spin_for_work(cx_queue *q, double budget_s)
{
    double end = cx_now_s() + budget_s;
    for (unsigned i = 0;; i++) {
        if (cx_queue_has_new(q))
            return true;
        cpu_relax();
        if ((i & 31) == 31 && cx_now_s() >= end)
            return false;
    }
}

/* One cycle with the loop's error handling, run_mu held; true when the loop has ended. */
static bool run_cycle(cx_loop *L, bool *progress)
{
    bool stop = false;
    cfx_status st = cx_cycle_run(L->cycle, progress, &stop);
    if (st) {
        char reason[CX_ERROR_MAX];
        snprintf(reason, sizeof reason, "the background thread stopped after an error: %s",
                 cx_error_message());
        cx_log(L->env.log, CX_LOG_ERROR, "loop", "%s", reason);
        cx_cycle_fail_all(L->cycle, st == CFX_ERR_TRANSPORT ? CFX_ERR_TRANSPORT : st, reason);
        stop = true;
    }
    if (stop)
        L->stopped = true;
    atomic_store(&L->gradsets_busy, !stop && cx_gradsets_busy(L->env.gradsets));
    return stop;
}

/* The back-off while this rank's tensors wait for other ranks: 1 us doubling to the cycle time. */
static double backoff_s(double cycle_s, int idle_streak)
{
    return fmin(cycle_s, 1e-6 * (double)(1 << (idle_streak < 10 ? idle_streak : 10)));
}

/* Work in flight on this rank, or a gradient-set bucket the last cycle left ready or pending (the
 * gradient sets are the cycle's: sampled under run_mu, read from any thread). */
static bool engine_busy(cx_loop *L)
{
    return cx_queue_in_flight(L->env.queue) != 0 || atomic_load(&L->gradsets_busy);
}

cx_drive_result cx_loop_drive(cx_loop *L, bool (*done)(void *), void *arg, double deadline_s)
{
    const cx_loop_env *env = &L->env;
    cx_drive_result result = CX_DRIVE_DONE;
    int idle_streak = 0;
    double busy_since = -1;
    atomic_fetch_add(&L->drivers, 1);
    while (!done(arg)) {
        double now = cx_now_s();
        if (now >= deadline_s) {
            result = CX_DRIVE_TIMEOUT;
            break;
        }
        if (pthread_mutex_trylock(&L->run_mu) != 0) {
            /* The background thread is in a cycle (most likely the one that runs our work): let
             * it finish; after a short while leave the waiting to the caller's usual path. */
            if (busy_since < 0)
                busy_since = now;
            if (now - busy_since > DRIVE_YIELD_S) {
                result = CX_DRIVE_BUSY;
                break;
            }
            sched_yield();
            continue;
        }
        busy_since = -1;
        if (L->stopped || (env->device_bound && atomic_load(env->device_bound))) {
            pthread_mutex_unlock(&L->run_mu);
            result = CX_DRIVE_BUSY;
            break;
        }
        cx_queue_forgive_wake(env->queue);
        atomic_store(&L->driven, 1);
        bool progress = false;
        bool stop = run_cycle(L, &progress);
        double cycle_s = env->cfg->cycle_time_ms * 1e-3;
        pthread_mutex_unlock(&L->run_mu);
        if (stop)
            continue; /* the work failed with the loop: `done` says so */
        idle_streak = progress ? 0 : idle_streak + 1;
        if (idle_streak > 1) {
            struct timespec ts = {0, (long)(backoff_s(cycle_s, idle_streak) * 1e9)};
            nanosleep(&ts, NULL);
        }
    }
    atomic_fetch_sub(&L->drivers, 1);
    if (engine_busy(L))
        cx_queue_wake(env->queue); /* what is left is the background thread's again */
    return result;
}

void cx_loop_fence(cx_loop *L)
{
    pthread_mutex_lock(&L->run_mu);
    pthread_mutex_unlock(&L->run_mu);
}

void *cx_loop_main(void *arg)
{
    cx_loop *L = arg;
    const cx_loop_env *env = &L->env;
    int idle_streak = 0, quiet_cycles = 0;
    double spin_s = SPIN_MAX_S / 4, last_progress = -INFINITY;
    pthread_mutex_lock(&L->run_mu); /* the cycle time is read under run_mu: autotune changes it */
    double cycle_s = env->cfg->cycle_time_ms * 1e-3;
    pthread_mutex_unlock(&L->run_mu);
#ifdef PR_SET_TIMERSLACK
    prctl(PR_SET_TIMERSLACK, 1000ul); /* the back-off's microsecond sleeps, not the default 50 us */
#endif
    for (;;) {
        bool shutdown = atomic_load(env->shutdown_requested);
        if (atomic_load(&L->drivers) && !shutdown) {
            /* A waiting thread runs the cycles; it wakes this one when it leaves work behind. */
            cx_queue_sleep(env->queue, cycle_s);
            continue;
        }
        if (!cx_queue_has_new(env->queue) && !shutdown) {
            bool caught = false;
            if (cx_now_s() - last_progress < SPIN_WINDOW_S) {
                caught = spin_for_work(env->queue, spin_s);
                spin_s = caught ? fmin(2 * spin_s, SPIN_MAX_S) : fmax(spin_s / 2, SPIN_MIN_S);
            }
            if (caught)
                ;
            else if (!engine_busy(L)) {
                /* Long idle (every rank counts the same cycles, so the ranks stretch together):
                 * fewer heartbeat cycles, and a push wakes the thread at once meanwhile. */
                bool deep = quiet_cycles >= DEEP_IDLE_CYCLES;
                atomic_store(&env->queue->deep_idle, deep);
                cx_queue_wait(env->queue, deep ? DEEP_IDLE_STRETCH * cycle_s : cycle_s);
                atomic_store(&env->queue->deep_idle, 0);
            }
            else if (idle_streak > 0) /* our tensors wait for other ranks: back off */
                cx_queue_wait(env->queue, backoff_s(cycle_s, idle_streak));
        }
        pthread_mutex_lock(&L->run_mu);
        if (L->stopped) {
            pthread_mutex_unlock(&L->run_mu);
            break;
        }
        if (atomic_load(&L->drivers) && !atomic_load(env->shutdown_requested)) {
            pthread_mutex_unlock(&L->run_mu); /* a waiter took over meanwhile */
            continue;
        }
        bool progress = false;
        bool stop = run_cycle(L, &progress);
        cycle_s = env->cfg->cycle_time_ms * 1e-3;
        pthread_mutex_unlock(&L->run_mu);
        if (stop)
            break;
        if (progress)
            last_progress = cx_now_s();
        idle_streak = progress ? 0 : idle_streak + 1;
        bool driven = atomic_exchange(&L->driven, 0); /* a waiter ran cycles since the last one */
        quiet_cycles = progress || driven || engine_busy(L) ? 0 : quiet_cycles + 1;
    }
    /* CUDA and NCCL state is made and ended by this thread alone (device_exec.h). */
    cx_exec *exec = cx_cycle_exec(L->cycle);
    cx_device_destroy(exec->device);
    exec->device = NULL;
    atomic_store(env->running, 0);
    return NULL;
}
