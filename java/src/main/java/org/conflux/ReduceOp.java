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
    PRODUCT(cfx_reduce_op.CFX_OP_PRODUCT);

    final int code;

    ReduceOp(int code) {
        this.code = code;
    }
}
