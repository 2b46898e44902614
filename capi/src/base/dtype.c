/* dtype - names, sizes and validity of dtypes, reduction ops and collective kinds (see dtype.h). */
#include "base/dtype.h"

static const char *const dtype_names[CFX_DTYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64", "bool"};
static const size_t dtype_sizes[CFX_DTYPE_COUNT] = {1, 1, 2, 2, 4, 8, 2, 2, 4, 8, 1};
static const char *const op_names[CFX_OP_COUNT] = {"sum", "average", "min", "max", "product",
                                                     "adasum"};
static const char *const coll_names[CX_COLL_COUNT] = {
    "allreduce", "allgather", "broadcast", "alltoall", "reducescatter", "barrier", "join"};

bool cx_dtype_valid(int32_t dtype) { return dtype >= 0 && dtype < CFX_DTYPE_COUNT; }
bool cx_op_valid(int32_t op) { return op >= 0 && op < CFX_OP_COUNT; }

bool cx_dtype_is_float(cfx_dtype dtype)
{
    return dtype == CFX_FLOAT16 || dtype == CFX_BFLOAT16 || dtype == CFX_FLOAT32 ||
           dtype == CFX_FLOAT64;
}

const char *cfx_dtype_name(cfx_dtype dtype)
{
    return cx_dtype_valid((int32_t)dtype) ? dtype_names[dtype] : "unknown";
}

size_t cfx_dtype_size(cfx_dtype dtype)
{
    return cx_dtype_valid((int32_t)dtype) ? dtype_sizes[dtype] : 0;
}

const char *cfx_op_name(cfx_reduce_op op)
{
    return cx_op_valid((int32_t)op) ? op_names[op] : "unknown";
}

const char *cx_coll_name(int coll)
{
    return (coll >= 0 && coll < CX_COLL_COUNT) ? coll_names[coll] : "unknown";
}
