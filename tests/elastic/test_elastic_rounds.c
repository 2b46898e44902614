/*
 * test_elastic_rounds - membership rounds of elastic worlds (engine/membership.h) at the C ABI,
 * with real processes over the Gloo transport. The test is its own launcher: it forks the ranks
 * (CFX_RANK/CFX_SIZE/CFX_ELASTIC_ID and a file store in a fresh directory), reaps them, and, as
 * cfxrun --elastic does, marks a process that died as gone in the store.
 *
 *   test_elastic_rounds reform50 NP   every rank re-forms the same world 50 times; a handle pending
 *                                     at each reform fails with CFX_ERR_MEMBERSHIP_CHANGED; fds,
 *                                     threads and shared-memory mappings are counted before/after
 *   test_elastic_rounds kill NP       the last rank SIGKILLs itself mid-loop; survivors re-form
 *                                     and go on with NP-1 ranks
 *   test_elastic_rounds exit NP       the last rank exits (as on an uncaught exception)
 *   test_elastic_rounds stop NP       the last rank stops (SIGSTOP: silent, as behind a link that
 *                                     went down): the survivors' transport deadline, then the
 *                                     round's deadline, leave it out
 *   test_elastic_rounds grow NP       a newcomer started later joins at the survivors' next check
 *   test_elastic_rounds below_min NP  one rank dies and min_size is NP: the survivors get
 *                                     CFX_ERR_MEMBERSHIP_CHANGED naming the lost member, no hang
 *   test_elastic_rounds late NP       a newcomer reaches the next round long before the members
 *                                     (they train past its settle time before their next check):
 *                                     it waits for them, and the world is all NP + 1 (a newcomer
 *                                     that led would decide a world of itself alone)
 *   test_elastic_rounds replace NP    every member of the first world dies; NP newcomers started
 *                                     after that form a world of their own (a newcomer leads once
 *                                     every old member is gone)
 *   test_elastic_rounds slow_start NP the last member starts after the others' settle time: the
 *                                     first world forms without it, and it comes back at their
 *                                     next check (a member a round left out is no newcomer)
 *   test_elastic_rounds marked_gone NP  the last member is marked gone while it still runs (a
 *                                     driver that wrote off a silent host): the others re-form
 *                                     without it, and its reform fails at once saying so (it no
 *                                     longer waits out the deadline for a round nobody leads)
 *   test_elastic_rounds gone_forming NP  the last member is in the next round's decision, then
 *                                     exits before its world's rendezvous (as a worker the driver
 *                                     stops with its blacklisted host): the others, waiting for
 *                                     it there, see it marked gone and form the round after
 *                                     without it (they used to fail at the rendezvous deadline)
 * Every result is checked against the sum of what each member contributed, computed here.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conflux/conflux.h"
#include "rendezvous/store.h"

#define N_ELEMS 1000
#define STEPS 12
#define DIE_AT 5
/* late: the newcomer's settle time, and how long the members train past the newcomer's hello
 * before their next check (well past the settle time, well within the deadline). slow_start:
 * how much later than the others the last member starts (past LATE_SETTLE_S). */
#define LATE_SETTLE_S 1.0
#define LATE_DELAY_S 4.0
#define SLOW_START_S 3

#define CHECK(cond, ...)                                                                \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "FAIL id %s: %s:%d: ", getenv("CFX_ELASTIC_ID"), __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, " (last error: %s)\n", cfx_last_error());                   \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += e->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

static int shm_mappings(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, "/dev/shm/") != NULL;
    if (f)
        fclose(f);
    return n;
}

/* What member `id` contributes at `step`: element i is (id + 1) * (step + 1) + i. */
static float contribution(int id, int step, int i) { return (float)((id + 1) * (step + 1) + i); }

/* One allreduce of every member's contribution; returns the status (the result is checked when
 * it is CFX_OK). `ids` gets the member ids of the world (an allgather of them), so the check
 * needs no assumption about who is in it. */
static cfx_status step_allreduce(cfx_context *ctx, int step)
{
    int size = cfx_size(ctx), me = cfx_member_id(ctx);
    float in[N_ELEMS], out[N_ELEMS];
    for (int i = 0; i < N_ELEMS; i++)
        in[i] = contribution(me, step, i);
    int32_t myid = me, ids[64];
    int64_t shape = N_ELEMS, one = 1;
    cfx_tensor t = {.data = in, .shape = &shape, .ndim = 1, .dtype = CFX_FLOAT32, .device = -1};
    cfx_tensor tid = {.data = &myid, .shape = &one, .ndim = 1, .dtype = CFX_INT32, .device = -1};
    char name[64];
    snprintf(name, sizeof name, "step%d.r%d", step, cfx_membership_round(ctx));
    cfx_handle h = 0, hid = 0;
    cfx_status st = cfx_allreduce_async(ctx, name, &t, out, CFX_OP_SUM, 1.0, 1.0, &h);
    if (!st) {
        st = cfx_wait(ctx, h, 120);
        cfx_handle_release(ctx, h);
    }
    if (st)
        return st;
    strcat(name, ".ids");
    CHECK(!cfx_allgather_async(ctx, name, &tid, &hid) && !cfx_wait(ctx, hid, 120), "ids");
    CHECK(cfx_handle_output_copy(ctx, hid, 0, ids, sizeof ids) == CFX_OK, "copy ids");
    cfx_handle_release(ctx, hid);
    for (int i = 0; i < N_ELEMS; i++) {
        double want = 0;
        for (int r = 0; r < size; r++)
            want += contribution(ids[r], step, i);
        CHECK(out[i] == (float)want, "step %d element %d: %g, the members' sum is %g", step, i,
              out[i], want);
    }
    return CFX_OK;
}

static cfx_reform_options options(int min_size)
{
    cfx_reform_options o;
    CHECK(cfx_reform_options_init(&o, CFX_REFORM_OPTIONS_VERSION) == CFX_OK, "options");
    o.min_size = min_size;
    o.timeout_s = 30;
    o.settle_s = 15;
    return o;
}

static cfx_context *join(int min_size)
{
    cfx_reform_options o = options(min_size);
    cfx_context *ctx = NULL;
    CHECK(cfx_elastic_init(NULL, &o, &ctx) == CFX_OK, "cfx_elastic_init");
    return ctx;
}

static int reform50(void)
{
    cfx_context *ctx = join(1);
    int size = cfx_size(ctx);
    cfx_reform_options o = options(size);
    CHECK(step_allreduce(ctx, 0) == CFX_OK, "first world");
    CHECK(cfx_context_reform(ctx, &o) == CFX_OK, "warm-up reform"); /* lazily made things exist */
    CHECK(step_allreduce(ctx, 1) == CFX_OK, "after the warm-up reform");
    int fds = count_entries("/proc/self/fd"), threads = count_entries("/proc/self/task"),
        maps = shm_mappings(), round0 = cfx_membership_round(ctx);
    for (int k = 0; k < 50; k++) {
        /* A tensor only this rank submits: it is pending when the world is formed again. */
        float x = 1;
        int64_t one = 1;
        cfx_tensor t = {.data = &x, .shape = &one, .ndim = 1, .dtype = CFX_FLOAT32, .device = -1};
        char name[64];
        snprintf(name, sizeof name, "alone.%d.%d", cfx_rank(ctx), k);
        cfx_handle h = 0;
        CHECK(cfx_allreduce_async(ctx, name, &t, &x, CFX_OP_SUM, 1.0, 1.0, &h) == CFX_OK, "submit");
        CHECK(cfx_context_reform(ctx, &o) == CFX_OK, "reform %d", k);
        cfx_status hs = cfx_wait(ctx, h, 10);
        CHECK(hs == CFX_ERR_MEMBERSHIP_CHANGED && strstr(cfx_handle_message(ctx, h), name),
              "the pending handle gave %d (%s), not CFX_ERR_MEMBERSHIP_CHANGED naming %s", hs,
              cfx_handle_message(ctx, h), name);
        cfx_handle_release(ctx, h);
        CHECK(cfx_size(ctx) == size && cfx_membership_round(ctx) == round0 + k + 1, "round %d: "
              "size %d, round %d", k, cfx_size(ctx), cfx_membership_round(ctx));
        CHECK(step_allreduce(ctx, k + 2) == CFX_OK, "after reform %d", k);
    }
    int fds2 = count_entries("/proc/self/fd"), threads2 = count_entries("/proc/self/task"),
        maps2 = shm_mappings();
    printf("id %d: after 50 reforms fds %d -> %d, threads %d -> %d, shm mappings %d -> %d\n",
           cfx_member_id(ctx), fds, fds2, threads, threads2, maps, maps2);
    CHECK(fds2 == fds && threads2 == threads && maps2 == maps, "resources grew over 50 reforms");
    CHECK(cfx_shutdown(ctx) == CFX_OK, "shutdown");
    cfx_context_free(ctx);
    return 0;
}

/* The last member dies at DIE_AT (SIGKILL, or exit without shutdown); the others re-form and
 * finish every step; with min_size above what survives, they get the clear error instead. */
static int lose_one(int how_kill, int min_size)
{
    cfx_context *ctx = join(1);
    int first_size = cfx_size(ctx), victim = first_size - 1, me = cfx_member_id(ctx);
    cfx_reform_options o = options(min_size);
    o.timeout_s = 10;
    for (int step = 0; step < STEPS;) {
        if (me == victim && step == DIE_AT) {
            if (how_kill == 2)
                raise(SIGSTOP); /* silent: sockets open, nothing answers (a link down) */
            if (how_kill)
                raise(SIGKILL);
            _exit(3); /* atexit handlers left out as after a crash: the peers see the socket close */
        }
        cfx_status st = step_allreduce(ctx, step);
        if (st == CFX_OK) {
            step++;
            continue;
        }
        double t0 = now_s();
        CHECK(st == CFX_ERR_PEER_LOST || st == CFX_ERR_SHUT_DOWN || st == CFX_ERR_TRANSPORT ||
              st == CFX_ERR_MEMBERSHIP_CHANGED, "step %d failed with %d", step, st);
        st = cfx_context_reform(ctx, &o);
        if (min_size > first_size - 1) {
            CHECK(st == CFX_ERR_MEMBERSHIP_CHANGED && strstr(cfx_last_error(), "minimum"),
                  "below the minimum: status %d", st);
            char lost[32];
            snprintf(lost, sizeof lost, "id %d", victim);
            CHECK(strstr(cfx_last_error(), lost), "the error does not name the lost %s", lost);
            printf("id %d: below the minimum after %.2f s: %s\n", me, now_s() - t0,
                   cfx_last_error());
            cfx_context_free(ctx);
            return 0;
        }
        CHECK(st == CFX_OK, "reform after losing id %d", victim);
        printf("id %d: world formed again in %.2f s: rank %d of %d (round %d)\n", me,
               now_s() - t0, cfx_rank(ctx), cfx_size(ctx), cfx_membership_round(ctx));
        CHECK(cfx_size(ctx) == first_size - 1, "size %d after losing one of %d", cfx_size(ctx),
              first_size);
    }
    CHECK(min_size <= first_size - 1, "no failure was seen");
    CHECK(cfx_size(ctx) == first_size - 1, "the victim never left");
    CHECK(cfx_shutdown(ctx) == CFX_OK, "shutdown");
    cfx_context_free(ctx);
    return 0;
}

/* How many wait for the next round, the most any member saw (cfx_membership_pending is a local
 * look): the members agree before they re-form. `name` must be the same on every member. */
static int32_t agree_pending(cfx_context *ctx, const char *name)
{
    int32_t seen = 0, agreed = 0;
    CHECK(cfx_membership_pending(ctx, &seen) == CFX_OK, "pending");
    int64_t one = 1;
    cfx_tensor t = {.data = &seen, .shape = &one, .ndim = 1, .dtype = CFX_INT32, .device = -1};
    cfx_handle h;
    CHECK(!cfx_allreduce_async(ctx, name, &t, &agreed, CFX_OP_MAX, 1, 1, &h) &&
          !cfx_wait(ctx, h, 60), "agree on who waits (%s)", name);
    cfx_handle_release(ctx, h);
    return agreed;
}

/* The first world has NP members; a newcomer (id NP, started by the launcher later) says hello;
 * the members agree (a max over what each saw) to let it in at the next step. */
static int grow(void)
{
    cfx_context *ctx = join(1);
    int me = cfx_member_id(ctx), first = atoi(getenv("CFX_SIZE"));
    cfx_reform_options o = options(1);
    double give_up = now_s() + 120;
    for (int k = 0; now_s() < give_up && cfx_size(ctx) == first; k++) {
        char name[32];
        snprintf(name, sizeof name, "seen.%d", k);
        if (agree_pending(ctx, name) > 0)
            CHECK(cfx_context_reform(ctx, &o) == CFX_OK, "reform for the newcomer");
        else
            usleep(20000);
    }
    CHECK(cfx_size(ctx) == first + 1, "the newcomer never joined (size %d)", cfx_size(ctx));
    for (int s = 0; s < 3; s++)
        CHECK(step_allreduce(ctx, s) == CFX_OK, "grown world, step %d", s);
    printf("id %d: rank %d of %d after the newcomer joined (round %d)\n", me, cfx_rank(ctx),
           cfx_size(ctx), cfx_membership_round(ctx));
    CHECK(cfx_shutdown(ctx) == CFX_OK, "shutdown");
    cfx_context_free(ctx);
    return 0;
}

/* Three steps in the world this process is in, which must have `want` members; returns 0. */
static int finish(cfx_context *ctx, int want, const char *what)
{
    CHECK(cfx_size(ctx) == want, "%s: a world of %d, not %d", what, cfx_size(ctx), want);
    for (int s = 0; s < 3; s++)
        CHECK(step_allreduce(ctx, 100 + s) == CFX_OK, "%s, step %d", what, s);
    printf("id %d: rank %d of %d %s (round %d)\n", cfx_member_id(ctx), cfx_rank(ctx),
           cfx_size(ctx), what, cfx_membership_round(ctx));
    CHECK(cfx_shutdown(ctx) == CFX_OK, "shutdown");
    cfx_context_free(ctx);
    return 0;
}

/* The members train LATE_DELAY_S past the newcomer's hello before they check (as between two
 * commits), far past its settle time: the newcomer must wait for them, not lead a world of its
 * own. Everyone ends in one world of NP + 1. */
static int late(void)
{
    int first = atoi(getenv("CFX_SIZE"));
    cfx_reform_options o = options(1);
    /* Only the newcomer's own settle time is short: the first world forms with every member, and
     * the members re-form with the usual options. */
    o.settle_s = atoi(getenv("CFX_ELASTIC_ID")) >= first ? LATE_SETTLE_S : o.settle_s;
    cfx_context *ctx = NULL;
    CHECK(cfx_elastic_init(NULL, &o, &ctx) == CFX_OK, "cfx_elastic_init");
    if (cfx_member_id(ctx) < first) {
        CHECK(step_allreduce(ctx, 0) == CFX_OK, "first world");
        int seen = 0;
        for (double give_up = now_s() + 60; !seen && now_s() < give_up; usleep(20000))
            CHECK(cfx_membership_pending(ctx, &seen) == CFX_OK, "pending");
        CHECK(seen == 1, "the newcomer never said hello");
        usleep((useconds_t)(LATE_DELAY_S * 1e6));
        CHECK(cfx_context_reform(ctx, &o) == CFX_OK, "reform for the newcomer");
    }
    return finish(ctx, first + 1, "after the late members let the newcomer in");
}

/* The first world's members take a step and die; newcomers (ids NP..2NP-1, started once they
 * are all reaped) form a world of the NP of them: min_size NP, so that the one that leads waits
 * for the others rather than deciding a world of the first to come. */
static int replace(void)
{
    int first = atoi(getenv("CFX_SIZE"));
    cfx_context *ctx = join(first);
    if (cfx_member_id(ctx) < first) {
        CHECK(step_allreduce(ctx, 0) == CFX_OK, "first world");
        sleep(1); /* every peer has its step's result before the sockets close */
        _exit(3); /* as after a crash: the launcher marks it gone */
    }
    return finish(ctx, first, "in the newcomers' world");
}

/* The last member starts SLOW_START_S after the others, past their settle time: the first world
 * forms without it, and the round leaves it out. It takes part in the next round, and the
 * others, seeing it waiting there (cfx_membership_pending), let it back in at their next check:
 * everyone ends in one world of NP. (It used to wait in that round, counted by nobody: its id is
 * no newcomer's.) Any member that came too late under load comes back the same way. */
static int slow_start(void)
{
    int first = atoi(getenv("CFX_SIZE"));
    cfx_reform_options o = options(1);
    o.settle_s = LATE_SETTLE_S;
    cfx_context *ctx = NULL;
    CHECK(cfx_elastic_init(NULL, &o, &ctx) == CFX_OK, "cfx_elastic_init");
    int round = cfx_membership_round(ctx);
    for (int k = 0; cfx_size(ctx) < first; k++) {
        CHECK(k < 6000, "nobody came back in 120 s (size %d)", cfx_size(ctx));
        char name[32];
        snprintf(name, sizeof name, "seen.r%d.%d", round, k); /* k counts from this round on */
        if (agree_pending(ctx, name) > 0) {
            CHECK(cfx_context_reform(ctx, &o) == CFX_OK, "reform for the late member");
            round = cfx_membership_round(ctx);
            k = -1;
        } else {
            usleep(20000);
        }
    }
    return finish(ctx, first, "after the late member came back");
}

/* The last member is marked gone (as a driver does for a host it wrote off) while it still
 * runs; every member then re-forms. The others form a world without it; its own reform fails at
 * once with CFX_ERR_MEMBERSHIP_CHANGED saying it is marked gone. */
static int marked_gone(void)
{
    cfx_context *ctx = join(1);
    int first = cfx_size(ctx), me = cfx_member_id(ctx);
    cfx_reform_options o = options(1);
    CHECK(step_allreduce(ctx, 0) == CFX_OK, "first world");
    if (me == first - 1) {
        cx_store *store = NULL;
        char key[64];
        snprintf(key, sizeof key, "elastic/gone/%d", me);
        CHECK(cx_store_file_create(getenv("CFX_RENDEZVOUS_DIR"), &store) == CFX_OK &&
              cx_store_set(store, key, "1", 1) == CFX_OK, "mark gone");
        cx_store_destroy(store);
        double t0 = now_s();
        cfx_status st = cfx_context_reform(ctx, &o);
        CHECK(st == CFX_ERR_MEMBERSHIP_CHANGED && strstr(cfx_last_error(), "marked gone"),
              "the member marked gone: status %d after %.1f s", st, now_s() - t0);
        CHECK(now_s() - t0 < o.settle_s, "the member marked gone waited %.1f s to hear it",
              now_s() - t0);
        printf("id %d: marked gone, told in %.2f s: %s\n", me, now_s() - t0, cfx_last_error());
        cfx_context_free(ctx);
        return 0;
    }
    CHECK(cfx_context_reform(ctx, &o) == CFX_OK, "reform without the member marked gone");
    return finish(ctx, first - 1, "without the member marked gone");
}

/* The last member leaves its world, says hello to the next round itself (no transport follows),
 * waits until the round decided a world that includes it, and exits as if stopped there; the
 * launcher marks it gone. The others' reform must still give a world of the rest. */
static int gone_forming(void)
{
    cfx_context *ctx = join(1);
    int first = cfx_size(ctx), me = cfx_member_id(ctx);
    CHECK(step_allreduce(ctx, 0) == CFX_OK, "first world");
    if (me == first - 1) {
        /* As a reform does first: the old world ends (its rank 0 waits for every rank's end). */
        int round = cfx_membership_round(ctx) + 1, old_rank = cfx_rank(ctx);
        cfx_context_free(ctx);
        cx_store *store = NULL;
        char key[64], rank[16];
        snprintf(key, sizeof key, "elastic/r%d/hello/%d", round, me);
        snprintf(rank, sizeof rank, "%d", old_rank);
        CHECK(cx_store_file_create(getenv("CFX_RENDEZVOUS_DIR"), &store) == CFX_OK &&
              cx_store_set(store, key, rank, strlen(rank)) == CFX_OK, "hello");
        snprintf(key, sizeof key, "elastic/r%d/decision", round);
        void *text = NULL;
        size_t len = 0;
        CHECK(cx_store_get(store, key, 60, &text, &len) == CFX_OK, "round %d's decision", round);
        char mine[16];
        snprintf(mine, sizeof mine, " %d", me);
        CHECK(len > 2 && !strncmp(text, "ok", 2) && memmem(text, len, mine, strlen(mine)),
              "round %d's decision \"%.*s\" leaves this member out", round, (int)len,
              (const char *)text);
        printf("id %d: in round %d's decision (%.*s); exiting before the world forms\n", me,
               round, (int)len, (const char *)text);
        free(text);
        cx_store_destroy(store);
        _exit(3); /* the launcher marks it gone */
    }
    cfx_reform_options o = options(1);
    double t0 = now_s();
    CHECK(cfx_context_reform(ctx, &o) == CFX_OK, "reform while a member of the round exits");
    printf("id %d: formed round %d without the member that left in %.2f s\n", me,
           cfx_membership_round(ctx), now_s() - t0);
    return finish(ctx, first - 1, "without the member that left as the world formed");
}

static pid_t start(const char *dir, int id, int size, char **argv)
{
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        char v[32];
        snprintf(v, sizeof v, "%d", id);
        setenv("CFX_ELASTIC_ID", v, 1);
        /* A newcomer's launcher rank means nothing (its id says who it is): 0, as cfxrun gives. */
        setenv("CFX_RANK", id < size ? v : "0", 1);
        snprintf(v, sizeof v, "%d", size);
        setenv("CFX_SIZE", v, 1);
        setenv("CFX_RENDEZVOUS_DIR", dir, 1);
        setenv("CFX_TRANSPORT", "gloo", 1);
        setenv("CFX_TRANSPORT_TIMEOUT_S", "10", 0);
        setenv("CFX_ELASTIC_CHILD", argv[1], 1);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    return pid;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc != 3) {
        fprintf(stderr, "usage: %s reform50|kill|exit|stop|grow|below_min|late|replace|slow_start|marked_gone|gone_forming NP\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    if (!(cfx_features() & CFX_FEATURE_GLOO)) {
        printf("this build has no Gloo transport: elastic worlds cannot be tested\n");
        return 1; /* registered only with Gloo: reaching here is a failure, not a skip */
    }
    if (getenv("CFX_ELASTIC_CHILD")) {
        int np = atoi(argv[2]);
        if (!strcmp(mode, "reform50"))
            return reform50();
        if (!strcmp(mode, "kill"))
            return lose_one(1, 1);
        if (!strcmp(mode, "exit"))
            return lose_one(0, 1);
        if (!strcmp(mode, "stop"))
            return lose_one(2, 1);
        if (!strcmp(mode, "below_min"))
            return lose_one(1, np);
        if (!strcmp(mode, "grow"))
            return grow();
        if (!strcmp(mode, "late"))
            return late();
        if (!strcmp(mode, "replace"))
            return replace();
        if (!strcmp(mode, "marked_gone"))
            return marked_gone();
        if (!strcmp(mode, "slow_start"))
            return slow_start();
        if (!strcmp(mode, "gone_forming"))
            return gone_forming();
        (void)np;
        return 2;
    }
    /* The launcher. */
    int np = atoi(argv[2]);
    CHECK(np >= 2 && np <= 8, "NP %d", np);
    char dir[] = "/tmp/cfx-elastic-XXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    cx_store *store = NULL;
    CHECK(cx_store_file_create(dir, &store) == CFX_OK, "store");
    int replacing = !strcmp(mode, "replace");
    int total = np + (!strcmp(mode, "grow") || !strcmp(mode, "late")) + (replacing ? np : 0);
    pid_t pids[16];
    int slow = !strcmp(mode, "slow_start");
    for (int i = 0; i < np; i++) {
        if (slow && i == np - 1)
            sleep(SLOW_START_S); /* the others' first world forms without it */
        pids[i] = start(dir, i, np, argv);
    }
    if (total > np && !replacing) {
        sleep(2); /* the first world trains a while before the newcomer comes */
        pids[np] = start(dir, np, np, argv);
    }
    int stop = !strcmp(mode, "stop");
    int exits = !strcmp(mode, "exit") || !strcmp(mode, "gone_forming"); /* status 3, no signal */
    int victim = (!strcmp(mode, "kill") || exits || !strcmp(mode, "below_min") || stop) ? np - 1
                                                                                       : -1;
    int failures = 0;
    for (int left = total; left > 0; left--) {
        int status;
        if (stop && left == 1) /* the survivors are done: end the silent one */
            kill(pids[victim], SIGKILL);
        pid_t pid = wait(&status);
        CHECK(pid > 0, "wait");
        int id = 0;
        while (id < total && pids[id] != pid)
            id++;
        int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok) { /* as cfxrun --elastic does: the rounds stop waiting for it */
            char key[64];
            snprintf(key, sizeof key, "elastic/gone/%d", id);
            cx_store_set(store, key, "1", 1);
        }
        if (id == victim || (replacing && id < np)) {
            int want_kill = !exits && !replacing;
            CHECK(want_kill ? (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                            : (WIFEXITED(status) && WEXITSTATUS(status) == 3),
                  "the victim ended with status %#x", status);
        } else if (!ok) {
            fprintf(stderr, "member id %d failed (status %#x)\n", id, status);
            failures++;
        }
        if (replacing && left == total - np + 1) /* the first world is gone: newcomers come */
            for (int i = np; i < total; i++)
                pids[i] = start(dir, i, np, argv);
    }
    cx_store_destroy(store);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("%s np %d: %s\n", mode, np, failures ? "FAILED" : "passed");
    return failures ? 1 : 0;
}
