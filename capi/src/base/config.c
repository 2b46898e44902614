/* config - defaults, CFX_* environment variables and init options (see config.h). */
#include "base/config.h"

#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"
#include "base/log.h"

/* Defaults. Large tensors are reduced in place as cache-sized chunks (1 MiB moves several times
 * faster through Open MPI's shared memory than one huge message; docs/performance.md). */
#define DEFAULT_FUSION_THRESHOLD (128ll << 20)
#define DEFAULT_CHUNK_BYTES (1ll << 20)
#define DEFAULT_CACHE_CAPACITY 16384
#define DEFAULT_CYCLE_TIME_MS 1.0
#define DEFAULT_STALL_WARNING_S 60.0
#define DEFAULT_STALL_TIMEOUT_S 600.0
/* A gradient set's bucket, 25 MiB (DDP's bucket_cap_mb). It was 64 MiB, chosen on steps with every
 * gradient ready at once, where overlap cannot show; through autograd (a ResNet-50-shaped model at
 * 2 ranks, bench/torch_autograd.py) communication after backward was 33-42 ms at 64 MiB, 17 ms at
 * 4 MiB and 50 ms at 256 MiB: what remains after backward is about the last bucket's reduction.
 * When every gradient is ready at once, consecutive ready buckets still go out as one batch
 * (engine/gradset.c), so the smaller size costs those steps little. CFX_GRADSET_BUCKET_BYTES or
 * the options' bucket_bytes choose another. */
#define DEFAULT_GRADSET_BUCKET_BYTES (25ll << 20)

cfx_status cx_parse_bytes(const char *var, const char *text, int64_t *out)
{
    errno = 0;
    char *end;
    long long v = strtoll(text, &end, 10);
    if (end == text || errno || v < 0)
        return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected a non-negative number of bytes "
                       "(optionally with K, M or G)", var, text);
    long long mult = 1;
    if (*end) {
        switch (*end) {
        case 'k': case 'K': mult = 1ll << 10; break;
        case 'm': case 'M': mult = 1ll << 20; break;
        case 'g': case 'G': mult = 1ll << 30; break;
        default: mult = 0;
        }
        end++;
        if (strcasecmp(end, "") != 0 && strcasecmp(end, "B") != 0 && strcasecmp(end, "iB") != 0)
            mult = 0;
        if (mult == 0)
            return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": unknown size suffix (use K, M or G)", var, text);
    }
    if (v > INT64_MAX / mult)
        return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": too large", var, text);
    *out = v * mult;
    return CFX_OK;
}

static cfx_status parse_double(const char *var, const char *text, double *out)
{
    errno = 0;
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !isfinite(v) || v < 0)
        return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected a non-negative number", var, text);
    *out = v;
    return CFX_OK;
}

static cfx_status parse_bool(const char *var, const char *text, int32_t *out)
{
    if (!strcmp(text, "1") || !strcasecmp(text, "true") || !strcasecmp(text, "yes") ||
        !strcasecmp(text, "on")) {
        *out = 1;
        return CFX_OK;
    }
    if (!strcmp(text, "0") || !strcasecmp(text, "false") || !strcasecmp(text, "no") ||
        !strcasecmp(text, "off")) {
        *out = 0;
        return CFX_OK;
    }
    return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected 1/0, true/false, yes/no or on/off", var, text);
}

/* "auto" (-1) or a boolean. */
static cfx_status parse_tristate(const char *var, const char *text, int32_t *out)
{
    if (!strcasecmp(text, "auto")) {
        *out = -1;
        return CFX_OK;
    }
    if (parse_bool(var, text, out) == CFX_OK)
        return CFX_OK;
    return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": expected auto, 1/0, true/false, yes/no or on/off",
                   var, text);
}

typedef struct source {
    cx_config_lookup lookup;
    void *user;
} source;

static const char *var(const source *src, const char *name)
{
    const char *v = src->lookup(name, src->user);
    return (v && *v) ? v : NULL;
}

static cfx_status load_env(cx_config *cfg, const source *src)
{
    const char *v;
    cfx_status st = CFX_OK;
    /* A transport's name: the registry (transport/registry.h) knows which there are. */
    if ((v = var(src, "CFX_TRANSPORT"))) {
        if (strlen(v) >= sizeof cfg->transport_name)
            return cx_fail(CFX_ERR_CONFIG, "CFX_TRANSPORT=\"%.40s...\": no transport has a name "
                           "that long", v);
        strcpy(cfg->transport_name, v);
    }
    if ((v = var(src, "CFX_FUSION_THRESHOLD")) && (st = cx_parse_bytes("CFX_FUSION_THRESHOLD", v, &cfg->fusion_threshold)))
        return st;
    if ((v = var(src, "CFX_CHUNK_BYTES")) && (st = cx_parse_bytes("CFX_CHUNK_BYTES", v, &cfg->chunk_bytes)))
        return st;
    if ((v = var(src, "CFX_HIERARCHICAL_CHUNK_BYTES")) &&
        (st = cx_parse_bytes("CFX_HIERARCHICAL_CHUNK_BYTES", v, &cfg->hierarchical_chunk_bytes)))
        return st;
    if ((v = var(src, "CFX_CACHE_CAPACITY")) && (st = cx_parse_bytes("CFX_CACHE_CAPACITY", v, &cfg->cache_capacity)))
        return st;
    if ((v = var(src, "CFX_CYCLE_TIME")) && (st = parse_double("CFX_CYCLE_TIME", v, &cfg->cycle_time_ms)))
        return st;
    if ((v = var(src, "CFX_STALL_WARNING_S")) && (st = parse_double("CFX_STALL_WARNING_S", v, &cfg->stall_warning_s)))
        return st;
    if ((v = var(src, "CFX_STALL_TIMEOUT_S")) && (st = parse_double("CFX_STALL_TIMEOUT_S", v, &cfg->stall_timeout_s)))
        return st;
    if ((v = var(src, "CFX_DETERMINISTIC")) && (st = parse_bool("CFX_DETERMINISTIC", v, &cfg->deterministic)))
        return st;
    if ((v = var(src, "CFX_SHM")) && (st = parse_tristate("CFX_SHM", v, &cfg->shm)))
        return st;
    if ((v = var(src, "CFX_HIERARCHICAL_ALLREDUCE")) &&
        (st = parse_tristate("CFX_HIERARCHICAL_ALLREDUCE", v, &cfg->hierarchical)))
        return st;
    if ((v = var(src, "CFX_LOG_LEVEL"))) {
        int level = cx_log_level_parse(v);
        if (level < 0)
            return cx_fail(CFX_ERR_CONFIG, "CFX_LOG_LEVEL=\"%s\": expected trace, debug, info, "
                           "warning, error or off", v);
        cfg->log_level = level;
    }
    if ((v = var(src, "CFX_LOG_FILE"))) {
        if (strlen(v) >= sizeof cfg->log_file)
            return cx_fail(CFX_ERR_CONFIG, "CFX_LOG_FILE: path longer than %d bytes", CX_PATH_MAX - 1);
        strcpy(cfg->log_file, v);
    }
    /* Observability: timeline and autotune (docs/timeline.md). */
    if ((v = var(src, "CFX_TIMELINE"))) {
        if (strlen(v) >= sizeof cfg->timeline - 16)
            return cx_fail(CFX_ERR_CONFIG, "CFX_TIMELINE: path longer than %d bytes", CX_PATH_MAX - 17);
        strcpy(cfg->timeline, v);
    }
    double mb = 0; /* set by parse_double before use; some -O3 builds cannot see that */
    if ((v = var(src, "CFX_TIMELINE_MAX_MB"))) {
        if ((st = parse_double("CFX_TIMELINE_MAX_MB", v, &mb)))
            return st;
        if (mb >= (double)(INT64_MAX >> 20)) /* the bytes must fit an int64_t */
            return cx_fail(CFX_ERR_CONFIG, "CFX_TIMELINE_MAX_MB=\"%s\": too large (at most %lld MiB)",
                           v, (long long)(INT64_MAX >> 20) - 1);
        cfg->timeline_max_bytes = (int64_t)(mb * 1048576.0);
    }
    if ((v = var(src, "CFX_TIMELINE_MARK_CYCLES")) && (st = parse_bool("CFX_TIMELINE_MARK_CYCLES", v, &cfg->timeline_cycles)))
        return st;
    if ((v = var(src, "CFX_WAIT_RUNS_CYCLES")) && (st = parse_bool("CFX_WAIT_RUNS_CYCLES", v, &cfg->wait_runs_cycles)))
        return st;
    if ((v = var(src, "CFX_AUTOTUNE")) && (st = parse_bool("CFX_AUTOTUNE", v, &cfg->autotune)))
        return st;
    if ((v = var(src, "CFX_AUTOTUNE_WINDOW_S")) && (st = parse_double("CFX_AUTOTUNE_WINDOW_S", v, &cfg->autotune_window_s)))
        return st;
    if ((v = var(src, "CFX_AUTOTUNE_LOG"))) {
        if (strlen(v) >= sizeof cfg->autotune_log)
            return cx_fail(CFX_ERR_CONFIG, "CFX_AUTOTUNE_LOG: path longer than %d bytes", CX_PATH_MAX - 1);
        strcpy(cfg->autotune_log, v);
    }
    if ((v = var(src, "CFX_GRADSET_BUCKET_BYTES"))) {
        if ((st = cx_parse_bytes("CFX_GRADSET_BUCKET_BYTES", v, &cfg->gradset_bucket_bytes)))
            return st;
        if (cfg->gradset_bucket_bytes == 0) /* 0 in the options means "Conflux's choice": this */
            return cx_fail(CFX_ERR_CONFIG, "CFX_GRADSET_BUCKET_BYTES=\"%s\": a bucket needs at "
                           "least 1 byte", v);
    }
    if ((v = var(src, "CFX_COMPRESSION_EVERYWHERE")) &&
        (st = parse_bool("CFX_COMPRESSION_EVERYWHERE", v, &cfg->compression_everywhere)))
        return st;
    return cx_test_hooks_load(&cfg->test, src->lookup, src->user);
}

/* A double option must be a number: NaN is neither set nor unset, and infinity no duration. */
static cfx_status finite_option(const char *field, double v)
{
    if (isfinite(v))
        return CFX_OK;
    return cx_fail(CFX_ERR_CONFIG, "cfx_init: options.%s is %g: expected a finite number "
                   "(negative = unset)", field, v);
}

static cfx_status load_options(cx_config *cfg, const cfx_init_options *o)
{
    if (o->version != CFX_INIT_OPTIONS_VERSION)
        return cx_fail(CFX_ERR_VERSION, "cfx_init: options version %u is unknown to this library "
                       "(it knows %d); fill options with cfx_init_options_init", o->version,
                       CFX_INIT_OPTIONS_VERSION);
    if (o->transport >= 0) { /* a kind the registry knows (transport/registry.h); wins over the name */
        cfg->transport = o->transport;
        cfg->transport_by_option = 1;
    }
    cfx_status st;
    if ((st = finite_option("cycle_time_ms", o->cycle_time_ms)) ||
        (st = finite_option("stall_warning_s", o->stall_warning_s)) ||
        (st = finite_option("stall_timeout_s", o->stall_timeout_s)))
        return st;
    if (o->fusion_threshold_bytes >= 0) cfg->fusion_threshold = o->fusion_threshold_bytes;
    if (o->chunk_bytes >= 0) cfg->chunk_bytes = o->chunk_bytes;
    if (o->cache_capacity >= 0) cfg->cache_capacity = o->cache_capacity;
    if (o->cycle_time_ms >= 0) cfg->cycle_time_ms = o->cycle_time_ms;
    if (o->stall_warning_s >= 0) cfg->stall_warning_s = o->stall_warning_s;
    if (o->stall_timeout_s >= 0) cfg->stall_timeout_s = o->stall_timeout_s;
    if (o->deterministic >= 0) cfg->deterministic = o->deterministic ? 1 : 0;
    if (o->log_level >= 0) {
        if (o->log_level > CX_LOG_OFF)
            return cx_fail(CFX_ERR_CONFIG, "cfx_init: options.log_level %d is out of range 0..5",
                           o->log_level);
        cfg->log_level = o->log_level;
    }
    return CFX_OK;
}

static cfx_status check(const cx_config *cfg)
{
    if (cfg->chunk_bytes < CX_CHUNK_MIN)
        return cx_fail(CFX_ERR_CONFIG, "chunk size %lld bytes (CFX_CHUNK_BYTES) is below the "
                       "minimum of %d", (long long)cfg->chunk_bytes, CX_CHUNK_MIN);
    if (cfg->hierarchical_chunk_bytes != 0 && cfg->hierarchical_chunk_bytes < CX_CHUNK_MIN)
        return cx_fail(CFX_ERR_CONFIG, "chunk size %lld bytes (CFX_HIERARCHICAL_CHUNK_BYTES) is "
                       "below the minimum of %d", (long long)cfg->hierarchical_chunk_bytes,
                       CX_CHUNK_MIN);
    if (!(cfg->cycle_time_ms >= CX_CYCLE_TIME_MIN_MS && cfg->cycle_time_ms <= CX_CYCLE_TIME_MAX_MS))
        return cx_fail(CFX_ERR_CONFIG, "cycle time %g ms (CFX_CYCLE_TIME) is outside %g .. %g",
                       cfg->cycle_time_ms, CX_CYCLE_TIME_MIN_MS, CX_CYCLE_TIME_MAX_MS);
    if (cfg->cache_capacity > (1 << 24))
        return cx_fail(CFX_ERR_CONFIG, "cache capacity %lld (CFX_CACHE_CAPACITY) is above 16M entries",
                       (long long)cfg->cache_capacity);
    return CFX_OK;
}

static const char *from_environment(const char *name, void *user)
{
    (void)user;
    return getenv(name);
}

const char *cx_config_environment(const char *name, void *user)
{
    return from_environment(name, user);
}

cfx_status cx_config_env_bytes(cx_config_lookup lookup, void *user, const char *var, int64_t min,
                               int64_t *out)
{
    const char *v = lookup(var, user);
    if (!v || !*v)
        return CFX_OK;
    int64_t bytes = 0;
    cfx_status st = cx_parse_bytes(var, v, &bytes);
    if (st)
        return st;
    if (bytes < min)
        return cx_fail(CFX_ERR_CONFIG, "%s=\"%s\": at least %lld bytes are needed", var, v,
                       (long long)min);
    *out = bytes;
    return CFX_OK;
}

cfx_status cx_config_shared_pool_bytes(cx_config_lookup lookup, void *user, int64_t *out)
{
    *out = 0;
    return cx_config_env_bytes(lookup, user, "CFX_SHARED_POOL_BYTES", 4096, out);
}

cfx_status cx_config_launch(const cx_config *cfg, const cx_launch **out)
{
    *out = &cfg->launch;
    if (cfg->launch_status)
        return cx_fail((cfx_status)cfg->launch_status, "%s", cfg->launch_error);
    return CFX_OK;
}

/* What is read once per init for the layers above: the launch (its error kept for where it is
 * needed: a group, say, is joined without it), the deadlines, the elastic defaults, the pool. */
static cfx_status load_launch(cx_config *cfg, const source *src)
{
    cfg->launch_status = cx_launch_detect(&cfg->launch, src->lookup, src->user);
    if (cfg->launch_status)
        snprintf(cfg->launch_error, sizeof cfg->launch_error, "%s", cx_error_message());
    cfx_status st = cx_launch_timeouts(src->lookup, src->user, &cfg->rendezvous_timeout_s,
                                       &cfg->transport_timeout_s);
    if (!st)
        st = cx_launch_elastic_defaults(src->lookup, src->user, &cfg->elastic);
    return st ? st : cx_config_shared_pool_bytes(src->lookup, src->user, &cfg->shared_pool_bytes);
}

cfx_status cx_config_load(cx_config *cfg, const cfx_init_options *opts)
{
    return cx_config_load_from(cfg, opts, from_environment, NULL);
}

cfx_status cx_config_load_from(cx_config *cfg, const cfx_init_options *opts,
                               cx_config_lookup lookup, void *user)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->transport = CFX_TRANSPORT_AUTO;
    cfg->fusion_threshold = DEFAULT_FUSION_THRESHOLD;
    cfg->chunk_bytes = DEFAULT_CHUNK_BYTES;
    cfg->hierarchical_chunk_bytes = 0; /* the transport's (cx_transport_caps.cross_chunk_bytes) */
    cfg->cache_capacity = DEFAULT_CACHE_CAPACITY;
    cfg->cycle_time_ms = DEFAULT_CYCLE_TIME_MS;
    cfg->stall_warning_s = DEFAULT_STALL_WARNING_S;
    cfg->stall_timeout_s = DEFAULT_STALL_TIMEOUT_S;
    cfg->log_level = CX_LOG_WARNING;
    cfg->deterministic = 0;
    cfg->shm = -1;
    cfg->hierarchical = -1;
    cfg->timeline_max_bytes = 256ll << 20; /* CFX_TIMELINE_MAX_MB */
    cfg->autotune_window_s = 0.5;
    cfg->wait_runs_cycles = 1;
    cfg->gradset_bucket_bytes = DEFAULT_GRADSET_BUCKET_BYTES;
    source src = {lookup, user};
    cfx_status st = load_env(cfg, &src);
    if (st == CFX_OK)
        st = load_launch(cfg, &src);
    if (st == CFX_OK && opts)
        st = load_options(cfg, opts);
    /* A chunk the user chose applies across hosts too, unless that path has its own. */
    if (cfg->hierarchical_chunk_bytes == 0 && (var(&src, "CFX_CHUNK_BYTES") || (opts && opts->chunk_bytes >= 0)))
        cfg->hierarchical_chunk_bytes = cfg->chunk_bytes;
    if (st == CFX_OK)
        st = check(cfg);
    return st;
}

void cx_config_get_agreed(const cx_config *cfg, cx_config_agreed *out)
{
    memset(out, 0, sizeof *out);
    out->fusion_threshold = cfg->fusion_threshold;
    out->chunk_bytes = cfg->chunk_bytes;
    out->hierarchical_chunk_bytes = cfg->hierarchical_chunk_bytes;
    out->cache_capacity = cfg->cache_capacity;
    out->gradset_bucket_bytes = cfg->gradset_bucket_bytes;
    out->cycle_time_ms = cfg->cycle_time_ms;
    out->stall_warning_s = cfg->stall_warning_s;
    out->stall_timeout_s = cfg->stall_timeout_s;
    out->deterministic = cfg->deterministic;
    out->shm = cfg->shm;
    out->hierarchical = cfg->hierarchical;
}

void cx_config_set_agreed(cx_config *cfg, const cx_config_agreed *a)
{
    cfg->fusion_threshold = a->fusion_threshold;
    cfg->chunk_bytes = a->chunk_bytes;
    cfg->hierarchical_chunk_bytes = a->hierarchical_chunk_bytes;
    cfg->cache_capacity = a->cache_capacity;
    cfg->gradset_bucket_bytes = a->gradset_bucket_bytes;
    cfg->cycle_time_ms = a->cycle_time_ms;
    cfg->stall_warning_s = a->stall_warning_s;
    cfg->stall_timeout_s = a->stall_timeout_s;
    cfg->deterministic = a->deterministic;
    cfg->shm = a->shm;
    cfg->hierarchical = a->hierarchical;
}
