/*
 * torch_dtype.h - torch's scalar types as the engine's dtypes, for the two native torch modules
 * (torch_native.cpp: conflux.torch's hooks and lone allreduce; torch_c10d.cpp: the c10d backend).
 */
#ifndef CFX_BINDINGS_TORCH_DTYPE_H
#define CFX_BINDINGS_TORCH_DTYPE_H

#include <c10/core/ScalarType.h>

#include "conflux/conflux.h"

/* The cfx_dtype of a torch scalar type, or -1 for one the engine does not have. */
inline int cfx_dtype_of(c10::ScalarType s)
{
    switch (s) {
    case c10::kByte: return CFX_UINT8;
    case c10::kChar: return CFX_INT8;
    case c10::kShort: return CFX_INT16;
    case c10::kInt: return CFX_INT32;
    case c10::kLong: return CFX_INT64;
    case c10::kHalf: return CFX_FLOAT16;
    case c10::kBFloat16: return CFX_BFLOAT16;
    case c10::kFloat: return CFX_FLOAT32;
    case c10::kDouble: return CFX_FLOAT64;
    case c10::kBool: return CFX_BOOL;
    default: return -1;
    }
}

#endif /* CFX_BINDINGS_TORCH_DTYPE_H */
