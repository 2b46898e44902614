/*
 * timeline - a Chrome trace-event JSON file of what the engine did, per tensor and per phase
 * (docs/timeline.md).
 *
 * The background thread records events into an in-memory buffer (binary records, a mutex held for
 * one memcpy); a writer thread of the timeline formats them as JSON and writes them every 100 ms,
 * so the hot path never formats or writes. The file is a JSON array whose closing bracket is
 * written only by cx_timeline_destroy: at any moment (even after SIGKILL) it holds the events up
 * to the last flush, one per line, and loads after appending "]" (cfx-timeline does so). Its size
 * is capped (max_bytes): once reached, one log line and one final event say so and the rest is
 * dropped. When the timeline is off the engine holds a NULL pointer and checks only that.
 *
 * Lanes: pid = rank, tid 0 = cycles, tid 1.. = one per tensor name (named by metadata events).
 * Recording functions are called by the context's background thread alone (lane bookkeeping is
 * not locked); create/destroy by whoever owns the timeline (context.c).
 */
#ifndef CFX_TIMELINE_H
#define CFX_TIMELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

/* CFX_NO_TIMELINE (CMake CONFLUX_TIMELINE=OFF) compiles every hook out; it exists to measure the
 * cost of the hooks themselves (docs/timeline.md). */
#ifdef CFX_NO_TIMELINE
#define CX_TL(p) ((struct cx_timeline *)0)
#define CX_TL_ENABLED 0
#else
#define CX_TL(p) (p)
#define CX_TL_ENABLED 1
#endif

typedef struct cx_timeline cx_timeline;

/* Phases of a tensor, in order; the "cat" of their events. */
typedef enum cx_tl_phase {
    CX_TL_QUEUED = 0,    /* submitted, not yet seen by the background thread */
    CX_TL_NEGOTIATE = 1, /* seen, waiting for every rank (bit vector or coordinator) */
    CX_TL_PACK = 2,      /* prescale and copy into the fusion buffer (or the output) */
    CX_TL_COLLECTIVE = 3,/* the data-plane collective */
    CX_TL_UNPACK = 4,    /* postscale/average and copy out */
    CX_TL_NPHASES = 5
} cx_tl_phase;

/* The per-rank file name: "%r" in `path` is replaced by the rank; otherwise ".rank<r>" goes before
 * the last extension ("tl.json" -> "tl.rank0.json"; "tl" -> "tl.rank0"). */
void cx_timeline_rank_path(const char *path, int rank, char *out, size_t size);

/* Opens the file (truncating it) and starts the writer. `path` is used as given (see
 * cx_timeline_rank_path). max_bytes 0 = no cap. */
int cx_timeline_create(const char *path, int rank, int64_t max_bytes, bool mark_cycles,
                       const cx_logger *log, cx_timeline **out);
/* Flushes, writes the closing bracket, stops the writer and frees. NULL is fine. */
void cx_timeline_destroy(cx_timeline *tl);

bool cx_timeline_marks_cycles(const cx_timeline *tl);

/* The background thread saw a new entry: QUEUED [enqueued, now], NEGOTIATE starts now. */
void cx_timeline_seen(cx_timeline *tl, const char *name, double enqueued, double now);
/* The tensor's response is about to run (NEGOTIATE ends now). `coll` names the collective. */
void cx_timeline_negotiated(cx_timeline *tl, const char *name, double now);
/* A phase of a tensor as a complete event; bytes and fused (tensors in the batch) as args
 * unless bytes < 0. */
void cx_timeline_phase(cx_timeline *tl, const char *name, cx_tl_phase phase, const char *label,
                       double t0, double t1, int64_t bytes, int64_t fused);
/* An instant mark on a tensor's lane ("rank 2 ready", "error: ..."). `rank` >= 0 goes in args. */
void cx_timeline_mark(cx_timeline *tl, const char *name, const char *label, int rank, double now);
/* A cycle that did work, on lane 0. */
void cx_timeline_cycle(cx_timeline *tl, uint64_t cycle, double t0, double t1);

/* "ALLREDUCE", "ALLGATHER", ... for a cx_coll. */
const char *cx_timeline_coll_label(int coll);

/* Monotonic seconds, the clock of every timestamp (the engine's own). */
double cx_timeline_now(void);

#endif /* CFX_TIMELINE_H */
