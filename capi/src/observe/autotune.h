/*
 * autotune - online tuning of the fusion threshold, the chunk size and the cycle time from the
 * measured throughput (bytes reduced per second), on the coordinator (CFX_AUTOTUNE=1).
 *
 * The search is coordinate descent over a small grid: for each parameter in turn (fusion
 * threshold, chunk bytes, cycle time) every candidate value runs for one warm-up window (discarded:
 * it absorbs the switch) and CX_AUTOTUNE_REPEATS measured windows; the candidate with the best
 * median score is kept and the next parameter is tuned with it. After the last parameter the tuner
 * settles on the best values for good. A window lasts at least window_s seconds and ends at the
 * first update after that with bytes reduced in it. Every window is one CSV row (CFX_AUTOTUNE_LOG).
 *
 * The tuner only decides. loop.c carries its decisions to every rank in the coordinator's response
 * list (wire.h, CX_LIST_TUNED) and every rank applies them at the same point of the same cycle, so
 * fusion plans stay identical across ranks. Owned and used by rank 0's background thread alone.
 */
#ifndef CFX_AUTOTUNE_H
#define CFX_AUTOTUNE_H

#include <stdbool.h>
#include <stdint.h>

#include "conflux/conflux.h"
#include "base/log.h"

#define CX_AUTOTUNE_REPEATS 3

typedef struct cx_tune_params {
    int64_t fusion_threshold, chunk_bytes;
    double cycle_time_ms;
} cx_tune_params;

typedef struct cx_autotune cx_autotune;

/* `start`: the values in use now. csv_path NULL or "" = no CSV. */
cfx_status cx_autotune_create(const cx_tune_params *start, double window_s, const char *csv_path,
                              const cx_logger *log, cx_autotune **out);
void cx_autotune_destroy(cx_autotune *at);

/* Adds `bytes` reduced up to time `now` (seconds, any monotonic origin). Returns true and fills
 * *next when the parameters in use must change to *next. */
bool cx_autotune_update(cx_autotune *at, double now, uint64_t bytes, cx_tune_params *next);

/* The values the tuner wants in use now (at creation: its first candidate, which the engine must
 * adopt as if update had returned it). */
cx_tune_params cx_autotune_params(const cx_autotune *at);

bool cx_autotune_settled(const cx_autotune *at);
/* Windows measured so far (warm-up ones included). */
int cx_autotune_samples(const cx_autotune *at);

#endif /* CFX_AUTOTUNE_H */
