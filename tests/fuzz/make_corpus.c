/*
 * make_corpus - writes the fuzz targets' seed inputs from real messages: jobs of 3 thread ranks
 * run real collectives through the engine over a transport that records every request list the
 * ranks send, every response list and handshake table rank 0 broadcasts; a few inputs the jobs do
 * not produce (a list carrying autotuned settings, a rank with no handshake) are made with the
 * encoder from recorded ones, as are the current encoding of the regression inputs (a shape
 * whose size overflows); the configuration seeds are the documented variables and options.
 *
 *   make_corpus OUTDIR      writes OUTDIR/{wire,handshake,config}/seed-*
 *
 * Regenerate the committed corpus with: <build>/tests/fuzz/make_corpus tests/fuzz/corpus
 * (inputs named regress-* are kept crash inputs, never overwritten).
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "engine/context.h"
#include "fuzz_config_input.h"
#include "protocol/gradset_wire.h"
#include "protocol/handshake.h"
#include "protocol/wire.h"
#include "transport/transport_local.h"

#define RANKS 3

/* ---- the recorder ----------------------------------------------------------------------------- */

static pthread_mutex_t rec_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *outdir, *scenario;
static uint64_t seen[4096];
static size_t nseen;
static int written;
/* The latest non-empty request and response lists, for derived inputs. */
static uint8_t last_requests[65536], last_responses[65536];
static size_t last_requests_len, last_responses_len;

static uint64_t fnv(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void write_input(const char *target, const char *kind, const void *prefix, size_t plen,
                        const void *data, size_t len)
{
    uint64_t h = fnv(data, len) ^ fnv(prefix, plen);
    pthread_mutex_lock(&rec_mu);
    for (size_t i = 0; i < nseen; i++)
        if (seen[i] == h) {
            pthread_mutex_unlock(&rec_mu);
            return;
        }
    if (nseen < sizeof seen / sizeof seen[0])
        seen[nseen++] = h;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/seed-%s-%s-%016llx", outdir, target, scenario, kind,
             (unsigned long long)h);
    FILE *f = fopen(path, "wb");
    if (!f || (plen && fwrite(prefix, 1, plen, f) != plen) || (len && fwrite(data, 1, len, f) != len)) {
        fprintf(stderr, "make_corpus: cannot write %s: %s\n", path, strerror(errno));
        exit(1);
    }
    fclose(f);
    written++;
    pthread_mutex_unlock(&rec_mu);
}

static uint32_t magic_of(const void *data, size_t len)
{
    uint32_t m = 0;
    if (len >= 4)
        memcpy(&m, data, 4);
    return m;
}

static void keep_last(uint8_t *buf, size_t *buf_len, const void *data, size_t len)
{
    pthread_mutex_lock(&rec_mu);
    if (len > 16 && len <= sizeof last_requests) { /* not an empty list */
        memcpy(buf, data, len);
        *buf_len = len;
    }
    pthread_mutex_unlock(&rec_mu);
}

static void record(const void *data, size_t len)
{
    uint8_t size_byte = RANKS - 1; /* fuzz_handshake: job size = 1 + byte % 64 */
    switch (magic_of(data, len)) {
    case 0x43465251u:
        write_input("wire", "requests", NULL, 0, data, len);
        keep_last(last_requests, &last_requests_len, data, len);
        break;
    case 0x43465253u:
        write_input("wire", "responses", NULL, 0, data, len);
        keep_last(last_responses, &last_responses_len, data, len);
        break;
    case 0x54584643u: write_input("handshake", "table", &size_byte, 1, data, len); break;
    default: break; /* the agreed settings, hello records (inside the table) */
    }
}

/* ---- a transport that records, forwarding to the local one -------------------------------------- */

typedef struct rec_transport {
    cx_transport base;
    cx_transport *inner;
} rec_transport;

static cx_transport *inner(cx_transport *t) { return ((rec_transport *)t)->inner; }

static cfx_status rec_gather(cx_transport *t, const void *send, size_t len, void **recv_out,
                             size_t *lens_out)
{
    record(send, len);
    return inner(t)->ops->gather_bytes(inner(t), send, len, recv_out, lens_out);
}

static cfx_status rec_bcast(cx_transport *t, void **buf, size_t *len, int root)
{
    if (t->rank == root)
        record(*buf, *len);
    return inner(t)->ops->bcast_bytes(inner(t), buf, len, root);
}

static cfx_status rec_and(cx_transport *t, uint64_t *words, size_t count)
{
    return inner(t)->ops->allreduce_and(inner(t), words, count);
}

static cfx_status rec_allreduce(cx_transport *t, void *buf, size_t count, cfx_dtype dtype,
                                cfx_reduce_op op)
{
    return inner(t)->ops->allreduce(inner(t), buf, count, dtype, op);
}

static cfx_status rec_allgatherv(cx_transport *t, const void *send, size_t send_bytes, void *recv,
                                 const size_t *recv_bytes, const size_t *displs)
{
    return inner(t)->ops->allgatherv(inner(t), send, send_bytes, recv, recv_bytes, displs);
}

static cfx_status rec_broadcast(cx_transport *t, void *buf, size_t bytes, int root)
{
    return inner(t)->ops->broadcast(inner(t), buf, bytes, root);
}

static cfx_status rec_alltoallv(cx_transport *t, const void *send, const size_t *send_bytes,
                                const size_t *sdispls, void *recv, const size_t *recv_bytes,
                                const size_t *rdispls)
{
    return inner(t)->ops->alltoallv(inner(t), send, send_bytes, sdispls, recv, recv_bytes, rdispls);
}

static cfx_status rec_reduce_scatter(cx_transport *t, const void *send, void *recv,
                                     const size_t *counts, cfx_dtype dtype, cfx_reduce_op op)
{
    return inner(t)->ops->reduce_scatter(inner(t), send, recv, counts, dtype, op);
}

static cfx_status rec_barrier(cx_transport *t) { return inner(t)->ops->barrier(inner(t)); }

static void rec_destroy(cx_transport *t)
{
    inner(t)->ops->destroy(inner(t));
    free(t);
}

static const cx_transport_ops rec_ops = {
    .name = "local",
    .gather_bytes = rec_gather,
    .bcast_bytes = rec_bcast,
    .allreduce_and = rec_and,
    .allreduce = rec_allreduce,
    .allgatherv = rec_allgatherv,
    .broadcast = rec_broadcast,
    .alltoallv = rec_alltoallv,
    .reduce_scatter = rec_reduce_scatter,
    .barrier = rec_barrier,
    .cross_allreduce = NULL,
    .destroy = rec_destroy,
};

/* ---- jobs --------------------------------------------------------------------------------------- */

typedef int (*job_fn)(cfx_context *ctx, int rank);

typedef struct rank_job {
    cx_local_world *world;
    int rank;
    job_fn fn;
    const char *claim; /* CFX_TEST_WIRE_VERSION of rank 1, or NULL */
    int result;
} rank_job;

static void fail(const char *what, int rank)
{
    fprintf(stderr, "make_corpus: %s: rank %d: %s: %s\n", scenario, rank, what, cfx_last_error());
    exit(1);
}

static void *rank_main(void *p)
{
    rank_job *j = p;
    cx_config cfg;
    if (cx_config_load(&cfg, NULL) != CFX_OK)
        fail("config", j->rank);
    cfg.log_level = CX_LOG_OFF;
    if (j->claim && j->rank == 1)
        sscanf(j->claim, "%d.%d", &cfg.test.wire_major, &cfg.test.wire_minor);
    cx_transport *local;
    if (cx_transport_local_create(j->world, j->rank, &local) != CFX_OK)
        fail("transport", j->rank);
    rec_transport *t = calloc(1, sizeof *t);
    t->base = *local;
    t->base.ops = &rec_ops;
    t->inner = local;
    cfx_context *ctx;
    cfx_status st = cx_context_create(&t->base, &cfg, &ctx);
    if (st) { /* a job meant to fail the handshake */
        j->result = st;
        return NULL;
    }
    if (j->fn)
        j->result = j->fn(ctx, j->rank);
    cfx_shutdown(ctx);
    cfx_context_free(ctx);
    return NULL;
}

static int run_job(const char *name, job_fn fn, const char *claim)
{
    scenario = name;
    cx_local_world *w;
    if (cx_local_world_create(RANKS, &w) != CFX_OK)
        fail("world", -1);
    rank_job jobs[RANKS];
    pthread_t threads[RANKS];
    for (int r = 0; r < RANKS; r++) {
        jobs[r] = (rank_job){w, r, fn, claim, 0};
        pthread_create(&threads[r], NULL, rank_main, &jobs[r]);
    }
    int result = 0;
    for (int r = 0; r < RANKS; r++) {
        pthread_join(threads[r], NULL);
        if (jobs[r].result)
            result = jobs[r].result;
    }
    cx_local_world_release(w);
    return result;
}

static cfx_status wait_release(cfx_context *ctx, cfx_handle h)
{
    cfx_status st = cfx_wait(ctx, h, 60);
    cfx_handle_release(ctx, h);
    return st;
}

#define MUST(expr)                 \
    do {                           \
        if ((expr) != CFX_OK)      \
            fail(#expr, rank);     \
    } while (0)

static int job_allreduce(cfx_context *ctx, int rank)
{
    float a[64], b[7];
    int32_t c[5];
    uint16_t h[9];
    int64_t sa[2] = {8, 8}, sb[1] = {7}, sc[1] = {5}, sh[3] = {1, 3, 3};
    for (int step = 0; step < 3; step++) { /* later steps take the response cache */
        cfx_tensor ta = {a, sa, 2, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_tensor tb = {b, sb, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
        cfx_tensor tc = {c, sc, 1, CFX_INT32, CFX_DEVICE_CPU, NULL};
        cfx_tensor th = {h, sh, 3, CFX_FLOAT16, CFX_DEVICE_CPU, NULL};
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        memset(c, 0, sizeof c);
        memset(h, 0, sizeof h);
        cfx_handle ha, hb, hc, hh, hg;
        MUST(cfx_allreduce_async(ctx, "layer1.weight", &ta, NULL, CFX_OP_SUM, 1.0, 1.0, &ha));
        MUST(cfx_allreduce_async(ctx, "layer1.bias", &tb, NULL, CFX_OP_AVERAGE, 0.5, 2.0, &hb));
        MUST(cfx_allreduce_async(ctx, "steps", &tc, NULL, CFX_OP_MIN, 1.0, 1.0, &hc));
        MUST(cfx_allreduce_async(ctx, "half", &th, NULL, CFX_OP_MAX, 1.0, 1.0, &hh));
        cfx_tensor group[2] = {tb, tc};
        group[1].dtype = CFX_FLOAT32;
        group[1].data = a;
        MUST(cfx_grouped_allreduce_async(ctx, "grads", 2, group, NULL, CFX_OP_SUM, 1.0, 0.25, &hg));
        MUST(wait_release(ctx, ha));
        MUST(wait_release(ctx, hb));
        MUST(wait_release(ctx, hc));
        MUST(wait_release(ctx, hh));
        MUST(wait_release(ctx, hg));
    }
    return 0;
}

static int job_collectives(cfx_context *ctx, int rank)
{
    double in[12], out[12];
    memset(in, 0, sizeof in);
    int64_t rows[2] = {rank + 1, 2}; /* allgather: dim 0 differs per rank */
    cfx_tensor tg = {in, rows, 2, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
    int64_t sq[1] = {6};
    cfx_tensor tq = {in, sq, 1, CFX_FLOAT64, CFX_DEVICE_CPU, NULL};
    int64_t splits[RANKS] = {1, 2, 3};
    cfx_handle h;
    MUST(cfx_allgather_async(ctx, "gathered", &tg, &h));
    MUST(wait_release(ctx, h));
    MUST(cfx_broadcast_async(ctx, "params", &tq, 1, &h));
    MUST(wait_release(ctx, h));
    MUST(cfx_alltoall_async(ctx, "exchanged", &tq, splits, RANKS, &h));
    MUST(wait_release(ctx, h));
    MUST(cfx_reducescatter_async(ctx, "scattered", &tq, CFX_OP_SUM, 1.0, 1.0, &h));
    MUST(wait_release(ctx, h));
    cfx_tensor pair[2] = {tq, tq};
    pair[1].data = out;
    MUST(cfx_grouped_allgather_async(ctx, "pair", 2, pair, &h));
    MUST(wait_release(ctx, h));
    MUST(cfx_barrier_async(ctx, &h));
    MUST(wait_release(ctx, h));
    return 0;
}

static int job_errors(cfx_context *ctx, int rank)
{
    int32_t v[4] = {0};
    int64_t s[1] = {4};
    cfx_tensor t = {v, s, 1, rank == 1 ? CFX_INT32 : CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h;
    MUST(cfx_allreduce_async(ctx, "grad.bad", &t, NULL, CFX_OP_SUM, 1.0, 1.0, &h));
    if (wait_release(ctx, h) != CFX_ERR_MISMATCH)
        fail("the mismatch was not refused", rank);
    return 0;
}

static int job_join(cfx_context *ctx, int rank)
{
    float v[3] = {0};
    int64_t s[1] = {3};
    cfx_tensor t = {v, s, 1, CFX_FLOAT32, CFX_DEVICE_CPU, NULL};
    cfx_handle h, j;
    if (rank != 2) { /* rank 2 has no more data */
        MUST(cfx_allreduce_async(ctx, "tail", &t, NULL, CFX_OP_AVERAGE, 1.0, 1.0, &h));
        MUST(wait_release(ctx, h));
    }
    MUST(cfx_join_async(ctx, &j));
    MUST(wait_release(ctx, j));
    return 0;
}

/* ---- inputs made with the encoder from recorded ones ----------------------------------------- */

/* Writes what an encoder produced into the wire corpus, and frees it. */
static void write_encoded(const char *kind, cfx_status st, cx_bytes *b)
{
    if (st)
        fail("encode", 0);
    write_input("wire", kind, NULL, 0, b->data, b->len);
    cx_bytes_free(b);
}

/* Gives a decoded item a shape whose size in bytes overflows. */
static void overflowing_shape(int32_t *ndim, int64_t *shape)
{
    *ndim = 2;
    shape[0] = 1ll << 62;
    shape[1] = 4;
}

static void derived(void)
{
    scenario = "derived";
    cx_response_list l;
    cx_request_list q;
    if (!last_responses_len || cx_decode_responses(last_responses, last_responses_len, &l) ||
        !last_requests_len || cx_decode_requests(last_requests, last_requests_len, &q))
        fail("no recorded lists to derive from", 0);
    l.flags |= CX_LIST_TUNED; /* what autotune's switch looks like */
    l.tuned_fusion_threshold = 64ll << 20;
    l.tuned_chunk_bytes = 1 << 19;
    l.tuned_cycle_time_ms = 2;
    cx_bytes b = {0};
    write_encoded("tuned", cx_encode_responses(&l, &b), &b);
    /* What regress-*-shape-overflow once were, in the current encoding: a shape whose size
     * overflows, which the decoders must refuse. */
    overflowing_shape(&l.items[0].ndim, l.items[0].shape);
    write_encoded("shape-overflow", cx_encode_responses(&l, &b), &b);
    overflowing_shape(&q.items[0].ndim, q.items[0].shape);
    write_encoded("shape-overflow", cx_encode_requests(&q, &b), &b);
    cx_response_list_free(&l);
    cx_request_list_free(&q);

    /* Handshake tables: a compatible minor mix, and a rank that sent no handshake record. */
    cx_hello h[RANKS];
    cx_bytes recs = {0};
    size_t lens[RANKS];
    for (int r = 0; r < RANKS; r++) {
        cx_config cfg = {.test.wire_major = -1};
        cx_hello_self(&cfg, &h[r]);
        h[r].wire_minor = (uint16_t)r;
        size_t before = recs.len;
        cx_encode_hello(&h[r], &recs);
        lens[r] = recs.len - before;
    }
    uint8_t size_byte = RANKS - 1;
    cx_bytes table = {0};
    cx_encode_hello_table(recs.data, lens, RANKS, &table);
    write_input("handshake", "minors", &size_byte, 1, table.data, table.len);
    cx_bytes_free(&table);
    /* Rank 1 sent seven bytes of something else. */
    uint8_t odd[64];
    memcpy(odd, recs.data, lens[0]);
    memset(odd + lens[0], 'x', 7);
    memcpy(odd + lens[0] + 7, recs.data + lens[0] + lens[1], lens[2]);
    cx_encode_hello_table(odd, (size_t[]){lens[0], 7, lens[2]}, RANKS, &table);
    write_input("handshake", "unreadable", &size_byte, 1, table.data, table.len);
    cx_bytes_free(&table);
    cx_bytes_free(&recs);
}

/* ---- configuration seeds ------------------------------------------------------------------------ */

static void config_seed(const char *kind, const cfx_init_options *o, const char *lines)
{
    uint8_t buf[4096];
    size_t n = 0;
    buf[n++] = o ? FUZZ_CONFIG_OPTIONS | FUZZ_CONFIG_KEEP_VERSION : 0;
    if (o) {
        memcpy(buf + n, o, sizeof *o);
        n += sizeof *o;
    }
    write_input("config", kind, buf, n, lines, strlen(lines));
}

static void configs(void)
{
    scenario = "documented";
    config_seed("defaults", NULL, "");
    config_seed("sizes", NULL, "CFX_FUSION_THRESHOLD=64M\nCFX_CHUNK_BYTES=256KiB\n"
                "CFX_CACHE_CAPACITY=1024\nCFX_TIMELINE_MAX_MB=0.5\n");
    config_seed("times", NULL, "CFX_CYCLE_TIME=0.5\nCFX_STALL_WARNING_S=30\nCFX_STALL_TIMEOUT_S=0\n"
                "CFX_AUTOTUNE_WINDOW_S=0.25\n");
    config_seed("switches", NULL, "CFX_TRANSPORT=local\nCFX_DETERMINISTIC=yes\nCFX_SHM=auto\n"
                "CFX_HIERARCHICAL_ALLREDUCE=off\nCFX_AUTOTUNE=1\nCFX_TIMELINE_MARK_CYCLES=true\n");
    config_seed("paths", NULL, "CFX_LOG_LEVEL=info\nCFX_LOG_FILE=/tmp/cfx.log\n"
                "CFX_TIMELINE=/tmp/tl.json\nCFX_AUTOTUNE_LOG=/tmp/tune.csv\n");
    config_seed("test", NULL, "CFX_TEST_WIRE_VERSION=2.0\n");
    config_seed("bad", NULL, "CFX_CHUNK_BYTES=12Q\n");
    cfx_init_options o;
    cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION);
    config_seed("unset", &o, "");
    o.transport = CFX_TRANSPORT_LOCAL;
    o.fusion_threshold_bytes = 1 << 20;
    o.cycle_time_ms = 0.25;
    o.cache_capacity = 100;
    o.log_level = 2;
    o.deterministic = 1;
    o.stall_warning_s = 5;
    o.stall_timeout_s = 50;
    o.chunk_bytes = 4096;
    config_seed("options", &o, "CFX_CYCLE_TIME=3\nCFX_CHUNK_BYTES=1M\n");
    o.cycle_time_ms = NAN;
    config_seed("nan", &o, "");
    o.cycle_time_ms = 1;
    o.stall_timeout_s = INFINITY;
    config_seed("inf", &o, "");
}

/* Gradient-set registrations (protocol/gradset_wire.h) as cfx_gradset_commit sends them. */
static void gradset_seed(const char *kind, uint32_t compression, const cx_gradset_reg *g,
                         uint32_t n)
{
    uint8_t buf[4096];
    size_t len = 0;
    cx_gradset_wire_header(buf, &len, n, compression);
    for (uint32_t i = 0; i < n; i++)
        cx_gradset_wire_grad(buf, &len, &g[i]);
    write_input("gradset", kind, NULL, 0, buf, len);
}

static void gradsets(void)
{
    scenario = "gradset";
    const cx_gradset_reg cpu[] = {{"fc.weight", 9, CFX_FLOAT32, CFX_DEVICE_CPU, 2, {256, 784}},
                                  {"fc.bias", 7, CFX_FLOAT32, CFX_DEVICE_CPU, 1, {256}},
                                  {"step", 4, CFX_INT64, CFX_DEVICE_CPU, 0, {0}}};
    const cx_gradset_reg cuda[] = {{"conv1.weight", 12, CFX_FLOAT16, 0, 4, {64, 3, 7, 7}},
                                   {"bn1.bias", 8, CFX_BFLOAT16, 0, 1, {64}}};
    gradset_seed("empty", 0, NULL, 0);
    gradset_seed("cpu", 0, cpu, 3);
    gradset_seed("cpu-fp16", 1, cpu, 2);
    gradset_seed("cuda", 0, cuda, 2);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus OUTDIR\n");
        return 2;
    }
    outdir = argv[1];
    const char *targets[] = {"wire", "handshake", "config", "gradset"};
    char path[4096];
    mkdir(outdir, 0755);
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", outdir, targets[i]);
        mkdir(path, 0755);
    }
    char minor[32], major[32]; /* rank 1 claims another minor, then another major */
    snprintf(minor, sizeof minor, "%d.%d", CX_WIRE_VERSION_MAJOR, CX_WIRE_VERSION_MINOR + 7);
    snprintf(major, sizeof major, "%d.0", CX_WIRE_VERSION_MAJOR + 1);
    if (run_job("allreduce", job_allreduce, NULL) || run_job("collectives", job_collectives, NULL) ||
        run_job("errors", job_errors, NULL) || run_job("join", job_join, NULL) ||
        run_job("minor", job_allreduce, minor))
        fail("a job failed", -1);
    if (run_job("major", NULL, major) != CFX_ERR_VERSION)
        fail("ranks claiming two wire protocol majors started", -1);
    derived();
    configs();
    gradsets();
    printf("make_corpus: %d inputs written to %s\n", written, outdir);
    return 0;
}
