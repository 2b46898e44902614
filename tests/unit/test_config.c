/* Unit tests of the configuration: option values that are not finite are refused naming the
 * field (through cfx_init as a caller sees it, and the loader), CFX_* values that would overflow,
 * the test-only wire version, and the loader's lookup hook with the options' precedence. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "base/config.h"
#include "base/error.h"

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
    assert_int_equal(cfg.test_wire_major, -1);
    const char *ok[] = {"CFX_TEST_WIRE_VERSION=2.17", NULL};
    assert_int_equal(load(&cfg, NULL, ok), CFX_OK);
    assert_int_equal(cfg.test_wire_major, 2);
    assert_int_equal(cfg.test_wire_minor, 17);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(nonfinite_options_refused_by_cfx_init),
        cmocka_unit_test(overflowing_variables_refused),
        cmocka_unit_test(test_wire_version),
        cmocka_unit_test(lookup_and_precedence),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
