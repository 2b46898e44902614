/*
 * config - the engine's settings: defaults, then CFX_* environment variables, then the fields the
 * caller set in cfx_init_options. A malformed variable or value is an error naming it.
 *
 * This is the engine's one configuration path: every CFX_* variable is read here (the CFX_TEST_*
 * hooks through test_hooks.h), validated, and handed to the modules as fields; no other module
 * calls getenv (tests/layout/check-layers.py enforces it).
 *
 * Settings that decide the shape of the work (fusion threshold, chunk size, cache capacity,
 * deterministic mode, cycle time, stall deadlines, gradient-set buckets) must agree across ranks:
 * context init broadcasts rank 0's values (cx_config_agreed) and every rank uses those. Settings a
 * rank cannot simply adopt from rank 0 because they change what its callers asked for
 * (CFX_COMPRESSION_EVERYWHERE) must already be equal: a difference fails init on every rank with
 * CFX_ERR_CONFIG naming the variable, both values and the ranks (engine/context.c).
 */
#ifndef CFX_CONFIG_H
#define CFX_CONFIG_H

#include <stdint.h>

#include "base/launch_env.h"
#include "base/test_hooks.h"
#include "conflux/conflux.h"

#define CX_PATH_MAX 1024

/* Bounds that check() enforces and that values from other ranks (autotune) must meet too. */
#define CX_CHUNK_MIN 64
#define CX_CYCLE_TIME_MIN_MS 0.01
#define CX_CYCLE_TIME_MAX_MS 10000.0

typedef struct cx_config {
    int32_t transport;          /* cfx_transport_kind (options.transport) */
    char transport_name[32];    /* CFX_TRANSPORT, "" when unset; transport/registry.h resolves
                                   it and the kind (cx_transport_asked) */
    int32_t transport_by_option; /* options.transport set `transport`: it wins over the name */
    int64_t fusion_threshold;   /* bytes; 0 = no fusion */
    int64_t chunk_bytes;        /* large reductions run as chunks of this size */
    int64_t hierarchical_chunk_bytes; /* CFX_HIERARCHICAL_CHUNK_BYTES: the chunk of the two-level
                                         path (its block crosses hosts in one call); an explicit
                                         CFX_CHUNK_BYTES / chunk_bytes sets it too unless it is set;
                                         0: the transport's (caps.cross_chunk_bytes) */
    int64_t cache_capacity;     /* entries; 0 = no cache */
    double cycle_time_ms;       /* idle wake-up period of the background thread */
    double stall_warning_s;
    double stall_timeout_s;     /* 0 = never */
    int32_t log_level;
    int32_t deterministic;
    int32_t shm;                /* CFX_SHM: -1 auto (on when ranks share a host), 0 off, 1 on */
    int32_t hierarchical;       /* CFX_HIERARCHICAL_ALLREDUCE: -1 auto (on across hosts), 0, 1 */
    char log_file[CX_PATH_MAX]; /* "" = stderr */
    /* Observability (timeline.h, autotune.h); per rank, not agreed. */
    char timeline[CX_PATH_MAX];  /* CFX_TIMELINE: "" = off; the rank goes into the name */
    int64_t timeline_max_bytes;  /* CFX_TIMELINE_MAX_MB; 0 = no cap */
    int32_t timeline_cycles;     /* CFX_TIMELINE_MARK_CYCLES */
    int32_t autotune;            /* CFX_AUTOTUNE: rank 0's value counts */
    int32_t wait_runs_cycles;    /* CFX_WAIT_RUNS_CYCLES: a waiting thread runs the cycles (loop.h) */
    double autotune_window_s;    /* CFX_AUTOTUNE_WINDOW_S */
    char autotune_log[CX_PATH_MAX]; /* CFX_AUTOTUNE_LOG: "" = none */
    int64_t gradset_bucket_bytes; /* CFX_GRADSET_BUCKET_BYTES: a gradient set's buckets when its
                                     options leave bucket_bytes 0 */
    int32_t compression_everywhere; /* CFX_COMPRESSION_EVERYWHERE: fp16/bf16 compress every leg */
    cx_test_hooks test;          /* CFX_TEST_* (tests only) */
    /* Read once per init and handed down: the layers above base/ read no environment. */
    cx_launch launch;            /* the launcher's world (launch_env.h): rank, size, meeting place */
    int32_t launch_status;       /* CFX_OK, or why the launcher's variables could not be read: */
    char launch_error[512];         /* raised where the launch is needed (cx_config_launch) */
    double rendezvous_timeout_s; /* CFX_RENDEZVOUS_TIMEOUT_S: a meeting's deadline */
    double transport_timeout_s;  /* CFX_TRANSPORT_TIMEOUT_S: every wait for a peer (transport.h) */
    cx_elastic_defaults elastic; /* CFX_ELASTIC_*: a membership round's defaults */
    int64_t shared_pool_bytes;   /* CFX_SHARED_POOL_BYTES; 0: the pool's own default */
} cx_config;

/* The launch read at init: CFX_OK and *out, or the error reading it gave (cfg->launch_status). */
cfx_status cx_config_launch(const cx_config *cfg, const cx_launch **out);

/* What the environment says, for an entry point that reads it outside cfx_init (cfx_alloc,
 * cfx_reform_options_init): getenv, as a lookup. */
const char *cx_config_environment(const char *name, void *user);

/* CFX_SHARED_POOL_BYTES through `lookup` (0 when unset: the pool's default); CFX_ERR_CONFIG when
 * malformed or below a page. */
cfx_status cx_config_shared_pool_bytes(cx_config_lookup lookup, void *user, int64_t *out);

/* Parses a byte count for variable `var`: "123", "64K", "64KiB", "16M", "1G" (binary multiples).
 * CFX_ERR_CONFIG naming the variable and the text when malformed. */
cfx_status cx_parse_bytes(const char *var, const char *text, int64_t *out);

/* A byte count from variable `var` read through `lookup` (cx_parse_bytes): *out is left as it is
 * when the variable is unset or empty, and a value below `min` is CFX_ERR_CONFIG. */
cfx_status cx_config_env_bytes(cx_config_lookup lookup, void *user, const char *var, int64_t min,
                               int64_t *out);

/* The fields every rank must share (broadcast from rank 0 at init). */
typedef struct cx_config_agreed {
    int64_t fusion_threshold, chunk_bytes, hierarchical_chunk_bytes, cache_capacity,
        gradset_bucket_bytes;
    double cycle_time_ms, stall_warning_s, stall_timeout_s;
    int32_t deterministic, shm, hierarchical, pad;
} cx_config_agreed;

/* Fills *cfg from defaults, the environment and `opts` (may be NULL). */
cfx_status cx_config_load(cx_config *cfg, const cfx_init_options *opts);

/* The same, with CFX_* variables read through `lookup` (NULL or "" = unset; the type is in
 * test_hooks.h) instead of getenv: for tests and the fuzzer, which must not touch the process
 * environment. */
cfx_status cx_config_load_from(cx_config *cfg, const cfx_init_options *opts,
                               cx_config_lookup lookup, void *user);

void cx_config_get_agreed(const cx_config *cfg, cx_config_agreed *out);
void cx_config_set_agreed(cx_config *cfg, const cx_config_agreed *agreed);

#endif /* CFX_CONFIG_H */
