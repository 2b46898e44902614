/*
 * clock - the engine's one clock: monotonic seconds, for deadlines, back-offs and timings
 * (never wall-clock time, which jumps).
 */
#ifndef CFX_CLOCK_H
#define CFX_CLOCK_H

#include <time.h>

static inline double cx_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif /* CFX_CLOCK_H */
