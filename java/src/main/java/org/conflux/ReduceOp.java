package org.conflux;

/** How {@link Conflux#allreduce} and {@link Conflux#reducescatter} combine the ranks' values. */
public enum ReduceOp {
    /** Sum over ranks. */
    SUM(cfx_reduce_op.CFX_OP_SUM),
    /** Sum over ranks divided by the number of ranks. */
    AVERAGE(cfx_reduce_op.CFX_OP_AVERAGE),
    /** Element-wise minimum. */
    MIN(cfx_reduce_op.CFX_OP_MIN),
    /** Element-wise maximum. */
    MAX(cfx_reduce_op.CFX_OP_MAX),
    /** Element-wise product. */
    PRODUCT(cfx_reduce_op.CFX_OP_PRODUCT),
    /**
     * Adaptive summation (Adasum): pairs combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b,
     * per tensor, with dot products in float64; float16, bfloat16, float32 and float64 allreduces
     * only (docs/c-api.md). Orthogonal contributions give their sum, identical ones themselves.
     */
    ADASUM(cfx_reduce_op.CFX_OP_ADASUM);

    final int code;

    ReduceOp(int code) {
        this.code = code;
    }
}
