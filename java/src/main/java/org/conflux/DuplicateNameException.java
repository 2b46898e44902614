package org.conflux;

/** A tensor of that name is already in flight on this rank. */
public class DuplicateNameException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public DuplicateNameException(String message) {
        super(Status.DUPLICATE_NAME, message);
    }
}
