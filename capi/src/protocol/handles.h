/*
 * handles - the table behind cfx_handle values: completion state, status, message and the outputs
 * Conflux allocated for a collective.
 *
 * A handle is (generation << 32 | slot index + 1): a released slot bumps its generation, so a stale
 * or twice-released handle is recognised and refused instead of touching freed memory. A handle
 * covers `parts` tensors (a grouped call); it completes when the last part does, with the first
 * error any part reported. Thread-safe: callers on any thread, completion from the background
 * thread; waiters sleep on one condition variable.
 */
#ifndef CFX_HANDLES_H
#define CFX_HANDLES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

typedef struct cx_output {
    void *data;          /* malloc'ed by the engine */
    size_t bytes;
    int32_t dtype, ndim;
    int64_t shape[CFX_MAX_NDIM];
    int64_t *splits;     /* size entries, or NULL */
} cx_output;

typedef struct cx_slot {
    uint32_t generation;
    int in_use;
    int detached;        /* released while pending: free on completion */
    atomic_int done;
    cfx_status status;
    char *message;
    size_t parts_left;
    size_t noutputs;
    cx_output *outputs;  /* noutputs entries (parts of a grouped call) or NULL */
    int join_rank;
} cx_slot;

typedef struct cx_handles {
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    cx_slot **slots;
    size_t count, capacity;
    uint32_t *free_list;
    size_t nfree;
} cx_handles;

cfx_status cx_handles_init(cx_handles *h);
void cx_handles_destroy(cx_handles *h);

/* A new pending handle of `parts` tensors, with room for `noutputs` outputs. */
cfx_status cx_handles_create(cx_handles *h, size_t parts, size_t noutputs, cfx_handle *out);
/* Undo a create whose enqueue failed. */
void cx_handles_discard(cx_handles *h, cfx_handle handle);

/* Stores output `index` (ownership of data/splits moves to the handle). */
void cx_handles_set_output(cx_handles *h, cfx_handle handle, size_t index, const cx_output *out);
void cx_handles_set_join_rank(cx_handles *h, cfx_handle handle, int rank);
/* One part finished with `status` (message may be NULL). The last part completes the handle. */
void cx_handles_complete_part(cx_handles *h, cfx_handle handle, cfx_status status,
                              const char *message);

/* The ABI operations (see conflux.h). */
cfx_status cx_handles_poll(cx_handles *h, cfx_handle handle, int *out);
cfx_status cx_handles_wait(cx_handles *h, cfx_handle handle, double timeout_s);
cfx_status cx_handles_status(cx_handles *h, cfx_handle handle);
const char *cx_handles_message(cx_handles *h, cfx_handle handle);
cfx_status cx_handles_release(cx_handles *h, cfx_handle handle);
cfx_status cx_handles_output_count(cx_handles *h, cfx_handle handle, size_t *out);
cfx_status cx_handles_output(cx_handles *h, cfx_handle handle, size_t index, cfx_tensor *out);
cfx_status cx_handles_output_copy(cx_handles *h, cfx_handle handle, size_t index, void *dst,
                                  size_t dst_bytes);
cfx_status cx_handles_splits(cx_handles *h, cfx_handle handle, size_t index, const int64_t **out);
cfx_status cx_handles_join_rank(cx_handles *h, cfx_handle handle, int *out);

#endif /* CFX_HANDLES_H */
