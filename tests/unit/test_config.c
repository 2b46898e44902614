/* Unit tests of the configuration: option values that are not finite are refused naming the
 * field (through cfx_init as a caller sees it, and the loader), CFX_* values that would overflow,
 * the test-only wire version, the loader's lookup hook with the options' precedence, the
 * variables once read elsewhere (gradient-set buckets with size suffixes, compression everywhere,
 * the shared pool) and the CFX_TEST_* hooks, malformed values refused naming the variable and the
 * value; across thread ranks, rank 0's bucket size adopted and a difference in
 * CFX_COMPRESSION_EVERYWHERE failing every rank's init naming both ranks and values. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>

#include "base/config.h"
#include "base/error.h"
#include "engine/context.h"
#include "support.h"
#include "transport/registry.h"
#include "transport/transport_local.h"

/* CFX_* variables from a NULL-terminated list of "NAME=VALUE" strings. */
static const char *from_list(const char *name, void *user)
{
    size_t n = strlen(name);
    for (const char *const *v = user; *v; v++)
        if (strncmp(*v, name, n) == 0 && (*v)[n] == '=')
            return *v + n + 1;
    return NULL;
}

static cfx_status load(cx_config *cfg, const cfx_init_options *o, const char *const *vars)
{
    return cx_config_load_from(cfg, o, from_list, (void *)vars);
}

static const char *const no_vars[] = {NULL};

static void nonfinite_options_refused_by_cfx_init(void **state)
{
    (void)state;
    const double bad[] = {NAN, INFINITY, -INFINITY};
    const char *fields[] = {"cycle_time_ms", "stall_warning_s", "stall_timeout_s"};
    for (size_t f = 0; f < 3; f++)
        for (size_t b = 0; b < 3; b++) {
            cfx_init_options o;
            assert_int_equal(cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION), CFX_OK);
            o.transport = CFX_TRANSPORT_LOCAL;
            double *field = f == 0 ? &o.cycle_time_ms : f == 1 ? &o.stall_warning_s : &o.stall_timeout_s;
            *field = bad[b];
            cfx_context *ctx = NULL;
            assert_int_equal(cfx_init(&o, &ctx), CFX_ERR_CONFIG);
            assert_null(ctx);
            char want[64];
            snprintf(want, sizeof want, "options.%s", fields[f]);
            assert_non_null(strstr(cfx_last_error(), want));
            assert_non_null(strstr(cfx_last_error(), "finite"));
        }
    /* Negative finite values still mean "unset", and a finite value is taken. */
    cfx_init_options o;
    cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION);
    o.cycle_time_ms = -1e300;
    o.stall_timeout_s = 7.5;
    cx_config cfg;
    assert_int_equal(load(&cfg, &o, no_vars), CFX_OK);
    assert_true(cfg.cycle_time_ms == 1.0 && cfg.stall_timeout_s == 7.5);
}

static void overflowing_variables_refused(void **state)
{
    (void)state;
    cx_config cfg;
    const char *huge[] = {"CFX_TIMELINE_MAX_MB=1e300", NULL};
    assert_int_equal(load(&cfg, NULL, huge), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_TIMELINE_MAX_MB"));
    const char *edge[] = {"CFX_TIMELINE_MAX_MB=8796093022206", NULL}; /* just fits */
    assert_int_equal(load(&cfg, NULL, edge), CFX_OK);
    assert_true(cfg.timeline_max_bytes == 8796093022206ll << 20);
    const char *nan[] = {"CFX_CYCLE_TIME=nan", NULL};
    assert_int_equal(load(&cfg, NULL, nan), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_CYCLE_TIME"));
    const char *bytes[] = {"CFX_FUSION_THRESHOLD=9000000000G", NULL};
    assert_int_equal(load(&cfg, NULL, bytes), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "too large"));
}

static void test_wire_version(void **state)
{
    (void)state;
    cx_config cfg;
    assert_int_equal(load(&cfg, NULL, no_vars), CFX_OK);
    assert_int_equal(cfg.test.wire_major, -1);
    const char *ok[] = {"CFX_TEST_WIRE_VERSION=2.17", NULL};
    assert_int_equal(load(&cfg, NULL, ok), CFX_OK);
    assert_int_equal(cfg.test.wire_major, 2);
    assert_int_equal(cfg.test.wire_minor, 17);
    const char *bad[] = {"2", "2.", ".1", "x.1", "1.2.3", "65536.0", "1.99999999999", "-1.0", " 1.0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char var[64];
        snprintf(var, sizeof var, "CFX_TEST_WIRE_VERSION=%s", bad[i]);
        const char *vars[] = {var, NULL};
        assert_int_equal(load(&cfg, NULL, vars), CFX_ERR_CONFIG);
        assert_non_null(strstr(cx_error_message(), "CFX_TEST_WIRE_VERSION"));
    }
}

static void lookup_and_precedence(void **state)
{
    (void)state;
    const char *vars[] = {"CFX_CHUNK_BYTES=64K", "CFX_CYCLE_TIME=2.5", "CFX_SHM=0", NULL};
    cx_config cfg;
    assert_int_equal(load(&cfg, NULL, vars), CFX_OK);
    assert_int_equal(cfg.chunk_bytes, 65536);
    assert_true(cfg.cycle_time_ms == 2.5);
    assert_int_equal(cfg.shm, 0);
    cfx_init_options o;
    cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION);
    o.cycle_time_ms = 0.5; /* an option wins over the variable */
    assert_int_equal(load(&cfg, &o, vars), CFX_OK);
    assert_true(cfg.cycle_time_ms == 0.5);
    assert_int_equal(cfg.chunk_bytes, 65536);
}

/* The two-level path's chunk: the transport's by default (0 here); an explicit CFX_CHUNK_BYTES
 * (or the chunk_bytes option) sets it too, and CFX_HIERARCHICAL_CHUNK_BYTES wins over both. */
static void hierarchical_chunk(void **state)
{
    (void)state;
    cx_config cfg;
    assert_int_equal(load(&cfg, NULL, no_vars), CFX_OK);
    assert_true(cfg.chunk_bytes == 1 << 20 && cfg.hierarchical_chunk_bytes == 0);
    const char *chunk[] = {"CFX_CHUNK_BYTES=64K", NULL};
    assert_int_equal(load(&cfg, NULL, chunk), CFX_OK);
    assert_true(cfg.chunk_bytes == 65536 && cfg.hierarchical_chunk_bytes == 65536);
    const char *both[] = {"CFX_HIERARCHICAL_CHUNK_BYTES=2M", "CFX_CHUNK_BYTES=64K", NULL};
    assert_int_equal(load(&cfg, NULL, both), CFX_OK);
    assert_true(cfg.chunk_bytes == 65536 && cfg.hierarchical_chunk_bytes == 2 << 20);
    cfx_init_options o;
    cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION);
    o.chunk_bytes = 4096;
    assert_int_equal(load(&cfg, &o, no_vars), CFX_OK);
    assert_true(cfg.chunk_bytes == 4096 && cfg.hierarchical_chunk_bytes == 4096);
    const char *own[] = {"CFX_HIERARCHICAL_CHUNK_BYTES=2M", NULL}; /* wins over the option too */
    assert_int_equal(load(&cfg, &o, own), CFX_OK);
    assert_true(cfg.chunk_bytes == 4096 && cfg.hierarchical_chunk_bytes == 2 << 20);
    const char *small[] = {"CFX_HIERARCHICAL_CHUNK_BYTES=8", NULL};
    assert_int_equal(load(&cfg, NULL, small), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_HIERARCHICAL_CHUNK_BYTES"));
    cx_config_agreed agreed;
    assert_int_equal(load(&cfg, NULL, both), CFX_OK);
    cx_config_get_agreed(&cfg, &agreed);
    assert_int_equal(load(&cfg, NULL, no_vars), CFX_OK);
    cx_config_set_agreed(&cfg, &agreed); /* rank 0's value reaches the others */
    assert_true(cfg.hierarchical_chunk_bytes == 2 << 20);
}

/* Every malformed value fails the load with CFX_ERR_CONFIG naming the variable and the value. */
static void malformed_values_name_variable_and_value(void **state)
{
    (void)state;
    const char *bad[] = {
        "CFX_GRADSET_BUCKET_BYTES=12x", "CFX_GRADSET_BUCKET_BYTES=-5", "CFX_GRADSET_BUCKET_BYTES=0",
        "CFX_GRADSET_BUCKET_BYTES=4Q", "CFX_COMPRESSION_EVERYWHERE=2",
        "CFX_COMPRESSION_EVERYWHERE=maybe", "CFX_TEST_FAIL=x:pre", "CFX_TEST_FAIL=64:pre",
        "CFX_TEST_FAIL=1:pre:later", "CFX_TEST_FAIL=1", "CFX_TEST_FAIL=1:", "CFX_TEST_LOCAL_SIZE=two",
        "CFX_TEST_LOCAL_SIZE=-1", "CFX_TEST_DIRECT_MAP_FAIL=64", "CFX_TEST_DIRECT_MAP_FAIL=1x",
        "CFX_TEST_DEVICE_PATH=cuda", "CFX_HIERARCHICAL_CHUNK_BYTES=3Q"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *vars[] = {bad[i], NULL};
        cx_config cfg;
        char name[64];
        const char *eq = strchr(bad[i], '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - bad[i]), bad[i]);
        cfx_status st = load(&cfg, NULL, vars);
        if (st != CFX_ERR_CONFIG || !strstr(cx_error_message(), name) ||
            !strstr(cx_error_message(), eq + 1))
            fail_msg("%s: status %d, message \"%s\"; want CFX_ERR_CONFIG naming %s and %s", bad[i],
                     (int)st, cx_error_message(), name, eq + 1);
    }
}

static void sizes_booleans_and_hooks_parsed(void **state)
{
    (void)state;
    cx_config cfg;
    assert_int_equal(load(&cfg, NULL, no_vars), CFX_OK);
    assert_true(cfg.gradset_bucket_bytes == 25ll << 20); /* the documented default */
    assert_int_equal(cfg.compression_everywhere, 0);
    assert_true(cfg.test.local_size == 0 && cfg.test.direct_map_fail == 0 &&
                cfg.test.device_path[0] == '\0' && cfg.test.fail.prefix[0] == '\0');
    const struct {
        const char *var;
        int64_t bytes;
    } sizes[] = {{"CFX_GRADSET_BUCKET_BYTES=1000", 1000}, {"CFX_GRADSET_BUCKET_BYTES=16M", 16 << 20},
                 {"CFX_GRADSET_BUCKET_BYTES=4KiB", 4096}, {"CFX_GRADSET_BUCKET_BYTES=1g", 1 << 30},
                 {"CFX_GRADSET_BUCKET_BYTES=2MB", 2 << 20}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const char *vars[] = {sizes[i].var, NULL};
        assert_int_equal(load(&cfg, NULL, vars), CFX_OK);
        assert_true(cfg.gradset_bucket_bytes == sizes[i].bytes);
    }
    const char *hooks[] = {"CFX_COMPRESSION_EVERYWHERE=yes", "CFX_TEST_FAIL=1,3:ab.:done",
                           "CFX_TEST_LOCAL_SIZE=2", "CFX_TEST_DIRECT_MAP_FAIL=1",
                           "CFX_TEST_DEVICE_PATH=staged", NULL};
    assert_int_equal(load(&cfg, NULL, hooks), CFX_OK);
    assert_int_equal(cfg.compression_everywhere, 1);
    assert_true(cfg.test.fail.ranks == ((1u << 1) | (1u << 3)));
    assert_int_equal(cfg.test.fail.phase, 2);
    assert_string_equal(cfg.test.fail.prefix, "ab.");
    assert_int_equal(cfg.test.local_size, 2);
    assert_true(cfg.test.direct_map_fail == 1u << 1);
    assert_string_equal(cfg.test.device_path, "staged");
    const char *ready[] = {"CFX_TEST_FAIL=0:x", NULL};
    assert_int_equal(load(&cfg, NULL, ready), CFX_OK);
    assert_true(cfg.test.fail.ranks == 1 && cfg.test.fail.phase == 1);
}

/* CFX_SHARED_POOL_BYTES is read by cfx_alloc, which may come before any context
 * (cx_config_env_bytes through the lookup the entry point gives), and once per init into the
 * configuration (with the launch, the deadlines and the elastic defaults). */
static void process_wide_bytes(void **state)
{
    (void)state;
    int64_t v = 7;
    unsetenv("CFX_TEST_ENV_BYTES");
    assert_int_equal(cx_config_env_bytes(cx_config_environment, NULL, "CFX_TEST_ENV_BYTES", 4096,
                                         &v), CFX_OK);
    assert_true(v == 7); /* unset: untouched */
    setenv("CFX_TEST_ENV_BYTES", "8K", 1);
    assert_int_equal(cx_config_env_bytes(cx_config_environment, NULL, "CFX_TEST_ENV_BYTES", 4096,
                                         &v), CFX_OK);
    assert_true(v == 8192);
    setenv("CFX_TEST_ENV_BYTES", "100", 1);
    assert_int_equal(cx_config_env_bytes(cx_config_environment, NULL, "CFX_TEST_ENV_BYTES", 4096,
                                         &v), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_TEST_ENV_BYTES=\"100\""));
    setenv("CFX_TEST_ENV_BYTES", "1T", 1);
    assert_int_equal(cx_config_env_bytes(cx_config_environment, NULL, "CFX_TEST_ENV_BYTES", 4096,
                                         &v), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_TEST_ENV_BYTES"));
    unsetenv("CFX_TEST_ENV_BYTES");
}

/* The transport asked for, resolved by the registry: a name (any case) or a kind; the kind set
 * in the options wins; an unknown one names the transports there are. */
static void transport_asked(void **state)
{
    (void)state;
    cx_config cfg;
    const cx_transport_entry *e;
    const char *gloo[] = {"CFX_TRANSPORT=Gloo", NULL}, *autov[] = {"CFX_TRANSPORT=auto", NULL};
    const char *bogus[] = {"CFX_TRANSPORT=carrier-pigeon", NULL};
    assert_int_equal(load(&cfg, NULL, gloo), CFX_OK);
    assert_int_equal(cx_transport_asked(&cfg, &e), CFX_OK);
    assert_non_null(e);
    assert_int_equal(e->kind, CFX_TRANSPORT_GLOO);
    assert_int_equal(load(&cfg, NULL, autov), CFX_OK);
    assert_int_equal(cx_transport_asked(&cfg, &e), CFX_OK);
    assert_null(e);
    assert_int_equal(load(&cfg, NULL, bogus), CFX_OK);
    assert_int_equal(cx_transport_asked(&cfg, &e), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "expected auto, mpi, gloo or local"));
    cfx_init_options o;
    cfx_init_options_init(&o, CFX_INIT_OPTIONS_VERSION);
    o.transport = CFX_TRANSPORT_LOCAL;
    assert_int_equal(load(&cfg, &o, gloo), CFX_OK);
    assert_int_equal(cx_transport_asked(&cfg, &e), CFX_OK);
    assert_string_equal(e->name, "local");
    o.transport = 77;
    assert_int_equal(load(&cfg, &o, no_vars), CFX_OK);
    assert_int_equal(cx_transport_asked(&cfg, &e), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "options.transport 77"));
    /* Every transport the registry builds is a feature; the local one always. */
    assert_true(cx_transport_features() & CFX_FEATURE_LOCAL);
    assert_true((cfx_features() & cx_transport_features()) == cx_transport_features());
}

/* What the layers above base/ get instead of reading the environment: read once, here. */
static void read_once_per_init(void **state)
{
    (void)state;
    cx_config cfg;
    const char *vars[] = {"CFX_RANK=1", "CFX_SIZE=3", "CFX_RENDEZVOUS_DIR=/tmp/x",
                          "CFX_TRANSPORT_TIMEOUT_S=7", "CFX_RENDEZVOUS_TIMEOUT_S=9",
                          "CFX_ELASTIC_MIN_SIZE=2", "CFX_ELASTIC_SETTLE_S=0.5",
                          "CFX_SHARED_POOL_BYTES=1M", "CFX_TRANSPORT=gloo", NULL};
    assert_int_equal(load(&cfg, NULL, vars), CFX_OK);
    const cx_launch *l;
    assert_int_equal(cx_config_launch(&cfg, &l), CFX_OK);
    assert_int_equal(l->rank, 1);
    assert_int_equal(l->size, 3);
    assert_string_equal(l->store_dir, "/tmp/x");
    assert_true(cfg.transport_timeout_s == 7 && cfg.rendezvous_timeout_s == 9);
    assert_true(cfg.elastic.min_size == 2 && cfg.elastic.settle_s == 0.5 &&
                cfg.elastic.timeout_s == 60);
    assert_true(cfg.shared_pool_bytes == 1 << 20);
    assert_string_equal(cfg.transport_name, "gloo");
    /* A launcher's malformed variable fails where the launch is needed, not the whole config. */
    const char *bad_launch[] = {"CFX_RANK=x", "CFX_SIZE=2", NULL};
    assert_int_equal(load(&cfg, NULL, bad_launch), CFX_OK);
    assert_int_equal(cx_config_launch(&cfg, &l), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_RANK"));
    const char *bad_timeout[] = {"CFX_TRANSPORT_TIMEOUT_S=soon", NULL};
    assert_int_equal(load(&cfg, NULL, bad_timeout), CFX_ERR_CONFIG);
    assert_non_null(strstr(cx_error_message(), "CFX_TRANSPORT_TIMEOUT_S"));
}

/* ---- across thread ranks: what init agrees ---- */

#define RANKS 3

typedef struct rank_job {
    world_rank at;       /* first: run_world_threads fills it */
    const char *vars[3]; /* this rank's CFX_* variables */
    cfx_status status;
    int64_t bucket_bytes; /* the context's, after init */
    char message[CX_ERROR_MAX];
} rank_job;

static void *rank_init(void *p)
{
    rank_job *j = p;
    cx_config cfg;
    cfx_context *ctx = NULL;
    j->status = open_world_rank(&j->at, &cfg, load(&cfg, NULL, j->vars), &ctx, j->message,
                                sizeof j->message);
    if (ctx) {
        j->bucket_bytes = ctx->cfg.gradset_bucket_bytes;
        cfx_shutdown(ctx);
        cfx_context_free(ctx);
    }
    return NULL;
}

static void run_jobs(rank_job *jobs) { run_world_threads(RANKS, rank_init, jobs, sizeof *jobs); }

static void compression_everywhere_must_agree(void **state)
{
    (void)state;
    rank_job jobs[RANKS] = {{.vars = {NULL}}, {.vars = {NULL}},
                            {.vars = {"CFX_COMPRESSION_EVERYWHERE=1", NULL}}};
    run_jobs(jobs);
    for (int r = 0; r < RANKS; r++) {
        if (jobs[r].status != CFX_ERR_CONFIG ||
            !strstr(jobs[r].message, "CFX_COMPRESSION_EVERYWHERE") ||
            !strstr(jobs[r].message, "rank 0 has 0") || !strstr(jobs[r].message, "rank 2 has 1"))
            fail_msg("rank %d: status %d, \"%s\"; want CFX_ERR_CONFIG naming the variable, rank 0 "
                     "with 0 and rank 2 with 1", r, (int)jobs[r].status, jobs[r].message);
    }
    rank_job same[RANKS] = {{.vars = {"CFX_COMPRESSION_EVERYWHERE=1", NULL}},
                            {.vars = {"CFX_COMPRESSION_EVERYWHERE=on", NULL}},
                            {.vars = {"CFX_COMPRESSION_EVERYWHERE=yes", NULL}}};
    run_jobs(same);
    for (int r = 0; r < RANKS; r++)
        assert_int_equal(same[r].status, CFX_OK);
}

static void bucket_bytes_from_rank_0(void **state)
{
    (void)state;
    rank_job jobs[RANKS] = {{.vars = {"CFX_GRADSET_BUCKET_BYTES=8M", NULL}},
                            {.vars = {"CFX_GRADSET_BUCKET_BYTES=1M", NULL}}, {.vars = {NULL}}};
    run_jobs(jobs);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(jobs[r].status, CFX_OK);
        assert_true(jobs[r].bucket_bytes == 8 << 20);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nonfinite_options_refused_by_cfx_init),
        cmocka_unit_test(overflowing_variables_refused),
        cmocka_unit_test(test_wire_version),
        cmocka_unit_test(lookup_and_precedence),
        cmocka_unit_test(hierarchical_chunk),
        cmocka_unit_test(malformed_values_name_variable_and_value),
        cmocka_unit_test(sizes_booleans_and_hooks_parsed),
        cmocka_unit_test(process_wide_bytes),
        cmocka_unit_test(read_once_per_init),
        cmocka_unit_test(transport_asked),
        cmocka_unit_test(compression_everywhere_must_agree),
        cmocka_unit_test(bucket_bytes_from_rank_0),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
