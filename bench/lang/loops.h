/*
 * loops.h - the C reference loops of bench/lang: what a binding's per-call cost is compared with,
 * timed in the same process, on the same context or gradient set, under the same load. Bench-only:
 * none of this ships in a production module. loops.c implements them on the public ABI; each
 * language reaches them through its own small glue (loops_lua.c, loops_jni.c, bench_loops.py).
 */
#ifndef CFX_BENCH_LOOPS_H
#define CFX_BENCH_LOOPS_H

#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

/* n blocking 1-element float32 SUM allreduces named "ovh" (submit, wait, release) on ctx; the
 * time of each in microseconds into us[0..n). Stops at the first failure and returns its status. */
int cfx_bench_allreduce_loop(void *ctx, int64_t n, double *us);

/* n steps of the committed gradient set `set`: gradients count-1 .. 0 marked ready, then wait;
 * each step's time (us) into step_us[0..n) and its ready calls' alone into ready_us (may be NULL).
 * Stops at the first failure and returns its status. */
int cfx_bench_gradset_loop(void *set, int32_t count, int64_t n, double *step_us, double *ready_us);

#endif /* CFX_BENCH_LOOPS_H */
