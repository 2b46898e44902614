/*
 * dtype - names, sizes and validity of dtypes, reduction ops and collective kinds.
 */
#ifndef CFX_DTYPE_H
#define CFX_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conflux/conflux.h"

/* The kinds of collective a request or response carries (wire values; never renumber). */
typedef enum cx_coll {
    CX_ALLREDUCE = 0,
    CX_ALLGATHER = 1,
    CX_BROADCAST = 2,
    CX_ALLTOALL = 3,
    CX_REDUCESCATTER = 4,
    CX_BARRIER = 5,
    CX_JOIN = 6
} cx_coll;
#define CX_COLL_COUNT 7

bool cx_dtype_valid(int32_t dtype);
bool cx_op_valid(int32_t op);
bool cx_dtype_is_float(cfx_dtype dtype);
/* "allreduce", ...; "unknown" out of range. */
const char *cx_coll_name(int coll);

#endif /* CFX_DTYPE_H */
