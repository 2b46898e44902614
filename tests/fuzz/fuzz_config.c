/*
 * fuzz_config - the configuration parser (base/config.c): CFX_* variables and cfx_init option
 * values, in the format of fuzz_config_input.h. The variables come through the loader's lookup
 * hook, never the process environment.
 *
 * What must hold: no crash or undefined behaviour; a refusal is CFX_ERR_CONFIG or CFX_ERR_VERSION
 * with a message naming the variable or option; an options version other than the known one is
 * refused; a non-finite double option is refused naming the option; an accepted configuration
 * meets every documented bound, and each option that was set wins over the variables.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/config.h"
#include "base/error.h"
#include "base/log.h"
#include "fuzz_check.h"
#include "fuzz_config_input.h"

typedef struct vars {
    size_t count;
    char *names[64], *values[64];
    char *text; /* owned: the lines, split in place */
} vars;

static void split(vars *v, const uint8_t *data, size_t size)
{
    memset(v, 0, sizeof *v);
    v->text = malloc(size + 1);
    memcpy(v->text, data, size);
    v->text[size] = '\0';
    for (char *line = v->text; line && v->count < 64;) {
        char *next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *eq = strchr(line, '=');
        if (eq) {
            *eq = '\0';
            v->names[v->count] = line;
            v->values[v->count++] = eq + 1;
        }
        line = next;
    }
}

static const char *lookup(const char *name, void *user)
{
    const vars *v = user;
    for (size_t i = 0; i < v->count; i++)
        if (strcmp(v->names[i], name) == 0)
            return v->values[i];
    return NULL;
}

static int terminated(const char *s, size_t size) { return memchr(s, '\0', size) != NULL; }

static void check_accepted(const cx_config *c, const cfx_init_options *o)
{
    /* The kind and the name are resolved by the transport registry (transport/registry.h). */
    FUZZ_CHECK(c->transport >= 0, "transport %d", c->transport);
    FUZZ_CHECK(terminated(c->transport_name, sizeof c->transport_name), "transport name not terminated");
    FUZZ_CHECK(c->fusion_threshold >= 0, "fusion %lld", (long long)c->fusion_threshold);
    FUZZ_CHECK(c->chunk_bytes >= CX_CHUNK_MIN, "chunk %lld", (long long)c->chunk_bytes);
    FUZZ_CHECK(c->hierarchical_chunk_bytes == 0 || c->hierarchical_chunk_bytes >= CX_CHUNK_MIN,
               "hierarchical chunk %lld", (long long)c->hierarchical_chunk_bytes);
    FUZZ_CHECK(c->cache_capacity >= 0 && c->cache_capacity <= (1 << 24), "cache %lld",
               (long long)c->cache_capacity);
    FUZZ_CHECK(c->cycle_time_ms >= CX_CYCLE_TIME_MIN_MS && c->cycle_time_ms <= CX_CYCLE_TIME_MAX_MS,
               "cycle %g", c->cycle_time_ms);
    FUZZ_CHECK(isfinite(c->stall_warning_s) && c->stall_warning_s >= 0, "warning %g", c->stall_warning_s);
    FUZZ_CHECK(isfinite(c->stall_timeout_s) && c->stall_timeout_s >= 0, "timeout %g", c->stall_timeout_s);
    FUZZ_CHECK(isfinite(c->autotune_window_s) && c->autotune_window_s >= 0, "window %g",
               c->autotune_window_s);
    FUZZ_CHECK(c->log_level >= CX_LOG_TRACE && c->log_level <= CX_LOG_OFF, "log level %d", c->log_level);
    FUZZ_CHECK((c->deterministic | c->timeline_cycles | c->autotune) <= 1 &&
               (c->deterministic | c->timeline_cycles | c->autotune) >= 0, "a boolean out of 0/1");
    FUZZ_CHECK(c->shm >= -1 && c->shm <= 1 && c->hierarchical >= -1 && c->hierarchical <= 1,
               "tristate %d %d", c->shm, c->hierarchical);
    FUZZ_CHECK(c->timeline_max_bytes >= 0, "timeline cap %lld", (long long)c->timeline_max_bytes);
    FUZZ_CHECK(terminated(c->log_file, sizeof c->log_file) && terminated(c->timeline, sizeof c->timeline) &&
               terminated(c->autotune_log, sizeof c->autotune_log), "a path not terminated");
    FUZZ_CHECK((c->test.wire_major == -1 && c->test.wire_minor == -1) ||
               (c->test.wire_major >= 0 && c->test.wire_major <= 65535 && c->test.wire_minor >= 0 &&
                c->test.wire_minor <= 65535), "wire version %d.%d", c->test.wire_major,
               c->test.wire_minor);
    if (!o)
        return;
    /* Precedence: a field set in the options wins. */
    FUZZ_CHECK(o->transport < 0 || c->transport == o->transport, "transport option lost");
    FUZZ_CHECK(o->fusion_threshold_bytes < 0 || c->fusion_threshold == o->fusion_threshold_bytes,
               "fusion option lost");
    FUZZ_CHECK(o->chunk_bytes < 0 || c->chunk_bytes == o->chunk_bytes, "chunk option lost");
    FUZZ_CHECK(o->cache_capacity < 0 || c->cache_capacity == o->cache_capacity, "cache option lost");
    FUZZ_CHECK(o->cycle_time_ms < 0 || c->cycle_time_ms == o->cycle_time_ms, "cycle option lost");
    FUZZ_CHECK(o->stall_warning_s < 0 || c->stall_warning_s == o->stall_warning_s, "warning option lost");
    FUZZ_CHECK(o->stall_timeout_s < 0 || c->stall_timeout_s == o->stall_timeout_s, "timeout option lost");
    FUZZ_CHECK(o->deterministic < 0 || c->deterministic == (o->deterministic != 0),
               "deterministic option lost");
    FUZZ_CHECK(o->log_level < 0 || c->log_level == o->log_level, "log level option lost");
}

static const char *first_nonfinite(const cfx_init_options *o)
{
    if (!isfinite(o->cycle_time_ms))
        return "options.cycle_time_ms";
    if (!isfinite(o->stall_warning_s))
        return "options.stall_warning_s";
    if (!isfinite(o->stall_timeout_s))
        return "options.stall_timeout_s";
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    data++, size--;
    cfx_init_options opts, *o = NULL;
    if (flags & FUZZ_CONFIG_OPTIONS) {
        if (size < sizeof opts)
            return 0;
        memcpy(&opts, data, sizeof opts);
        data += sizeof opts, size -= sizeof opts;
        if (!(flags & FUZZ_CONFIG_KEEP_VERSION))
            opts.version = CFX_INIT_OPTIONS_VERSION;
        o = &opts;
    }
    vars v;
    split(&v, data, size);
    cx_config cfg, env_only;
    cfx_status env_st = cx_config_load_from(&env_only, NULL, lookup, &v);
    cfx_status st = cx_config_load_from(&cfg, o, lookup, &v);
    const char *msg = cx_error_message();
    if (!st) {
        check_accepted(&cfg, o);
    } else {
        FUZZ_CHECK(st == CFX_ERR_CONFIG || st == CFX_ERR_VERSION, "status %d", (int)st);
        FUZZ_CHECK(strstr(msg, "CFX_") || strstr(msg, "options"), "message '%s'", msg);
    }
    if (o && !env_st) { /* the variables alone were fine: what the options do decides */
        if (o->version != CFX_INIT_OPTIONS_VERSION)
            FUZZ_CHECK(st == CFX_ERR_VERSION, "options version %u accepted", o->version);
        else if (first_nonfinite(o))
            FUZZ_CHECK(st == CFX_ERR_CONFIG && strstr(msg, first_nonfinite(o)),
                       "non-finite option: status %d, message '%s'", (int)st, msg);
    }
    free(v.text);
    return 0;
}
