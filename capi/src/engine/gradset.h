/*
 * gradset - gradient sets at run time: a set's gradients and buckets, the per-step state that
 * cfx_gradset_ready and cfx_gradset_wait drive, and the background loop's part of the protocol
 * (the set's bits in each cycle's AND-allreduce, running the buckets every rank agreed on,
 * attaching and detaching sets at the same cycle everywhere).
 *
 * api/gradset.c owns what comes before: the public entry points, registration, the collective
 * commit (validation across ranks, the bucket plan, owned storage), and hands a committed set to
 * cx_gradsets_attach.
 *
 * Protocol. The context's registry keeps the sets every rank attached, in commit order, so the
 * cycle's vector has the same layout everywhere: after the loop's own words, each attached set
 * contributes 1 + nbuckets bits: bit 0 "this rank freed the set", bit 1 + b "bucket b is ready
 * here". After the AND, a bucket whose bit survived is ready on every rank and runs in this cycle,
 * in ascending bucket order, consecutive buckets of one dtype as one batch of the host (or device)
 * data path; a set whose bit 0 survived is detached and freed. A committed set waits in the
 * pending list until every rank has one pending (status bit of the loop), then attaches.
 * The per-step work is O(buckets) and allocates nothing: items, entries and the vector are made at
 * commit (or grow once).
 *
 * Step state of a bucket: IDLE (counting its gradients) -> READY (all counted, or flushed by wait:
 * its bit goes out) -> DONE (reduced this step; written by the loop). wait resets DONE -> IDLE.
 * A joined rank agrees to every bucket and contributes the op's identity.
 */
#ifndef CFX_GRADSET_H
#define CFX_GRADSET_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"
#include "base/error.h"
#include "base/log.h"
#include "exec/execute.h"
#include "protocol/queue.h"

enum { CX_BUCKET_IDLE = 0, CX_BUCKET_READY = 1, CX_BUCKET_DONE = 2 };

typedef struct cx_grad {
    char *name;               /* owned */
    int32_t dtype, device, ndim;
    int64_t shape[CFX_MAX_NDIM];
    size_t elements, bytes;
    void *data;               /* borrowed: the caller's buffer; owned: inside its bucket's block */
    int32_t bucket;           /* after commit */
    size_t offset;            /* owned: byte offset in the bucket's block */
    atomic_int passes;        /* ready calls this step */
} cx_grad;

typedef struct cx_bucket {
    int32_t dtype, device;
    size_t elements, bytes;
    void *data;               /* owned: the bucket's contiguous block; borrowed: NULL */
    void *residual;           /* error feedback: this bucket's residuals (elements of its dtype) */
    int32_t ngrads;
    atomic_int pending;       /* gradients not yet ready this step */
    atomic_int state;         /* CX_BUCKET_* */
    size_t first_item, nitems; /* its slice of the set's items and entries */
    double ready_since;       /* when this rank's bit first went out (stall report) */
} cx_bucket;

typedef struct cx_gradsets cx_gradsets;

struct cfx_gradset {
    struct cfx_context *ctx;
    cx_gradsets *registry;
    char *name;
    int32_t op, owned, accumulate_steps;
    double prescale, postscale;
    uint8_t compression;      /* cfx_compression's wire value (kernels/compress.h) */
    int32_t error_feedback;   /* keep rounding residuals (needs compression) */
    void *residual;           /* error feedback: every bucket's residuals, back to back (zeroed) */
    int64_t bucket_bytes;
    /* Registration (this rank's order of cfx_gradset_add). */
    cx_grad *grads;
    int32_t ngrads, cap_grads;
    bool committed;
    /* The plan (identical on every rank) and what the data path reads each step. */
    cx_bucket *buckets;
    int32_t nbuckets;
    cx_response *items;       /* owned storage: one per bucket; borrowed: one per gradient */
    cx_entry *entries;        /* parallel to items (input = output = the gradient's memory) */
    cx_entry **entry_ptrs;    /* &entries[i] */
    cx_entry **no_entries;    /* NULLs: a joined rank's share */
    size_t nitems;
    void *storage;            /* owned: one cfx_alloc block for every bucket */
    char *item_names;         /* owned storage: "<set>.bucket<k>" strings the items point at */
    /* Step. */
    atomic_int buckets_left;  /* not DONE this step */
    atomic_int failed;        /* sticky: the job stopped; status and message below */
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    cfx_status fail_status;
    char fail_message[CX_ERROR_MAX];
    /* Protocol (the loop's). */
    atomic_int released;      /* cfx_gradset_free was called: the loop frees it once detached */
    bool attached;
    struct cfx_gradset *next_pending;
};

/* The context's registry of gradient sets (owned by the context; the loop drives it). */
struct cx_gradsets {
    pthread_mutex_t mu;
    cfx_gradset *pending_head, *pending_tail; /* committed, not yet attached (commit order) */
    cfx_gradset **attached;   /* the loop's, in attach order */
    size_t nattached, cap_attached;
    bool closed;              /* the loop stopped: sets fail with close_status */
    cfx_status close_status;
    char close_reason[CX_ERROR_MAX];
    cx_queue *queue;          /* to wake the background thread */
    const cx_logger *log;
    int size;                 /* ranks: AVERAGE divides by it */
};

cfx_status cx_gradsets_init(cx_gradsets *g, cx_queue *queue, const cx_logger *log, int size);
/* Frees the sets the registry holds that were released; the others are orphaned (ctx and
 * registry NULL: their calls fail with CFX_ERR_SHUT_DOWN, cfx_gradset_free frees them). */
void cx_gradsets_destroy(cx_gradsets *g);

/* Hands a committed set to the loop (attached at the cycle every rank has one pending). Fails with
 * the registry's close status once the loop stopped. */
cfx_status cx_gradsets_attach(cx_gradsets *g, cfx_gradset *set);

/* cfx_gradset_free's engine side: an attached or pending set is released to the loop (freed when
 * every rank released it, or with the registry); any other set is freed at once. */
void cx_gradsets_release(cx_gradsets *g, cfx_gradset *set);

/* Frees a set's memory (its owned storage too). */
void cx_gradset_destroy(cfx_gradset *set);

/* ---- step (caller threads) ------------------------------------------------------------------ */
cfx_status cx_gradset_ready(cfx_gradset *set, int32_t index);
/* The step's end: every bucket not yet marked goes out as it is (unused gradients). */
void cx_gradset_mark_unused(cfx_gradset *set);
/* Every bucket of this step was reduced, or the job failed (arg: the cfx_gradset). */
bool cx_gradset_step_over(void *set);
/* Waits for the step's buckets (marked already: cx_gradset_mark_unused) and ends the step. */
cfx_status cx_gradset_wait(cfx_gradset *set, double timeout_s);
/* After commit: every bucket IDLE with its full count. */
void cx_gradset_reset_step(cfx_gradset *set);

/* ---- the loop's part (background thread) ---------------------------------------------------- */
/* Words of the cycle's vector the attached sets use. */
size_t cx_gradsets_words(const cx_gradsets *g);
/* Writes the attached sets' bits into words[0 .. cx_gradsets_words); returns whether this rank
 * has a set waiting to attach. joined: agree to every bucket. */
bool cx_gradsets_fill(cx_gradsets *g, uint64_t *words, bool joined, double now);
/* After the AND: detaches sets every rank released, runs the agreed buckets on x (when
 * run_buckets: some rank had one ready), then attaches the first pending set when attach_all.
 * *progress when anything ran or changed. A data-path failure is returned (the loop then stops
 * and fails everything). */
cfx_status cx_gradsets_after(cx_gradsets *g, const uint64_t *words, bool run_buckets,
                             bool attach_all, cx_exec *x, bool *progress);
/* Whether a bucket of this rank is READY (the loop keeps cycling promptly) or a set is pending. */
bool cx_gradsets_busy(cx_gradsets *g);
/* The loop stopped: every set (and every later call) fails with status and reason. */
void cx_gradsets_fail(cx_gradsets *g, cfx_status status, const char *reason);

#endif /* CFX_GRADSET_H */
