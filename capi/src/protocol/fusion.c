/* fusion - which consecutive responses share one fusion buffer (see fusion.h). */
#include "protocol/fusion.h"

#include "base/dtype.h"

size_t cx_response_bytes(const cx_response *r)
{
    return (size_t)cx_shape_elements(r->ndim, r->shape) * cfx_dtype_size(r->dtype);
}

size_t cx_allgather_bytes(const cx_response *r)
{
    int64_t rows = 0;
    for (uint32_t j = 0; j < r->nrows; j++)
        rows += r->rank_rows[j];
    size_t row = cfx_dtype_size(r->dtype);
    for (int32_t i = 1; i < r->ndim; i++)
        row *= (size_t)r->shape[i];
    return (size_t)rows * row;
}

/* The bytes a response puts through the data plane (allgather: its whole output). */
static size_t batch_bytes(const cx_response *r)
{
    return r->coll == CX_ALLGATHER ? cx_allgather_bytes(r) : cx_response_bytes(r);
}

static int fusible(const cx_response *r, int64_t chunk_bytes)
{
    return r->status == CFX_OK && (r->coll == CX_ALLREDUCE || r->coll == CX_ALLGATHER) &&
           (int64_t)batch_bytes(r) < chunk_bytes;
}

static int compatible(const cx_response *a, const cx_response *b)
{
    if (a->coll != b->coll || !cx_same_device_kind(a->device, b->device))
        return 0;
    if (a->coll == CX_ALLGATHER) /* bytes are only moved: any dtypes share a batch */
        return 1;
    return a->dtype == b->dtype && a->op == b->op && a->prescale == b->prescale &&
           a->postscale == b->postscale && a->compression == b->compression;
}

size_t cx_fusion_batch(const cx_response *items, size_t count, size_t start,
                       int64_t fusion_threshold, int64_t chunk_bytes)
{
    const cx_response *first = &items[start];
    if (!fusible(first, chunk_bytes))
        return 1;
    int64_t total = (int64_t)batch_bytes(first);
    size_t n = 1;
    while (start + n < count) {
        const cx_response *next = &items[start + n];
        int64_t bytes = (int64_t)batch_bytes(next);
        if (!fusible(next, chunk_bytes) || !compatible(first, next) || total + bytes > fusion_threshold)
            break;
        total += bytes;
        n++;
    }
    return n;
}
