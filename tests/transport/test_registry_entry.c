/*
 * test_registry_entry - docs/architecture.md "Adding a transport", done: a transport added by its
 * file (threads_transport.c) and one registry line (CMakeLists.txt adds it to a copy of
 * transport/registry.c, which this program links instead of the library's) is
 *   1. reported by cfx_features (its bit) and named for that bit by the registry;
 *   2. named in the handshake (a table where one rank lacks it: the warning names "threads");
 *   3. selected by CFX_TRANSPORT through cfx_init (a world of one through a file store), and
 *      cfx_transport_name says so;
 *   4. usable elastically: three thread ranks form a world over it in membership rounds
 *      (CFX_TRANSPORT=threads, each rank's own launch read through its own lookup), reduce, let a
 *      newcomer in at a reform and reduce over four, every result checked.
 * Prints "ok ..." per part; exit status 0 when all pass.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "engine/context.h"
#include "engine/membership.h"
#include "protocol/handshake.h"
#include "transport/registry.h"

#define THREADS_FEATURE (1u << 20) /* the registry line's feature bit */
#define OLD 3                      /* the first world's ranks; one newcomer joins them */
#define N 64

static atomic_int failures; /* member threads count theirs too */
#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);        \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, " (last error: %s)\n", cfx_last_error());                        \
            failures++;                                                                      \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

static char root[] = "/tmp/cfx-threads-XXXXXX";
static char dir[sizeof root + 16]; /* the store's directory of each part */

/* ---- 1. cfx_features ---- */
static int features(void)
{
    CHECK(cfx_features() & THREADS_FEATURE, "cfx_features() = %#x", cfx_features());
    const char *name = cx_transport_feature_name(THREADS_FEATURE);
    CHECK(name && !strcmp(name, "threads"), "feature name %s", name ? name : "(none)");
    const cx_transport_entry *e = cx_transport_by_name("THREADS");
    CHECK(e && e->kind == 100 && (e->caps & CX_ENTRY_ELASTIC), "registry entry");
    printf("ok cfx_features reports the threads transport's bit\n");
    return 0;
}

/* ---- 2. the handshake ---- */
static int handshake(void)
{
    cx_config cfg;
    CHECK(cx_config_load(&cfg, NULL) == CFX_OK, "config");
    cx_hello all[2];
    cx_hello_self(&cfg, &all[0]);
    CHECK(all[0].features & THREADS_FEATURE, "the hello has the bit");
    all[1] = all[0];
    all[1].features &= ~THREADS_FEATURE; /* a rank of a build without it */
    FILE *f = tmpfile();
    CHECK(f != NULL, "tmpfile");
    cx_logger log = {.level = CX_LOG_WARNING, .rank = 0, .fd = fileno(f), .owns_fd = 0};
    CHECK(cx_hello_verdict(all, 2, 0, &log) == CFX_OK, "a feature differs: going on");
    char text[4096] = "";
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    CHECK(strstr(text, "+threads"), "the warning names the transport: %s", text);
    printf("ok the handshake names it: %s", text);
    return 0;
}

/* ---- 3. CFX_TRANSPORT through cfx_init ---- */
static int selected(void)
{
    setenv("CFX_TRANSPORT", "threads", 1);
    setenv("CFX_RANK", "0", 1);
    setenv("CFX_SIZE", "1", 1);
    setenv("CFX_RENDEZVOUS_DIR", dir, 1);
    cfx_context *ctx = NULL;
    cfx_status st = cfx_init(NULL, &ctx);
    unsetenv("CFX_TRANSPORT");
    unsetenv("CFX_RANK");
    unsetenv("CFX_SIZE");
    unsetenv("CFX_RENDEZVOUS_DIR");
    CHECK(st == CFX_OK, "cfx_init with CFX_TRANSPORT=threads: %d", st);
    const char *name = cfx_transport_name(ctx);
    CHECK(name && !strcmp(name, "threads"), "cfx_transport_name: %s", name ? name : "(null)");
    float x = 3;
    int64_t one = 1;
    cfx_tensor t = {.data = &x, .shape = &one, .ndim = 1, .dtype = CFX_FLOAT32, .device = -1};
    cfx_handle h;
    CHECK(!cfx_allreduce_async(ctx, "one", &t, &x, CFX_OP_SUM, 1, 1, &h) && !cfx_wait(ctx, h, 30),
          "allreduce");
    cfx_handle_release(ctx, h);
    CHECK(x == 3, "a world of one sums to itself: %g", x);
    cfx_context_free(ctx);
    printf("ok CFX_TRANSPORT=threads selects it (cfx_transport_name: %s)\n", name);
    return 0;
}

/* ---- 4. elastic, thread ranks ---- */
typedef struct member {
    int id, first_size;
    char vars[8][96];
    const char *list[9];
    int failed;
} member;

static atomic_int first_world_done; /* the old members reduced in round 1 */

static const char *lookup(const char *name, void *user)
{
    member *m = user;
    size_t n = strlen(name);
    for (const char *const *v = m->list; *v; v++)
        if (!strncmp(*v, name, n) && (*v)[n] == '=')
            return *v + n + 1;
    return NULL;
}

/* What member `id` contributes at `step`. */
static float value(int id, int step, int i) { return (float)((id + 1) * (step + 1) + i); }

static int reduce(cfx_context *ctx, int step)
{
    int size = cfx_size(ctx), me = cfx_member_id(ctx);
    float in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = value(me, step, i);
    int32_t myid = me, ids[16];
    int64_t shape = N, one = 1;
    cfx_tensor t = {.data = in, .shape = &shape, .ndim = 1, .dtype = CFX_FLOAT32, .device = -1};
    cfx_tensor tid = {.data = &myid, .shape = &one, .ndim = 1, .dtype = CFX_INT32, .device = -1};
    char name[64];
    snprintf(name, sizeof name, "step%d.r%d", step, cfx_membership_round(ctx));
    cfx_handle h, hid;
    CHECK(!cfx_allreduce_async(ctx, name, &t, out, CFX_OP_SUM, 1, 1, &h) &&
          !cfx_wait(ctx, h, 60), "allreduce %s", name);
    cfx_handle_release(ctx, h);
    strcat(name, ".ids");
    CHECK(!cfx_allgather_async(ctx, name, &tid, &hid) && !cfx_wait(ctx, hid, 60), "ids");
    CHECK(!cfx_handle_output_copy(ctx, hid, 0, ids, sizeof ids), "copy ids");
    cfx_handle_release(ctx, hid);
    for (int i = 0; i < N; i++) {
        double want = 0;
        for (int r = 0; r < size; r++)
            want += value(ids[r], step, i);
        CHECK(out[i] == (float)want, "step %d element %d: %g, want %g", step, i, out[i], want);
    }
    return 0;
}

static int member_main(member *m)
{
    snprintf(m->vars[0], 96, "CFX_TRANSPORT=threads");
    snprintf(m->vars[1], 96, "CFX_RANK=%d", m->id < m->first_size ? m->id : 0);
    snprintf(m->vars[2], 96, "CFX_SIZE=%d", m->first_size);
    snprintf(m->vars[3], 96, "CFX_ELASTIC_ID=%d", m->id);
    snprintf(m->vars[4], 96, "CFX_RENDEZVOUS_DIR=%s", dir);
    snprintf(m->vars[5], 96, "CFX_ELASTIC_SETTLE_S=5");
    snprintf(m->vars[6], 96, "CFX_ELASTIC_TIMEOUT_S=60");
    for (int i = 0; i < 7; i++)
        m->list[i] = m->vars[i];
    m->list[7] = NULL;
    cx_config cfg;
    CHECK(cx_config_load_from(&cfg, NULL, lookup, m) == CFX_OK, "config of id %d", m->id);
    /* What cfx_elastic_init does, with this thread's own launch. */
    cfx_reform_options o = {.version = CFX_REFORM_OPTIONS_VERSION, .min_size = 1,
                            .max_size = 0, .timeout_s = cfg.elastic.timeout_s,
                            .settle_s = cfg.elastic.settle_s};
    cx_membership *ms = NULL;
    cfx_context *ctx = NULL;
    CHECK(cx_membership_open(&cfg, &ms) == CFX_OK, "membership of id %d", m->id);
    CHECK(cx_context_create_elastic(ms, &cfg, &o, &ctx) == CFX_OK, "elastic init of id %d", m->id);
    CHECK(!strcmp(cfx_transport_name(ctx), "threads"), "transport %s", cfx_transport_name(ctx));
    if (m->id < m->first_size) {
        CHECK(cfx_size(ctx) == m->first_size, "first world of %d", cfx_size(ctx));
        if (reduce(ctx, 0))
            return 1;
        atomic_fetch_add(&first_world_done, 1);
        /* Wait for the newcomer: every rank agrees (MAX) on what it saw, then all reform. */
        for (int k = 0; cfx_size(ctx) == m->first_size && k < 3000; k++) {
            int32_t seen = 0, agreed = 0;
            CHECK(cfx_membership_pending(ctx, &seen) == CFX_OK, "pending");
            int64_t one = 1;
            cfx_tensor t = {.data = &seen, .shape = &one, .ndim = 1, .dtype = CFX_INT32,
                            .device = -1};
            cfx_handle h;
            char name[32];
            snprintf(name, sizeof name, "seen.%d", k);
            CHECK(!cfx_allreduce_async(ctx, name, &t, &agreed, CFX_OP_MAX, 1, 1, &h) &&
                  !cfx_wait(ctx, h, 60), "agree on newcomers");
            cfx_handle_release(ctx, h);
            if (agreed > 0)
                CHECK(cfx_context_reform(ctx, &o) == CFX_OK, "reform for the newcomer");
            else
                usleep(20000);
        }
    }
    CHECK(cfx_size(ctx) == m->first_size + 1, "the grown world has %d ranks", cfx_size(ctx));
    CHECK(!strcmp(cfx_transport_name(ctx), "threads"), "transport after reform");
    for (int s = 1; s <= 2; s++)
        if (reduce(ctx, s))
            return 1;
    CHECK(cfx_shutdown(ctx) == CFX_OK, "shutdown");
    cfx_context_free(ctx);
    return 0;
}

static void *member_thread(void *arg)
{
    member *m = arg;
    m->failed = member_main(m);
    return NULL;
}

static int elastic(void)
{
    member ms[OLD + 1];
    pthread_t th[OLD + 1];
    memset(ms, 0, sizeof ms);
    for (int i = 0; i <= OLD; i++) {
        ms[i].id = i;
        ms[i].first_size = OLD;
    }
    for (int i = 0; i < OLD; i++)
        pthread_create(&th[i], NULL, member_thread, &ms[i]);
    for (int w = 0; atomic_load(&first_world_done) < OLD && w < 6000; w++)
        usleep(10000);
    pthread_create(&th[OLD], NULL, member_thread, &ms[OLD]); /* the newcomer */
    int failed = 0;
    for (int i = 0; i <= OLD; i++) {
        pthread_join(th[i], NULL);
        failed += ms[i].failed;
    }
    CHECK(failed == 0, "%d member(s) failed", failed);
    printf("ok %d thread ranks formed a world over it in membership rounds, and a newcomer "
           "joined at a reform\n", OLD);
    return 0;
}

int main(void)
{
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(dir, sizeof dir, "%s/world", root);
    int bad = features() + handshake() + selected();
    snprintf(dir, sizeof dir, "%s/elastic", root); /* a store of its own for the elastic job */
    bad += elastic();
    char cmd[sizeof root + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    printf("%s\n", bad || failures ? "FAILED" : "all passed");
    return bad || failures ? 1 : 0;
}
