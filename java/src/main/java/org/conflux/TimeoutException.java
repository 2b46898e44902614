package org.conflux;

/** A wait's deadline passed (the collective is still pending). */
public class TimeoutException extends ConfluxException {
    private static final long serialVersionUID = 1L;

    public TimeoutException(String message) {
        super(Status.TIMEOUT, message);
    }
}
