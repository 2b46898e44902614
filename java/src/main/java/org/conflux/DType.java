package org.conflux;

/**
 * Element types of Conflux tensors. Java arrays and typed buffers imply their type ({@code float[]}
 * and {@code FloatBuffer} are {@link #FLOAT32}, ...); a {@code ByteBuffer} says it explicitly.
 */
public enum DType {
    UINT8(cfx_dtype.CFX_UINT8, 1),
    INT8(cfx_dtype.CFX_INT8, 1),
    UINT16(cfx_dtype.CFX_UINT16, 2),
    INT16(cfx_dtype.CFX_INT16, 2),
    INT32(cfx_dtype.CFX_INT32, 4),
    INT64(cfx_dtype.CFX_INT64, 8),
    /** IEEE 754 binary16, held in a ByteBuffer or ShortBuffer. */
    FLOAT16(cfx_dtype.CFX_FLOAT16, 2),
    /** bfloat16, held in a ByteBuffer or ShortBuffer. */
    BFLOAT16(cfx_dtype.CFX_BFLOAT16, 2),
    FLOAT32(cfx_dtype.CFX_FLOAT32, 4),
    FLOAT64(cfx_dtype.CFX_FLOAT64, 8),
    /** One byte per element, 0 or 1. */
    BOOL(cfx_dtype.CFX_BOOL, 1);

    final int code;
    /** Bytes per element. */
    public final int size;

    DType(int code, int size) {
        this.code = code;
        this.size = size;
    }
}
