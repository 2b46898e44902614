package org.conflux;

/** Ranks disagree on a tensor (dtype, shape, op, root, ...); raised on every rank. */
public class MismatchException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public MismatchException(String message) {
        super(Status.MISMATCH, message);
    }
}
