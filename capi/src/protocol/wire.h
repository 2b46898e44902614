/*
 * wire - requests and responses of the coordinator protocol, and their byte codec.
 *
 * A request is one rank's description of one tensor it submitted; a response is the coordinator's
 * decision for one tensor (run it with these parameters, or fail it with this message). Lists of
 * them travel as little-endian byte strings over the transport's control plane. Decoding checks
 * every length against the bytes that are there before it reads or allocates, and every field
 * against what a rank could have sent (known enums, shapes whose size fits, finite scales), so a
 * corrupt message is a CFX_ERR_TRANSPORT naming the peer and the first thing wrong, never a crash
 * (tests/fuzz feeds the decoders arbitrary bytes under ASan and UBSan).
 *
 * The handshake (protocol/handshake.c) exchanges one hello record per rank before anything else;
 * its layout is frozen, so that ranks of any two versions can tell each other apart.
 */
#ifndef CFX_WIRE_H
#define CFX_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

/* The wire protocol: every byte ranks exchange (these lists, the handshake, the agreed settings,
 * the cycle's bit vector, the shared-memory segment). A minor version is a change an older peer
 * still talks to (ranks with the same major go on, with a log line); any other change bumps the
 * major, and ranks whose majors differ refuse to start (CFX_ERR_VERSION). */
#define CX_WIRE_VERSION_MAJOR 2 /* 2: compression ends each request and response */
#define CX_WIRE_VERSION_MINOR 0

typedef struct cx_request {
    char *name;  /* owned */
    char *group; /* owned; NULL when not part of a grouped call */
    uint32_t group_size;
    uint8_t coll, dtype, op; /* cx_coll, cfx_dtype, cfx_reduce_op */
    int32_t device;
    int32_t root;
    int32_t ndim;
    int64_t shape[CFX_MAX_NDIM];
    double prescale, postscale;
    uint8_t compression; /* allreduce: cfx_compression (kernels/compress.h); last on the wire */
} cx_request;

enum { CX_LIST_SHUTDOWN = 1, CX_LIST_JOINED = 2, CX_LIST_TUNED = 4 };

typedef struct cx_request_list {
    int32_t rank;
    uint32_t flags; /* CX_LIST_* */
    size_t count;
    cx_request *items;
} cx_request_list;

typedef struct cx_response {
    char *name;  /* owned */
    char *group; /* owned or NULL */
    uint32_t group_size;
    uint8_t coll, dtype, op;
    int32_t device, root, ndim;
    int64_t shape[CFX_MAX_NDIM]; /* the agreed shape (allgather: rank 0's) */
    double prescale, postscale;
    int32_t status;       /* CFX_OK, or the error every rank completes the tensor with */
    char *message;        /* owned; the error text, NULL when ok */
    uint32_t nrows;       /* allgather: entries of rank_rows (= size) */
    int64_t *rank_rows;   /* owned; allgather: each rank's dim-0 extent */
    int32_t last_joined;  /* join: the rank that joined last */
    uint8_t compression;  /* the agreed cfx_compression (kernels/compress.h); last on the wire */
} cx_response;

typedef struct cx_response_list {
    uint32_t flags; /* CX_LIST_SHUTDOWN, CX_LIST_TUNED */
    size_t count;
    cx_response *items;
    /* CX_LIST_TUNED (autotune.h): the parameters every rank switches to; encoded after the items. */
    int64_t tuned_fusion_threshold, tuned_chunk_bytes;
    double tuned_cycle_time_ms;
} cx_response_list;

/* A growable byte buffer. */
typedef struct cx_bytes {
    uint8_t *data;
    size_t len, cap;
    bool failed; /* an allocation failed; the content is incomplete */
} cx_bytes;

void cx_bytes_free(cx_bytes *b);

void cx_request_free(cx_request *r);
void cx_response_free(cx_response *r);
void cx_request_list_free(cx_request_list *l);
void cx_response_list_free(cx_response_list *l);

/* Deep copies; false when out of memory. */
bool cx_request_copy(cx_request *dst, const cx_request *src);
bool cx_response_copy(cx_response *dst, const cx_response *src);

/* Appends to `out`; returns CFX_ERR_OUT_OF_MEMORY on failure. */
cfx_status cx_encode_requests(const cx_request_list *l, cx_bytes *out);
cfx_status cx_encode_responses(const cx_response_list *l, cx_bytes *out);

/* Decodes a whole byte string into *out (freed with the _free functions, also on failure).
 * CFX_ERR_TRANSPORT when the bytes are malformed, with a message naming the sender (requests: the
 * rank its header gives; responses: the coordinator) and what was wrong. */
cfx_status cx_decode_requests(const void *data, size_t len, cx_request_list *out);
cfx_status cx_decode_responses(const void *data, size_t len, cx_response_list *out);

/* What one rank tells the others at init: library version, wire protocol, build features. */
typedef struct cx_hello {
    uint16_t lib_major, lib_minor, lib_patch;
    uint16_t wire_major, wire_minor;
    uint32_t features; /* CFX_FEATURE_* bits of the build (not the run-time device bit) */
    /* Decoding only: */
    bool readable;  /* false: the record is no handshake this library reads (fields zero) */
    uint32_t bytes; /* the record's length */
} cx_hello;

/* The record (frozen: magic, the five versions, features; later versions may only append). */
cfx_status cx_encode_hello(const cx_hello *h, cx_bytes *out);
/* The table rank 0 broadcasts: `count` records, record i being lens[i] bytes of `records`
 * (concatenated, as gather_bytes delivers them). */
cfx_status cx_encode_hello_table(const void *records, const size_t *lens, int count, cx_bytes *out);
/* Decodes the table into out[0..count). A record nobody could read is not a failure of the
 * table (out[i].readable = false); a table that does not parse is CFX_ERR_TRANSPORT. */
cfx_status cx_decode_hello_table(const void *data, size_t len, int count, cx_hello *out);

/* Whether two device fields name the same kind of memory (CPU, or CUDA). Ranks must agree on the
 * kind; the CUDA ordinal itself is local to each rank (docs/gpu.md), so it is never compared. */
static inline bool cx_same_device_kind(int32_t a, int32_t b)
{
    return (a == CFX_DEVICE_CPU) == (b == CFX_DEVICE_CPU);
}

/* Elements of a shape (product of extents; 1 for a scalar). */
int64_t cx_shape_elements(int32_t ndim, const int64_t *shape);
/* "[2, 3, 4]" into buf. */
const char *cx_shape_format(int32_t ndim, const int64_t *shape, char *buf, size_t size);

#endif /* CFX_WIRE_H */
