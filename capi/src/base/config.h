/*
 * config - the engine's settings: defaults, then CFX_* environment variables, then the fields the
 * caller set in cfx_init_options. A malformed variable or value is an error naming it.
 *
 * Settings that decide the shape of the work (fusion threshold, chunk size, cache capacity,
 * deterministic mode, cycle time, stall deadlines) must agree across ranks: context init
 * broadcasts rank 0's values (cx_config_agreed) and every rank uses those.
 */
#ifndef CFX_CONFIG_H
#define CFX_CONFIG_H

#include <stdint.h>

#include "conflux/conflux.h"

#define CX_PATH_MAX 1024

/* Bounds that check() enforces and that values from other ranks (autotune) must meet too. */
#define CX_CHUNK_MIN 64
#define CX_CYCLE_TIME_MIN_MS 0.01
#define CX_CYCLE_TIME_MAX_MS 10000.0

typedef struct cx_config {
    int32_t transport;          /* cfx_transport_kind */
    int64_t fusion_threshold;   /* bytes; 0 = no fusion */
    int64_t chunk_bytes;        /* large reductions run as chunks of this size */
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
    /* CFX_TEST_WIRE_VERSION: the wire protocol this rank claims in the handshake (tests only);
     * -1 = this build's own. */
    int32_t test_wire_major, test_wire_minor;
} cx_config;

/* Parses a byte count for variable `var`: "123", "64K", "64KiB", "16M", "1G" (binary multiples).
 * CFX_ERR_CONFIG naming the variable and the text when malformed. */
cfx_status cx_parse_bytes(const char *var, const char *text, int64_t *out);

/* The fields every rank must share (broadcast from rank 0 at init). */
typedef struct cx_config_agreed {
    int64_t fusion_threshold, chunk_bytes, cache_capacity;
    double cycle_time_ms, stall_warning_s, stall_timeout_s;
    int32_t deterministic, shm, hierarchical, pad;
} cx_config_agreed;

/* Fills *cfg from defaults, the environment and `opts` (may be NULL). */
cfx_status cx_config_load(cx_config *cfg, const cfx_init_options *opts);

/* The same, with CFX_* variables read through `lookup` (NULL or "" = unset) instead of getenv:
 * for tests and the fuzzer, which must not touch the process environment. */
typedef const char *(*cx_config_lookup)(const char *name, void *user);
cfx_status cx_config_load_from(cx_config *cfg, const cfx_init_options *opts,
                               cx_config_lookup lookup, void *user);

void cx_config_get_agreed(const cx_config *cfg, cx_config_agreed *out);
void cx_config_set_agreed(cx_config *cfg, const cx_config_agreed *agreed);

#endif /* CFX_CONFIG_H */
